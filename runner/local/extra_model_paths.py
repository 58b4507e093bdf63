"""The model folders a ComfyUI's own ``extra_model_paths.yaml`` adds, read as ComfyUI v0.3.75 reads it
(``utils/extra_config.py``): sections of ``folder: paths`` (one per line), relative to the section's
``base_path`` or to the file's folder. A section with ``is_default: true`` puts its folders before the
ComfyUI's own ``models`` folder (each at the front, so the last one given is searched first); the
others come after it. The servers LeanVideo starts from a user's ComfyUI load that file (ComfyUI's
``main.py`` reads it beside itself) and search in that order, then the workspace's models; so does
``models check``.

Example::

    extra = read_extra_model_paths(Path("~/ComfyUI/extra_model_paths.yaml").expanduser())
    extra.after["checkpoints"]  # [PosixPath('/data/models/checkpoints')]: after ComfyUI's models
    extra.first  # {}: no section is_default
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from runner.errors import UsageError

__all__ = ["EXTRA_PATHS_FILE", "ExtraModelPaths", "comfyui_extra_model_paths", "read_extra_model_paths"]

EXTRA_PATHS_FILE = "extra_model_paths.yaml"  # beside ComfyUI's main.py, which loads it at start


@dataclass(frozen=True)
class ExtraModelPaths:
    """Folder name (``checkpoints``, ``loras``, …) -> the folders an ``extra_model_paths.yaml`` adds for
    it, in the order a ComfyUI searches them: ``first`` before its own ``models`` folder (the sections
    marked ``is_default``), ``after`` behind it."""

    file: Path | None = None
    first: dict[str, list[Path]] = field(default_factory=dict)
    after: dict[str, list[Path]] = field(default_factory=dict)

    def folders(self) -> dict[str, list[Path]]:
        """Every folder of each name, ``first``'s then ``after``'s."""
        names = dict.fromkeys([*self.first, *self.after])
        return {name: [*self.first.get(name, []), *self.after.get(name, [])] for name in names}


def comfyui_extra_model_paths(comfyui_dir: Path) -> ExtraModelPaths:
    """What the ``extra_model_paths.yaml`` beside ``comfyui_dir``'s ``main.py`` (followed through a
    link, as ComfyUI does) adds; nothing when there is none. Raises :class:`UsageError` as
    :func:`read_extra_model_paths`."""
    path = (comfyui_dir / "main.py").resolve().parent / EXTRA_PATHS_FILE
    return read_extra_model_paths(path) if path.is_file() else ExtraModelPaths()


def read_extra_model_paths(path: Path) -> ExtraModelPaths:
    """The folders ``path`` adds, by folder name, in the order a ComfyUI searches them.

    Raises:
        UsageError: the file cannot be read or is not the YAML ComfyUI reads (named, with the entry).
    """
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot be read as ComfyUI's extra model paths ({exc})") from exc
    if document is None:
        return ExtraModelPaths(path)
    if not isinstance(document, dict):
        raise UsageError(f"{path}: not a mapping of sections (ComfyUI would not start with it)")
    here = path.absolute().parent
    first: dict[str, list[Path]] = {}
    after: dict[str, list[Path]] = {}
    for section, entries in document.items():
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise UsageError(f"{path}: section {section!r} is not a mapping of folder: paths")
        base = entries.get("base_path")
        if base is not None:
            base = Path(os.path.expandvars(os.path.expanduser(str(base))))
            base = base if base.is_absolute() else here / base
        default = bool(entries.get("is_default"))
        for folder, lines in entries.items():
            if folder in ("base_path", "is_default"):
                continue
            if not isinstance(lines, str):
                raise UsageError(f"{path}: {section}.{folder} is not a path (or paths, one per line)")
            for line in lines.split("\n"):
                if line:
                    full = Path(os.path.normpath(Path(base, line) if base is not None else here / line))
                    if default:  # put at the front, each in turn
                        first.setdefault(str(folder), []).insert(0, full)
                    else:
                        after.setdefault(str(folder), []).append(full)
    return ExtraModelPaths(path, first, after)
