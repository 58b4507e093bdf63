"""The device kit and its CPU rehearsal: the kit holds exactly what the GPU machine's image lacks and
fits what a job may carry; installed into a venv that sees only the image's packages, it starts the
pinned server and runs the tiny matrix through the same script the GPU runs, and hands back the files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks import device_kit
from benchmarks.device_image import ImageError, make_image_venv, read_device_image
from benchmarks.device_kit import DEFAULT_MAX_MIB, KitError, Target, download_wheels, install_kit
from runner.install.pin import load_pin, sha256_file
from runner.local.workspace import REPO_ROOT, Workspace
from tests.scratch import scratch_dir

RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"
DEVICE_COMMAND_LIMIT = 2000  # characters of one device call
REHEARSED_VARIANTS = (
    "20-step-baseline",
    "8-step-distill",
    "8-step-graph-compile",
    "8-step-attention-acceleration",
)


def build(out: Path, python: str) -> tuple[dict[str, Any], str]:
    """Build a kit with the CLI, as a user does; returns its manifest and what the CLI printed."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_kit", "build", "--out", str(out), "--python", python],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "kit.json").read_text(encoding="utf-8")), done.stdout


@pytest.fixture(scope="module")
def gpu_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any], str]]:
    """The kit for the GPU machine (CPython 3.12), built from the package index."""
    with scratch_dir(tmp_path_factory, "gpu-kit") as root:
        out = root / "device-kit"
        manifest, printed = build(out, "3.12")
        yield out, manifest, printed


@pytest.fixture(scope="module")
def local_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A kit for this machine's Python, for the rehearsal."""
    with scratch_dir(tmp_path_factory, "local-kit") as root:
        out = root / "device-kit"
        build(out, RUNNING)
        yield out


@pytest.mark.integration
def test_the_gpu_kit_fits_and_holds_exactly_what_the_image_lacks(
    gpu_kit: tuple[Path, dict[str, Any], str],
) -> None:
    kit, manifest, printed = gpu_kit
    size_line = re.search(r"kit .*: ([\d.]+) MiB of 55 MiB, Python 3\.12", printed)
    assert size_line, printed
    print(size_line.group(0))
    assert float(size_line.group(1)) * 2**20 == pytest.approx(manifest["size"], rel=0.01)
    assert manifest["size"] < DEFAULT_MAX_MIB * 2**20
    image = read_device_image()
    names = [w["name"] for w in manifest["wheels"]]
    assert len(names) == len(set(names)), "one version per distribution"
    assert not set(names) & set(image), "nothing the image already holds"
    # what the pinned ComfyUI and the runner import at start and the image lacks
    assert {"av", "sqlalchemy", "alembic", "torchsde", "pydantic-settings", "websocket-client"} <= set(names)
    assert "sageattention" in names  # the attention variant on the GPU
    assert not {"comfyui-frontend-package", "kornia"} & set(names)
    assert set(manifest["left_out"]) >= {"comfyui-frontend-package", "kornia"}
    for wheel in manifest["wheels"]:
        tags = wheel["file"][: -len(".whl")].split("-")[-3:]
        assert tags[1] in ("cp312", "abi3", "none"), wheel["file"]
        assert tags[2] == "any" or "manylinux" in tags[2], wheel["file"]
        assert sha256_file(kit / "wheels" / wheel["file"]) == wheel["sha256"]
    assert sorted(p.name for p in (kit / "wheels").iterdir()) == sorted(w["file"] for w in manifest["wheels"])
    pin = load_pin()
    assert manifest["comfyui"]["commit"] == pin["commit"]
    assert manifest["comfyui"]["tree_digest"] == pin["tree_digest"]
    assert sha256_file(kit / "comfyui.tar.gz") == manifest["comfyui"]["sha256"]


@pytest.mark.integration
def test_a_second_build_refuses_to_overwrite_a_kit(gpu_kit: tuple[Path, dict[str, Any], str]) -> None:
    kit = gpu_kit[0]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_kit", "build", "--out", str(kit)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "already holds a kit" in done.stderr


@pytest.mark.integration
@pytest.mark.skipif(RUNNING == "3.12", reason="this Python is the kit's own")
def test_install_refuses_a_kit_for_another_python(
    gpu_kit: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    with pytest.raises(KitError, match=rf"for Python 3\.12, this is {RUNNING}"):
        install_kit(gpu_kit[0], tmp_path / "into")


@pytest.mark.integration
def test_install_names_a_tampered_file_and_installs_nothing(local_kit: Path, tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    shutil.copytree(local_kit, kit)
    manifest = json.loads((kit / "kit.json").read_text(encoding="utf-8"))
    victim = kit / "wheels" / manifest["wheels"][0]["file"]
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(KitError, match=re.escape(f"{victim} does not match its sha256")):
        install_kit(kit, tmp_path / "into")
    assert not (tmp_path / "into").exists()
    victim.unlink()
    with pytest.raises(KitError, match="is missing: the kit is incomplete"):
        install_kit(kit, tmp_path / "into")


@pytest.mark.integration
def test_one_pip_run_fetches_a_level_and_a_missing_wheel_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A level of the resolution is one ``pip download``; when it fails, each requirement is fetched
    alone so that the error names the one the index lacks."""
    runs: list[list[str]] = []
    real_run = subprocess.run

    def counted(command: list[str], **kwargs: Any) -> Any:
        runs.append(command)
        return real_run(command, **kwargs)

    monkeypatch.setattr(device_kit.subprocess, "run", counted)
    target = Target("3.12")
    got = download_wheels([Requirement("packaging"), Requirement("PyYAML>=6")], target, tmp_path / "a")
    assert sorted(got) == ["packaging", "pyyaml"] and len(runs) == 1
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(w.file for w in got.values())
    assert all(sha256_file(tmp_path / "a" / w.file) == w.sha256 for w in got.values())
    assert got["pyyaml"].version.startswith("6.") and "cp312" in got["pyyaml"].file
    missing = [Requirement("packaging"), Requirement("leanvideo-no-such-distribution")]
    with pytest.raises(KitError, match=r"^no wheel of leanvideo-no-such-distribution for CPython 3\.12"):
        download_wheels(missing, target, tmp_path / "b")
    assert len(runs) == 4  # the level, then each alone


def test_the_image_list_names_a_bad_line(tmp_path: Path) -> None:
    listing = tmp_path / "image.txt"
    listing.write_text("# comment\ntorch==2.11.0\nNumPy\nscipy>=1\n", encoding="utf-8")
    with pytest.raises(ImageError, match=rf"{re.escape(str(listing))}:4: expected NAME or NAME==VERSION"):
        read_device_image(listing)
    listing.write_text("torch==2.11.0\nNumPy  # any version\n", encoding="utf-8")
    assert read_device_image(listing) == {"torch": "2.11.0", "numpy": ""}


@pytest.mark.integration
def test_rehearsal_runs_the_tiny_matrix_from_the_kit_in_an_image_only_venv(
    local_kit: Path, kernel_kit: Path, workspace: Workspace, tmp_path: Path
) -> None:
    """The GPU command's path on CPU: image-only venv + kit, pinned server from the kit, tiny matrix;
    comfy-kitchen comes from the kernel kit that an earlier call installed on the machine."""
    python = make_image_venv(tmp_path / "image-venv", workspace.comfyui_dir)
    kernels_site = tmp_path / "kernels-site"  # as benchmarks/gpu_kernel_table.sh leaves it
    subprocess.run(
        [str(python), "-m", "benchmarks.kernel_kit", "install", str(kernel_kit), "--into", str(kernels_site)],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
        timeout=300,
    )
    listing = "import importlib.metadata as m, json; print(json.dumps([d.name for d in m.distributions()]))"
    visible = subprocess.run(
        [str(python), "-c", listing], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    seen = {canonicalize_name(name) for name in json.loads(visible.stdout)}
    assert "torch" in seen and not {"av", "sqlalchemy", "websocket-client", "leanvideo"} & seen
    handback = tmp_path / "handback"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LEANVIDEO_COMFYUI")},
        "PYTHON": str(python),
        "OUT": str(handback),
        "TMPDIR": str(tmp_path),
        "REPEATS": "1",
        "WARMUPS": "0",
        "BUDGET_S": "400",
        "KERNELS_SITE": str(kernels_site),
        # the variants that need no second server (the non-blocking one runs in tests/test_bench_e2e.py),
        # through BENCH_ARGS, as the README's narrower device calls pass them
        "BENCH_ARGS": " ".join(f"--variant {v}" for v in REHEARSED_VARIANTS),
    }
    done = subprocess.run(
        ["bash", "benchmarks/gpu_seed_table.sh", "--kit", str(local_kit), "--cpu", str(tmp_path / "results")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "the server runs headless" in output
    assert f"the kernel kit an earlier call installed in {kernels_site}" in output
    # imported by leanvideo's own import_kitchen, in the environment the bench servers inherit
    assert re.search(r"^comfy-kitchen \d+\.\d+", output, flags=re.M), output[-4000:]
    assert "pytest exited 0" in output  # the GPU tests' command works from the kit (skipped on a CPU)
    files = sorted(p.name for p in handback.iterdir())
    assert {"summary.json", "report.md", "log.txt", "tiny.csv"} <= set(files) and len(files) <= 8
    summary = json.loads((handback / "summary.json").read_text(encoding="utf-8"))
    tiny = summary["families"]["tiny"]
    assert tiny["status"] == "done"
    assert tiny["environment"]["comfyui_commit"] == load_pin()["commit"]
    ran = {v["name"]: v for v in tiny["variants"]}
    assert ran["20-step baseline"]["run_totals_s"] and ran["8-step distill"]["speedup"]["ratio"] > 0
    assert "skipped" in ran["8-step + graph compile"]  # on CPU, as the matrix says
    assert "| 8-step distill |" in (handback / "report.md").read_text(encoding="utf-8")
    assert len(ran) == len(REHEARSED_VARIANTS) and "--async-offload" not in output


def test_the_readme_gives_the_device_command_within_one_call() -> None:
    """README "Proof on a GPU": the command the GPU machine runs fits one device call."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Proof on a GPU", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    device = [b for b in blocks if "--kit device-kit" in b]
    assert device, "no device command in the section"
    assert len(device[0].strip()) <= DEVICE_COMMAND_LIMIT
    assert any("benchmarks.device_kit build" in b for b in blocks)
    kernels = [b for b in blocks if "gpu_kernel_table.sh --kernels device-kernels" in b]
    assert kernels and len(kernels[0].strip()) <= DEVICE_COMMAND_LIMIT
    assert any("benchmarks.kernel_kit build --out device-kernels" in b for b in blocks)
    assert "device-kit" in section and "$OUT" in section


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without CUDA")
def test_the_proof_without_cuda_stops_at_once_and_a_bad_family_before_anything(tmp_path: Path) -> None:
    """A GPU script run where there is no GPU (or a typo in FAMILIES) must say so and fail in seconds,
    not spend the device budget on tracebacks and exit 0."""
    env = {**os.environ, "OUT": str(tmp_path / "handback"), "TESTS": "0", "TMPDIR": str(tmp_path)}
    script = ["bash", "benchmarks/gpu_seed_table.sh", str(tmp_path / "results")]
    done = subprocess.run(
        script, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no CUDA device here (torch.cuda.is_available() is False): --cpu runs" in done.stdout
    assert (tmp_path / "handback" / "log.txt").is_file()  # the hand-back still happens
    typo = subprocess.run(
        script,
        cwd=REPO_ROOT,
        env={**env, "FAMILIES": "ltxv-13b nosuch"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert typo.returncode == 2 and "unknown family nosuch in FAMILIES" in typo.stderr
