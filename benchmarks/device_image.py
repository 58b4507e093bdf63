"""What the GPU machine's Python already holds, and a stand-in for it here.

``device_image.txt`` lists the distributions of the GPU machine's image. :func:`read_device_image` reads
it (the kit carries everything else); :func:`make_image_venv` builds, for the CPU rehearsal, a venv
that sees only those of them installed in the running interpreter (torch among them): each one's
top-level modules and ``.dist-info`` are linked into a folder the venv's ``.pth`` names, and nothing
else of this environment is visible. A requirement the kit forgot then fails here, not on the GPU.

Example::

    python -m benchmarks.device_image /tmp/image-venv --comfyui .workspace/ComfyUI
    /tmp/image-venv/bin/python -c "import torch"
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import venv
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DEVICE_IMAGE = Path(__file__).with_name("device_image.txt")
REPO_ROOT = Path(__file__).resolve().parents[1]


class ImageError(RuntimeError):
    """The image list is malformed or the stand-in venv cannot be made; the message says where."""


def read_device_image(path: Path = DEVICE_IMAGE) -> dict[str, str]:
    """``{canonical name: version or ""}`` of the packages the GPU machine's image holds."""
    image: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        if not name.strip() or any(c in name for c in "<>=!~ "):
            raise ImageError(f"{path}:{number}: expected NAME or NAME==VERSION, got {raw!r}")
        image[canonicalize_name(name)] = version.strip()
    return image


def root_requirements(comfyui_dir: Path) -> list[tuple[Requirement, str]]:
    """ComfyUI's requirements.txt and LeanVideo's own (the node pack's, with SageAttention for the
    GPU), each with its origin."""
    found: list[tuple[Requirement, str]] = []
    for line in (comfyui_dir / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            found.append((Requirement(line), "ComfyUI"))
    for name, origin in (
        ("requirements.txt", "leanvideo nodes"),
        ("requirements-sage.txt", "leanvideo sage"),
    ):
        for line in (REPO_ROOT / name).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                found.append((Requirement(line), origin))
    for spec in importlib.metadata.requires("leanvideo") or []:
        req = Requirement(spec)
        if req.marker is None or "extra" not in str(req.marker):
            found.append((req, "leanvideo"))
    return found


def make_image_venv(target: Path, comfyui_dir: Path, image: dict[str, str] | None = None) -> Path:
    """A venv at ``target`` (with pip) that sees only the image's distributions installed here.

    What the pinned ComfyUI at ``comfyui_dir`` and LeanVideo need beyond the image is kept out even
    when an image package's local version requires it: that is the kit's to carry. Returns the
    venv's python. Raises :class:`ImageError` when torch is not installed here.
    """
    wanted = image if image is not None else read_device_image()
    installed = installed_distributions()
    stack = closure([req for req, _ in root_requirements(comfyui_dir)], installed, stop=set(wanted))
    linked = closure(
        [Requirement(name) for name in wanted if name not in ("pip", "setuptools")],
        installed,
        keep_out=stack - set(wanted),
    )
    if "torch" not in linked:
        raise ImageError(f"torch is not installed in {sys.executable}: the stand-in needs it")
    return make_view_venv(target, linked, installed)


def make_view_venv(
    target: Path, names: set[str], installed: dict[str, importlib.metadata.Distribution] | None = None
) -> Path:
    """A venv at ``target`` (with pip) that sees, of this interpreter's distributions, only ``names``:
    their top-level modules and ``.dist-info`` are linked into ``target/view``, which a ``.pth`` file of
    the venv names. What pip installs into the venv lands beside them. Returns the venv's python."""
    found = installed if installed is not None else installed_distributions()
    venv.create(target, with_pip=True, clear=True)
    python = target / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    answer = subprocess.run([str(python), "-c", purelib], capture_output=True, text=True, check=True)
    view = target / "view"
    view.mkdir()
    for name in sorted(names):
        dist = found[name]
        for top in _top_level_entries(dist):
            source = Path(str(dist.locate_file(top)))
            link = view / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    (Path(answer.stdout.strip()) / "view.pth").write_text(f"{view}\n", encoding="utf-8")
    return python


def installed_distributions() -> dict[str, importlib.metadata.Distribution]:
    return {canonicalize_name(d.metadata["Name"] or ""): d for d in importlib.metadata.distributions()}


def closure(
    roots: list[Requirement],
    installed: dict[str, importlib.metadata.Distribution],
    *,
    stop: set[str] | frozenset[str] = frozenset(),
    keep_out: set[str] | frozenset[str] = frozenset(),
) -> set[str]:
    """The installed distributions ``roots`` reach through the requirements of the versions here.

    Names in ``stop`` are reached but not followed; names in ``keep_out`` are not reached. The image
    is a consistent environment, so what its packages need is there, under whatever version it
    holds; the versions installed here may need others (a newer huggingface-hub does).
    """
    found: set[str] = set()
    queue = list(roots)
    while queue:
        req = queue.pop()
        name = canonicalize_name(req.name)
        if name in found or name in keep_out or name not in installed:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        found.add(name)
        if name not in stop:
            queue += [Requirement(spec) for spec in installed[name].requires or []]
    return found


def _top_level_entries(dist: importlib.metadata.Distribution) -> set[str]:
    """The first path parts of a distribution's files inside site-packages (no scripts, no ``..``)."""
    entries = set()
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if parts and parts[0] not in ("..", "__pycache__") and not parts[0].endswith(".pth"):
            entries.add(parts[0])
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.device_image", description=__doc__.split("\n")[0]
    )
    parser.add_argument("target", type=Path, help="venv folder to create (replaced if it exists)")
    parser.add_argument("--comfyui", type=Path, required=True, help="the pinned ComfyUI tree")
    args = parser.parse_args(argv)
    try:
        print(make_image_venv(args.target.resolve(), args.comfyui))
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
