"""Where LeanVideo keeps the pinned ComfyUI, the models and the per-server state.

``install.py`` writes ``<workspace>/install.json``; this module only reads it. The workspace is
``<repo>/.workspace`` unless ``LEANVIDEO_WORKSPACE`` names another folder, and ``LEANVIDEO_COMFYUI``
points the runner at a different ComfyUI tree without re-running the installer.

Example::

    ws = find_workspace()
    print(ws.comfyui_dir, ws.models_dir)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from runner.errors import WorkspaceError
from runner.local.extra_model_paths import comfyui_extra_model_paths

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_PACK_DIR = REPO_ROOT / "custom_nodes"
FIXTURE_NODES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
WORKFLOWS_DIR = REPO_ROOT / "workflows"


@dataclass(frozen=True)
class Workspace:
    """Resolved locations of one LeanVideo installation."""

    root: Path
    comfyui_dir: Path
    python: Path

    @property
    def models_dir(self) -> Path:
        """Models folder the servers we start search (fixtures are written here)."""
        return self.root / "models"

    @property
    def user_comfyui(self) -> bool:
        """Whether the ComfyUI is the user's own (``install.py --comfyui``), not the workspace's copy."""
        return self.comfyui_dir.resolve() != (self.root / "ComfyUI").resolve()

    @property
    def user_models_dir(self) -> Path | None:
        """The user's ComfyUI's ``models`` folder, which the servers we start search too; ``None`` for the
        workspace's own ComfyUI (its models are in :attr:`models_dir`)."""
        folder = self.comfyui_dir / "models"
        return folder if self.user_comfyui and folder.is_dir() else None

    @property
    def extra_model_folders(self) -> dict[str, list[Path]]:
        """The model folders, by folder name, that the ComfyUI's own ``extra_model_paths.yaml`` adds,
        which the servers we start search before the workspace's :attr:`models_dir` (none without one).
        Raises :class:`~runner.errors.UsageError` when ComfyUI could not read that file."""
        return comfyui_extra_model_paths(self.comfyui_dir).folders()

    def node_dirs(self) -> tuple[Path, ...]:
        """The node folders a server we start loads besides the fixtures': our pack, and with the user's own
        ComfyUI its ``custom_nodes`` too (the server's base folder is its own, so ComfyUI would not see
        them). The pack is loaded once: not from here as well when ``install.py --comfyui`` linked it
        there (or ComfyUI-Manager cloned this repository there)."""
        theirs = self.comfyui_dir / "custom_nodes"
        if not self.user_comfyui or not theirs.is_dir():
            return (NODE_PACK_DIR,)
        return (theirs,) if holds_pack(theirs) else (NODE_PACK_DIR, theirs)

    @property
    def servers_dir(self) -> Path:
        """Parent of each server's own base, output, temp and log folders."""
        return self.root / "servers"


def holds_pack(folder: Path) -> bool:
    """Whether the node folder ``folder`` loads this repository's node pack (it is ``custom_nodes/`` here,
    or an entry of it links to the pack or to this repository)."""
    if folder.resolve() == NODE_PACK_DIR.resolve():
        return True
    ours = {(NODE_PACK_DIR / "leanvideo").resolve(), REPO_ROOT.resolve()}
    try:
        return any(entry.resolve() in ours for entry in folder.iterdir())
    except OSError:
        return False


def default_workspace_root() -> Path:
    """The workspace folder: ``$LEANVIDEO_WORKSPACE`` or ``<repo>/.workspace``."""
    env = os.environ.get("LEANVIDEO_WORKSPACE")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".workspace"


def find_workspace(root: Path | None = None) -> Workspace:
    """Read the installation record and check that the ComfyUI tree it names is usable.

    Raises:
        WorkspaceError: when nothing is installed yet or the recorded ComfyUI is gone.
    """
    root = (root or default_workspace_root()).resolve()
    record_path = root / "install.json"
    record: dict[str, object] = {}
    if record_path.is_file():
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise WorkspaceError(f"Cannot read {record_path}: {exc}. Re-run `python install.py`.") from exc
    env_comfy = os.environ.get("LEANVIDEO_COMFYUI")
    if env_comfy:
        comfyui = Path(env_comfy).expanduser().resolve()
    elif isinstance(record.get("comfyui"), str):
        comfyui = Path(str(record["comfyui"]))
    else:
        raise WorkspaceError(
            f"No ComfyUI installation recorded in {record_path}. Run `python install.py`, or point "
            "LEANVIDEO_WORKSPACE at the workspace install.py used (--workspace), or LEANVIDEO_COMFYUI at a "
            "ComfyUI folder."
        )
    if not (comfyui / "main.py").is_file():
        if env_comfy:
            what = (
                "does not exist"
                if not comfyui.exists()
                else "is a file, not a folder"
                if not comfyui.is_dir()
                else "is not a ComfyUI folder (no main.py)"
            )
            raise WorkspaceError(
                f"LEANVIDEO_COMFYUI={env_comfy}: {comfyui} {what}; point it at a ComfyUI's top folder (the "
                "one holding main.py), or unset it to use the one install.py recorded"
            )
        raise WorkspaceError(f"{comfyui} is not a ComfyUI folder (no main.py). Re-run `python install.py`.")
    python = Path(str(record["python"])) if isinstance(record.get("python"), str) else Path(sys.executable)
    if not python.exists():
        python = Path(sys.executable)
    return Workspace(root=root, comfyui_dir=comfyui, python=python)
