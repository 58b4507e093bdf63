"""The INT8 loaders' kernel dispatcher inside ComfyUI: where its table lives, and how it reports.

Each loader run makes one :class:`~leanvideo.int8.dispatch.KernelDispatcher` for the model it loads:

- forced by the node's ``path`` input, or when that is ``auto`` by ``LEANVIDEO_INT8_KERNEL``
  (``w8a16``, ``int_mm``, ``int_mm_fused``, ``kitchen`` or ``onednn``), else measuring at first use;
- its table on disk is ``<ComfyUI user directory>/leanvideo/int8_kernels.json``, shared by every load
  and server using that user directory (per device inside, a CPU named with its int8 instruction sets;
  a new torch or comfy-kitchen measures again);
- each new choice is logged and added to the running prompt's telemetry record as an ``int8_kernel``
  event; the loader's report (the node's UI text, and an ``int8_kernels`` telemetry event) lists the
  mode and the choices known for the model's weight shapes. Shapes first run after the loader ran (by
  the sampler) are chosen then: each such choice sends the report again to the prompt's client as a
  ``leanvideo.report`` message carrying the ``token`` the loader's UI output carries too, so the editor
  shows it on whichever node showed that loader run's report (``web/reports.js``), cached runs included.

Example::

    dispatcher = make_dispatcher("auto", os.environ)
    ui = {"text": [report_kernels(dispatcher, patcher.model, token=token)], REPORT_TOKEN: [token]}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import folder_paths
import torch

from .int8.dispatch import ENV_KERNEL, KernelDispatcher, forced_kernel
from .int8.dispatch_report import of_shapes
from .int8.kernel_table import Choice
from .int8.linear import kernel_of_route
from .int8_ops import int8_weight_shapes

TABLE_FILE = Path("leanvideo") / "int8_kernels.json"


def kernel_table_path() -> Path:
    """Where the measured kernel table is kept: under ComfyUI's user directory."""
    return Path(folder_paths.get_user_directory()) / TABLE_FILE


def _telemetry() -> Any:
    try:
        from server import PromptServer
    except ImportError:
        return None
    return getattr(getattr(PromptServer, "instance", None), "leanvideo_telemetry", None)


def _running_node() -> str | None:
    """The id of the node ComfyUI is running (its execution context), or None outside a prompt."""
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:
        return None
    context = get_executing_context()
    return None if context is None else str(context.node_id)


def make_dispatcher(path: str, environ: Mapping[str, str], *, table: Path | None = None) -> KernelDispatcher:
    """The dispatcher for one loader run: ``path`` is the node's input, ``environ`` the environment."""
    telemetry = _telemetry()

    def note(key: str, choice: Choice) -> None:
        if telemetry is not None:
            telemetry.note_event("int8_kernel", {"shape": key, **choice.as_dict()})

    forced = forced_kernel(path, environ)
    by_environment = forced is not None and kernel_of_route(path) is None  # path=auto, the variable set
    return KernelDispatcher(
        forced=forced,
        cache_path=table or kernel_table_path(),
        on_choice=note,
        forced_by=ENV_KERNEL if by_environment else None,
    )


def report_kernels(
    dispatcher: KernelDispatcher, model: Any, *, note: str | None = None, token: str | None = None
) -> str:
    """The loader's report on its kernels (also noted in telemetry): the mode and known choices, then
    ``note``. With ``token`` (in the loader's UI output as ``REPORT_TOKEN``), a choice made later sends
    the report again."""
    shapes = int8_weight_shapes(model)

    def report() -> str:
        return dispatcher.summary(shapes) + (f"\n{note}" if note else "")

    text = report()
    telemetry = _telemetry()
    if telemetry is not None:
        choices = {key: choice.as_dict() for key, choice in of_shapes(dispatcher.choices(), shapes).items()}
        event = {"mode": dispatcher.mode(), "report": text, "choices": choices}
        if (running := _running_node()) is not None:  # which loader: a prompt may have several
            event["node_id"] = running
        telemetry.note_event("int8_kernels", event)
    if token is not None:
        _resend_on_choice(dispatcher, token, report)
    return text


REPORT_EVENT = "leanvideo.report"  # {"token": token, "text": [report]}: a report changed after its node ran
REPORT_TOKEN = "leanvideo_report"  # the UI output key holding the token of a report sent again later


def _resend_on_choice(dispatcher: KernelDispatcher, token: str, report: Callable[[], str]) -> None:
    """Have each later choice of ``dispatcher`` send ``report()`` to the client of the running prompt
    (none for a prompt sent without a client id: ComfyUI would send it to every client)."""
    try:
        from server import PromptServer
    except ImportError:
        return
    server = getattr(PromptServer, "instance", None)
    if server is None:
        return
    told = dispatcher.on_choice

    def on_choice(key: str, choice: Choice) -> None:
        if told is not None:
            told(key, choice)
        if server.client_id is not None:
            server.send_sync(REPORT_EVENT, {"token": token, "text": [report()]}, server.client_id)

    dispatcher.on_choice = on_choice


def text_encoder_dtype_note(requested: torch.dtype | None) -> str | None:
    """A line for the text encoder loader's report when ``requested`` is not float32: ComfyUI's text
    encoders (``SDClipModel``: CLIP, T5, UMT5, …) run in float32 whatever their weights' dtype, so the
    dtype only sets how the weights that are not INT8 are held; else ``None``."""
    if requested is None or requested == torch.float32:
        return None
    name = str(requested).removeprefix("torch.")
    return (
        f"compute dtype: {name} asked; ComfyUI's text encoders compute in float32 (the weights that are "
        f"not INT8, embeddings and norms, are held in {name})"
    )


def compute_dtype_note(requested: torch.dtype | None, model: Any) -> str | None:
    """A line for the loader's report when ComfyUI computes ``model`` (a ``BaseModel``) in another dtype
    than ``requested`` (on a CPU it casts bf16/fp16 to fp32), else ``None``."""
    if requested is None:
        return None
    weights = model.get_dtype()
    computes = getattr(model, "manual_cast_dtype", None) or weights
    if computes == requested:
        return None
    name = str(requested).removeprefix("torch.")
    return (
        f"compute dtype: {name} asked; ComfyUI computes in {str(computes).removeprefix('torch.')} on this "
        f"device (weights held in {str(weights).removeprefix('torch.')})"
    )
