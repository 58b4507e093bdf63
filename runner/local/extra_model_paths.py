"""The model folders a ComfyUI's own ``extra_model_paths.yaml`` adds, read as ComfyUI v0.3.75 reads it
(``utils/extra_config.py``): sections of ``folder: paths`` (one per line), relative to the section's
``base_path`` or to the file's folder. The servers LeanVideo starts from a user's ComfyUI load that file
(ComfyUI's ``main.py`` reads it beside itself), so ``models check`` searches the same folders.

Example::

    extra = read_extra_model_paths(Path("~/ComfyUI/extra_model_paths.yaml").expanduser())
    extra["checkpoints"]  # [PosixPath('/data/models/checkpoints')]
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from runner.errors import UsageError

__all__ = ["EXTRA_PATHS_FILE", "read_extra_model_paths"]

EXTRA_PATHS_FILE = "extra_model_paths.yaml"  # beside ComfyUI's main.py, which loads it at start


def read_extra_model_paths(path: Path) -> dict[str, list[Path]]:
    """Folder name (``checkpoints``, ``loras``, …) -> the folders ``path`` adds for it, in file order.

    Raises:
        UsageError: the file cannot be read or is not the YAML ComfyUI reads (named, with the entry).
    """
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot be read as ComfyUI's extra model paths ({exc})") from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise UsageError(f"{path}: not a mapping of sections (ComfyUI would not start with it)")
    here = path.absolute().parent
    folders: dict[str, list[Path]] = {}
    for section, entries in document.items():
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise UsageError(f"{path}: section {section!r} is not a mapping of folder: paths")
        base = entries.get("base_path")
        if base is not None:
            base = Path(os.path.expandvars(os.path.expanduser(str(base))))
            base = base if base.is_absolute() else here / base
        for folder, lines in entries.items():
            if folder in ("base_path", "is_default"):
                continue
            if not isinstance(lines, str):
                raise UsageError(f"{path}: {section}.{folder} is not a path (or paths, one per line)")
            for line in lines.split("\n"):
                if line:
                    full = Path(base, line) if base is not None else here / line
                    folders.setdefault(str(folder), []).append(Path(os.path.normpath(full)))
    return folders
