"""The kernel kit: comfy-kitchen carried to the GPU machine as its wheel's files in one xz archive.

Built from the package index for this machine's Python (xz level 0 here, to be quick), it installs the
very files pip installs from the wheel, imports from its own site and runs the ``kitchen`` kernel; a
tampered archive, RECORD or file is named and installs nothing; and the device call's script runs its
table from the kit (the CPU rehearsal of ``benchmarks/gpu_kernel_table.sh``)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from benchmarks.device_kit import KitError, Target
from benchmarks.kernel_kit import DEFAULT_MAX_MIB, MANIFEST, build_kernel_kit, install_kernel_kit
from benchmarks.kernel_kit import _repack as repack
from runner.install.pin import list_files, sha256_file
from runner.local.workspace import REPO_ROOT

RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"
PIP_TARGET = ["-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--disable-pip-version-check"]
pytestmark = pytest.mark.integration  # builds from the package index


@pytest.fixture
def kit(kernel_kit: Path) -> tuple[Path, dict[str, Any]]:
    """The session's kernel kit (tests/conftest.py) and its manifest."""
    return kernel_kit, json.loads((kernel_kit / MANIFEST).read_text(encoding="utf-8"))


def test_the_kit_fits_a_call_and_installs_what_pip_installs_from_the_wheel(
    kit: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    folder, manifest = kit
    package = manifest["package"]
    assert package["name"] == "comfy-kitchen" and manifest["size"] < DEFAULT_MAX_MIB * 2**20
    assert manifest["size"] < package["wheel_size"]  # why the kit exists: the wheel does not fit
    assert sorted(p.name for p in folder.iterdir()) == sorted([MANIFEST, manifest["archive"]["file"]])
    env = install_kernel_kit(folder, tmp_path / "installed")
    site = tmp_path / "installed" / "site"
    assert env["PYTHONPATH"].split(":")[0] == str(site)
    # the same wheel, installed by pip straight from the index: the files must be the same bytes
    reference = tmp_path / "reference"
    subprocess.run(
        [sys.executable, *PIP_TARGET, "--target", str(reference), f"comfy-kitchen=={package['version']}"],
        check=True,
        timeout=600,
    )
    ours = _digests(site / "comfy_kitchen")
    assert ours and ours == _digests(reference / "comfy_kitchen")


def test_the_installed_kit_imports_from_its_site_and_runs_the_kitchen_kernel(
    kit: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    env = install_kernel_kit(kit[0], tmp_path / "installed")
    script = (
        "import comfy_kitchen, torch\n"
        "from leanvideo.int8 import Int8WeightConfig, quantize_weight, sqnr_db\n"
        "from leanvideo.int8.linear import run_kernel\n"
        "g = torch.Generator().manual_seed(0)\n"
        "w, x = torch.randn(256, 512, generator=g) * 0.02, torch.randn(64, 512, generator=g)\n"
        "for convrot in (False, True):\n"
        "    packed = quantize_weight(w, Int8WeightConfig(convrot=convrot))\n"
        "    out = run_kernel('kitchen', x.bfloat16(), packed, kitchen=comfy_kitchen)\n"
        "    print(sqnr_db(torch.nn.functional.linear(x, w), out.float()))\n"
        "print(comfy_kitchen.__file__)\n"
    )
    pythonpath = env["PYTHONPATH"] + os.pathsep + os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": pythonpath},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *quality, origin = done.stdout.split()
    assert origin.startswith(str(tmp_path / "installed" / "site"))
    assert len(quality) == 2 and all(float(db) >= 35.0 for db in quality)


def test_a_tampered_kit_is_named_and_installs_nothing(
    kit: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    folder, manifest = kit
    archive = manifest["archive"]["file"]

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(folder, target)
        return target

    flipped = copy("flipped")
    data = bytearray((flipped / archive).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (flipped / archive).write_bytes(bytes(data))
    with pytest.raises(KitError, match=f"{archive} does not match its sha256"):
        install_kernel_kit(flipped, tmp_path / "site-a")
    assert not (tmp_path / "site-a").exists()

    other_record = copy("record")
    changed = {**manifest, "package": {**manifest["package"], "record_sha256": "0" * 64}}
    (other_record / MANIFEST).write_text(json.dumps(changed), encoding="utf-8")
    with pytest.raises(KitError, match=r"RECORD in .* does not match its sha256"):
        install_kernel_kit(other_record, tmp_path / "site-b")
    assert not (tmp_path / "site-b" / "site").exists()

    other_python = copy("python")
    (other_python / MANIFEST).write_text(
        json.dumps({**manifest, "target": {**manifest["target"], "python": "3.99"}}), encoding="utf-8"
    )
    with pytest.raises(KitError, match=r"for Python 3\.99"):
        install_kernel_kit(other_python, tmp_path / "site-c")

    keep = tmp_path / "someone-elses"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(KitError, match="not a kernel kit's install"):
        install_kernel_kit(folder, keep)
    assert (keep / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_a_wheel_whose_file_differs_from_its_record_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    good, shipped = b"print('hello')\n", b"print('changed')\n"
    digest = hashlib.sha256(good).digest()
    encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    record = f"demo/__init__.py,sha256={encoded},{len(good)}\ndemo-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zipped:
        zipped.writestr("demo/__init__.py", shipped)
        zipped.writestr("demo-1.0.dist-info/RECORD", record)
    with pytest.raises(KitError, match=r"demo/__init__\.py in demo-1\.0-py3-none-any\.whl does not match"):
        repack(wheel, tmp_path / "out.tar.xz", 0)
    with zipfile.ZipFile(wheel, "w") as zipped:
        zipped.writestr("demo/__init__.py", good)
        zipped.writestr("demo/extra.py", b"")
        zipped.writestr("demo-1.0.dist-info/RECORD", record)
    with pytest.raises(KitError, match="its files and its RECORD differ"):
        repack(wheel, tmp_path / "out.tar.xz", 0)


def test_build_refuses_to_overwrite_a_kit(kit: tuple[Path, dict[str, Any]]) -> None:
    with pytest.raises(KitError, match="already holds a kernel kit"):
        build_kernel_kit(kit[0], Target(RUNNING))


def test_the_device_call_runs_its_table_from_the_kit_on_cpu(
    kit: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``gpu_kernel_table.sh --cpu``: kit installed into SITE, the tables run from it (with FUSED_MODE's
    too), files handed back (8 at most, what a device call returns). 16 rows: AVX2 CPUs run ``torch._int_mm``
    in a scalar loop, and the kernels' numerics hold at any row count."""
    handback, site = tmp_path / "handback", tmp_path / "site"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "FUSED_MODE": "max-autotune-no-cudagraphs",
        "FUSED_MODELS": "ltxv-mid",
        "TOKENS": "16",  # the script's path, not its timings: 16 rows, not the CPU default 64 (~30 s less)
        "PYTHON": sys.executable,
        "OUT": str(handback),
        "SITE": str(site),
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        ["bash", "benchmarks/gpu_kernel_table.sh", "--kernels", str(kit[0]), "--cpu", str(tmp_path / "r")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert f"comfy-kitchen {kit[1]['package']['version']} from {site}" in output
    files = sorted(p.name for p in handback.iterdir())
    assert {"int8_linear.json", "int8_linear.txt", "int8_kernels.json", "log.txt"} <= set(files)
    assert "int8_kernels_convrot.json" in files and len(files) <= 8
    fused_mode = (handback / "int8_linear_fused_mode.txt").read_text(encoding="utf-8")
    assert "int_mm_fused compiled in torch.compile mode max-autotune-no-cudagraphs" in fused_mode
    assert "int8_kernels_fused_mode.json" in files
    record = json.loads((handback / "int8_linear.json").read_text(encoding="utf-8"))
    assert record["environment"]["comfy_kitchen"] == kit[1]["package"]["version"]
    kitchen = [row for row in record["linear"]["ltxv-mid"] if row["kernel"] == "kitchen"]
    assert len(kitchen) == 3 and all(row["sqnr_db"] >= 35.0 for row in kitchen)
    assert (site / MANIFEST).is_file()  # where gpu_seed_table.sh, run next, finds it


def _digests(root: Path) -> dict[str, str]:
    return {rel: sha256_file(root / rel) for rel in list_files(root) if "__pycache__" not in rel.split("/")}
