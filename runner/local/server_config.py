"""How one ComfyUI server is launched: its settings (:class:`ServerConfig`), the files it is pointed at
(extra model paths, the headless page) and its command line.

:mod:`runner.local.server` starts and stops the process these describe.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runner.errors import UsageError, WorkspaceError
from runner.local.extra_model_paths import comfyui_extra_model_paths
from runner.local.ports import pick_free_port
from runner.local.server_args import refuse_owned_flags
from runner.local.workspace import FIXTURE_NODES_DIR, NODE_PACK_DIR, Workspace

HEADLESS_PAGE = (
    "<!doctype html><title>ComfyUI (headless)</title>"
    "<p>This ComfyUI runs without its frontend package: use the API (LeanVideo's runner).</p>\n"
)
# Folder names ComfyUI looks models up under, mapped to the sub-folders of our models folder.
MODEL_FOLDERS: dict[str, tuple[str, ...]] = {
    "checkpoints": ("checkpoints",),
    "diffusion_models": ("unet", "diffusion_models"),  # ComfyUI's order: unet first
    "text_encoders": ("text_encoders", "clip"),
    "clip": ("text_encoders", "clip"),
    "loras": ("loras",),
    "vae": ("vae",),
    "upscale_models": ("upscale_models",),
    "embeddings": ("embeddings",),
    "clip_vision": ("clip_vision",),
    "controlnet": ("controlnet", "t2i_adapter"),
    "style_models": ("style_models",),
    "gligen": ("gligen",),
    "hypernetworks": ("hypernetworks",),
    "photomaker": ("photomaker",),
    "model_patches": ("model_patches",),
    "audio_encoders": ("audio_encoders",),
    "latent_upscale_models": ("latent_upscale_models",),
}


@dataclass(frozen=True)
class ServerConfig:
    """Everything that decides how one ComfyUI server is launched."""

    comfyui_dir: Path
    state_dir: Path
    models_dir: Path
    python: Path = field(default_factory=lambda: Path(sys.executable))
    host: str = "127.0.0.1"
    port: int = 8188
    custom_node_dirs: tuple[Path, ...] = (NODE_PACK_DIR,)
    extra_models_dirs: tuple[Path, ...] = ()  # searched before models_dir (a user's ComfyUI's models)
    cpu: bool | None = None
    # None: a SQLite file in the state folder. (":memory:" works but SQLAlchemy's pool then logs a
    # cross-thread ProgrammingError on the first prompt.)
    database_url: str | None = None
    extra_args: tuple[str, ...] = ()
    ready_timeout: float = 120.0
    stop_timeout: float = 15.0

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise UsageError(f"port must be between 1 and 65535, got {self.port}")
        if self.ready_timeout <= 0:
            raise UsageError(f"ready_timeout must be positive, got {self.ready_timeout}")
        if not (self.comfyui_dir / "main.py").is_file():
            raise WorkspaceError(f"{self.comfyui_dir} is not a ComfyUI folder (no main.py): run install.py")
        refuse_owned_flags(self.extra_args)

    @classmethod
    def in_workspace(
        cls,
        workspace: Workspace,
        state_dir: Path,
        *,
        port: int | None = None,
        fixture_nodes: bool = True,
        cpu: bool | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> ServerConfig:
        """A server of ``workspace`` (its ComfyUI, models and Python) on ``port`` (a free one when
        ``None``) with our node pack and, unless ``fixture_nodes`` is off, the tiny models' helper nodes.

        Example::

            config = ServerConfig.in_workspace(find_workspace(), Path("state"), cpu=True)
        """
        fixtures = (FIXTURE_NODES_DIR,) if fixture_nodes else ()
        return cls(
            comfyui_dir=workspace.comfyui_dir,
            state_dir=state_dir,
            models_dir=workspace.models_dir,
            python=workspace.python,
            port=port if port is not None else pick_free_port(),
            custom_node_dirs=(*workspace.node_dirs(), *fixtures),
            extra_models_dirs=(workspace.user_models_dir,) if workspace.user_models_dir else (),
            cpu=cpu,
            extra_args=extra_args,
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "comfyui.log"

    @property
    def output_dir(self) -> Path:
        return self.state_dir / "output"

    @property
    def input_dir(self) -> Path:
        """Where this server's LoadImage looks for images (ComfyUI's ``input`` under the base folder)."""
        return self.state_dir / "base" / "input"


def write_headless_page(config: ServerConfig) -> Path:
    """An empty page for ``--front-end-root``: the server runs headless without the frontend package."""
    root = config.state_dir / "frontend"
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.html").write_text(HEADLESS_PAGE, encoding="utf-8")
    return root


def write_extra_model_paths(config: ServerConfig) -> Path:
    """Write the extra-model-paths file that points ComfyUI at our models and node folders, searched as
    the user's own ComfyUI searches them, then the workspace's: the folders its ``extra_model_paths.yaml``
    marks ``is_default``, its ``models`` (``extra_models_dirs``: every folder in it, by its name), the
    file's other folders, then ``models_dir``. ComfyUI loads that file itself, before this one, putting
    its other folders before its ``models`` when not told otherwise: so its ``models`` go to the front
    here (``is_default``, each kind's folders given last to first), and then its ``is_default`` ones
    again, as given."""
    document: dict[str, dict[str, Any]] = {}
    for index, folder in reversed(list(enumerate(config.extra_models_dirs, start=1))):
        present = sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
        kinds = {name: (name,) for name in present} | MODEL_FOLDERS
        document[f"leanvideo_models_{index}"] = {
            "base_path": str(folder),
            "is_default": True,
            **{kind: "\n".join(reversed(subdirs)) for kind, subdirs in kinds.items()},
        }
    theirs = comfyui_extra_model_paths(config.comfyui_dir).first if config.extra_models_dirs else {}
    if theirs:
        document["leanvideo_your_defaults"] = {
            "is_default": True,
            **{kind: "\n".join(str(p) for p in reversed(paths)) for kind, paths in theirs.items()},
        }
    workspace: dict[str, Any] = {"base_path": str(config.models_dir), **_model_kinds()}
    if config.custom_node_dirs:
        workspace["custom_nodes"] = "\n".join(str(p.resolve()) for p in config.custom_node_dirs)
    document["leanvideo"] = workspace
    path = config.state_dir / "extra_model_paths.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def _model_kinds() -> dict[str, str]:
    return {kind: "\n".join(subdirs) for kind, subdirs in MODEL_FOLDERS.items()}


def build_command(config: ServerConfig, *, cpu: bool, front_end_root: Path | None = None) -> list[str]:
    """The ComfyUI command line for ``config``; user flags come last so they can override ours."""
    command = [
        str(config.python),
        str(config.comfyui_dir / "main.py"),
        "--listen",
        config.host,
        "--port",
        str(config.port),
        "--disable-auto-launch",
        "--base-directory",
        str(config.state_dir / "base"),
        "--output-directory",
        str(config.output_dir),
        "--temp-directory",
        str(config.state_dir),
        "--database-url",
        config.database_url or f"sqlite:///{config.state_dir / 'comfyui.db'}",
        "--preview-method",
        "none",
        "--extra-model-paths-config",
        str(config.state_dir / "extra_model_paths.yaml"),
    ]
    if cpu and "--cpu" not in config.extra_args:
        command.append("--cpu")
    if front_end_root is not None and "--front-end-root" not in config.extra_args:
        command += ["--front-end-root", str(front_end_root)]
    command.extend(config.extra_args)
    return command
