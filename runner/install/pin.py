"""The ComfyUI pin: a manifest of relative path -> sha256 for every file of the pinned tree, and one
digest over it. Standard library only: ``install.py`` imports it before anything is installed, and it
must stay importable (and parseable) on the old Pythons that installer turns away with a clear message.

Example::

    pin = load_pin()
    verify_tree(Path(".workspace/ComfyUI"), pin, exact=False)  # exact: no file beyond the pin's either
                                                                # (a tree a server ran has __pycache__)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pack_dir() -> Path:
    """The node pack's folder: in this checkout, else wherever the ``leanvideo`` package is installed."""
    checkout = Path(__file__).resolve().parents[2] / "custom_nodes" / "leanvideo"
    if checkout.is_dir():
        return checkout
    spec = importlib.util.find_spec("leanvideo")
    if spec is None or spec.origin is None:
        return checkout
    return Path(spec.origin).parent


# The pin is the node pack's package data: the pack reads it from its own folder at run time, the
# installer from the same file.
PIN_FILE = _pack_dir() / "comfy_pin.json"


class InstallError(Exception):
    """A failure the user can fix; the message says how. main() prints it and exits 1."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(manifest: Mapping[str, str]) -> str:
    """sha256 over the sorted "path\\0filesha\\n" lines: one value naming the whole tree."""
    h = hashlib.sha256()
    for rel in sorted(manifest):
        h.update(f"{rel}\0{manifest[rel]}\n".encode())
    return h.hexdigest()


def list_files(root: Path, skip_top: Sequence[str] = (".git",)) -> list[str]:
    """Relative posix paths of the regular files under root (symlinks not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in skip_top]
        out += [Path(dirpath, f).relative_to(root).as_posix() for f in filenames]
    return sorted(out)


def load_pin(path: Path = PIN_FILE) -> dict[str, Any]:
    try:
        pin: dict[str, Any] = json.loads(path.read_text())
        consistent = tree_digest(pin["files"]) == pin["tree_digest"]
    except (OSError, ValueError, KeyError) as exc:
        raise InstallError(f"cannot read the ComfyUI pin {path}: {exc!r}; restore it from git") from exc
    if not consistent:
        raise InstallError(f"{path} is inconsistent (its manifest does not give its tree_digest)")
    return pin


def record_pin(tree: Path, path: Path = PIN_FILE) -> dict[str, Any]:
    """Rewrite the manifest in `path` from `tree`; the metadata already there is kept, version is re-read."""
    pin: dict[str, Any] = json.loads(path.read_text())
    excluded = set(pin["carrier"]["exclude"])
    files = {rel: sha256_file(tree / rel) for rel in list_files(tree) if rel not in excluded}
    pin.update(version=read_version(tree), files=files, tree_digest=tree_digest(files))
    path.write_text(json.dumps(pin, indent=1, sort_keys=True) + "\n")
    return pin


def compare_tree(root: Path, manifest: Mapping[str, str], present: Sequence[str] | None) -> list[str]:
    """Problems ("changed: x", "missing: y", "extra: z") of `root` against the manifest, in path order.

    `present` (the tree's files, from :func:`list_files`) is given when the tree must hold exactly the
    manifest (a wheel); files outside the manifest then count as problems.
    """
    problems = []
    for rel in sorted(manifest):
        p = root / rel
        if not p.is_file():
            problems.append(f"missing: {rel}")
        elif sha256_file(p) != manifest[rel]:
            problems.append(f"changed: {rel}")
    if present is not None:
        problems += [f"extra: {rel}" for rel in present if rel not in manifest]
    return problems


def verify_tree(root: Path, pin: Mapping[str, Any], exact: bool, *, list_extras: bool = True) -> list[str]:
    """Raise InstallError naming the first differing files unless `root` matches the pin.

    Returns the files outside the manifest that were allowed (only when not `exact`; none are looked for
    without `list_extras`: a tree with models and outputs in it is not walked).
    """
    present = list_files(root) if exact or list_extras else []
    problems = compare_tree(root, pin["files"], present if exact else None)
    if problems:
        first = "; ".join(problems[:5])
        raise InstallError(
            f"ComfyUI at {root} does not match pin v{pin['version']}: {len(problems)} "
            f"differences, first: {first}"
        )
    return [rel for rel in present if rel not in pin["files"]]


def read_version(comfy: Path) -> str:
    m = re.search(r"""__version__\s*=\s*["']([^"']+)""", (comfy / "comfyui_version.py").read_text())
    if not m:
        raise InstallError(f"no __version__ in {comfy / 'comfyui_version.py'}")
    return m.group(1)


def pin_mismatch(comfy: Path, pin_path: Path = PIN_FILE) -> str | None:
    """What to say of the ComfyUI at ``comfy`` when its version is not the pin's (a user's own ComfyUI,
    which install.py warned about once), or None; its files are not hashed here (install.py does)."""
    try:
        version, pin = read_version(comfy), load_pin(pin_path)
    except (OSError, InstallError) as exc:
        return (
            f"the version of the ComfyUI at {comfy} cannot be read ({exc}); LeanVideo is tested with its pin"
        )
    if version == pin["version"]:
        return None
    return (
        f"ComfyUI at {comfy} is v{version}; LeanVideo is tested with v{pin['version']} "
        f"(commit {pin['commit'][:12]}): expect breakage"
    )
