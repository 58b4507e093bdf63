"""Release memory held by ComfyUI's loaded models, in the right order, and measure it.

ComfyUI keeps every model it has put on the compute device in ``model_management.current_loaded_models``
(a list of ``LoadedModel``). Its own ``unload_all_models`` (what ``POST /free`` does) only moves weights to
the offload device, skips the cache flush when nothing was unloaded and never returns freed heap pages to
the OS. :func:`release_models` does the whole job, synchronously, in this order:

1. wait for queued GPU work (``torch.cuda.synchronize``), so nothing still uses the weights;
2. unload the chosen models (weights leave the compute device) and drop them from ComfyUI's list;
3. ``gc.collect()`` so tensors only cycles kept alive are really released;
4. empty the CUDA caching allocator and collect CUDA IPC handles (``soft_empty_cache(force=True)``);
5. with ``free_ram``: return freed heap pages to the OS (glibc ``malloc_trim``) and ask ComfyUI to drop
   its node-output cache when the prompt ends (the loader outputs are what keep a model's RAM copy alive).

A model a later node still needs is not lost: its weights stay in RAM (or on disk) and ComfyUI loads it
back onto the device when that node runs. Running the release twice changes nothing the second time.

Example::

    report = release_models(FreeMode.ALL)
    print(report.before.rss_bytes - report.after.rss_bytes)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil
import torch

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


class FreeMode(str, enum.Enum):
    """Which loaded models to release."""

    ALL = "unload all"
    ALL_BUT_CONNECTED = "unload all but the connected model"
    TEXT_ENCODERS = "unload text encoders only"


@dataclass(frozen=True)
class LoadedModelInfo:
    """One entry of ComfyUI's loaded-model list."""

    name: str
    kind: str  # "diffusion_model", "text_encoder" or "other" (VAE, upscaler, …)
    device: str
    loaded_bytes: int


@dataclass(frozen=True)
class MemorySnapshot:
    """Process and device memory at one moment. VRAM fields are None without CUDA (see ``vram_reason``)."""

    rss_bytes: int
    vram_allocated_bytes: int | None
    vram_reserved_bytes: int | None
    vram_reason: str | None
    loaded_models: tuple[LoadedModelInfo, ...] = ()

    @property
    def loaded_bytes(self) -> int:
        return sum(m.loaded_bytes for m in self.loaded_models)


@dataclass(frozen=True)
class ReleaseReport:
    """What :func:`release_models` did and the memory before and after."""

    mode: str
    before: MemorySnapshot
    after: MemorySnapshot
    unloaded: tuple[str, ...]
    kept: tuple[str, ...]
    steps: tuple[str, ...]
    seconds: float
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("before", "after"):
            data[key]["loaded_bytes"] = getattr(self, key).loaded_bytes
        return data

    def summary(self) -> str:
        """One human-readable line per figure, for the node's UI and the log."""
        lines = [f"Free VRAM ({self.mode}): unloaded {len(self.unloaded)} model(s) in {self.seconds:.2f} s"]
        if self.unloaded:
            lines.append("  unloaded: " + ", ".join(self.unloaded))
        if self.kept:
            lines.append("  kept: " + ", ".join(self.kept))
        b, a = self.before, self.after
        if b.vram_allocated_bytes is None or a.vram_allocated_bytes is None:
            lines.append(f"  VRAM: n/a ({a.vram_reason})")
        else:
            lines.append(
                f"  VRAM allocated {_mib(b.vram_allocated_bytes)} → {_mib(a.vram_allocated_bytes)}, "
                f"reserved {_mib(b.vram_reserved_bytes)} → {_mib(a.vram_reserved_bytes)}"
            )
        lines.append(f"  RSS {_mib(b.rss_bytes)} → {_mib(a.rss_bytes)}")
        lines.append(f"  models on device {_mib(b.loaded_bytes)} → {_mib(a.loaded_bytes)}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.1f} MiB"


def describe_loaded_models() -> tuple[LoadedModelInfo, ...]:
    """ComfyUI's loaded-model list, newest first, skipping entries whose model is already gone."""
    import comfy.model_management as mm

    infos = []
    for loaded in list(mm.current_loaded_models):
        patcher = loaded.model
        if patcher is None:
            continue
        infos.append(
            LoadedModelInfo(
                name=type(patcher.model).__name__,
                kind=classify_model(patcher),
                device=str(loaded.device),
                loaded_bytes=int(patcher.loaded_size()),
            )
        )
    return tuple(infos)


def classify_model(patcher: Any) -> str:
    """``text_encoder`` for a CLIP's patcher, ``diffusion_model`` for a MODEL, else ``other``."""
    import comfy.model_base

    if getattr(patcher, "is_clip", False):
        return "text_encoder"
    if isinstance(getattr(patcher, "model", None), comfy.model_base.BaseModel):
        return "diffusion_model"
    return "other"


def take_snapshot(*, with_models: bool = True) -> MemorySnapshot:
    """Measure RSS, CUDA allocator figures (None with a reason without CUDA) and the loaded models."""
    rss = psutil.Process().memory_info().rss
    if torch.cuda.is_available():
        allocated, reserved, reason = torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), None
    else:
        allocated, reserved, reason = None, None, "no CUDA device: torch.cuda.is_available() is False"
    models = describe_loaded_models() if with_models else ()
    return MemorySnapshot(rss, allocated, reserved, reason, models)


def find_patcher(value: Any) -> Any | None:
    """The ModelPatcher behind a MODEL, CLIP or VAE value (``.patcher``), or None for other types."""
    import comfy.model_patcher

    if isinstance(value, comfy.model_patcher.ModelPatcher):
        return value
    patcher = getattr(value, "patcher", None)
    return patcher if isinstance(patcher, comfy.model_patcher.ModelPatcher) else None


def _should_release(patcher: Any, mode: FreeMode, keep: Any | None) -> bool:
    if mode is FreeMode.TEXT_ENCODERS:
        return classify_model(patcher) == "text_encoder"
    if mode is FreeMode.ALL_BUT_CONNECTED and keep is not None:
        return not (patcher is keep or patcher.is_clone(keep))
    return True


def trim_heap() -> bool:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``); False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError, TypeError):
        return False


def _unload_selected(mode: FreeMode, keep_patcher: Any | None) -> tuple[list[str], list[str]]:
    """Unload the chosen models and drop them from ComfyUI's list. A function of its own so that no
    local reference outlives it and keeps a model alive through the ``gc.collect()`` that follows."""
    import comfy.model_management as mm

    unloaded: list[str] = []
    kept: list[str] = []
    for loaded in list(mm.current_loaded_models):
        patcher = loaded.model
        if patcher is None:
            continue
        name = type(patcher.model).__name__
        if not _should_release(patcher, mode, keep_patcher):
            kept.append(name)
            continue
        if loaded.model_finalizer is not None:  # None: already off the device
            loaded.model_unload()
        mm.current_loaded_models.remove(loaded)
        unloaded.append(name)
    return unloaded, kept


def value_kind(value: Any) -> str:
    """What a value passed between nodes is, in ComfyUI's words where its shape says (LATENT, IMAGE,
    CONDITIONING), else its Python type."""
    if isinstance(value, dict) and "samples" in value:
        return "LATENT"
    if isinstance(value, torch.Tensor):
        return "IMAGE" if value.ndim == 4 and value.shape[-1] in (1, 3, 4) else "tensor"
    if isinstance(value, list) and value and isinstance(value[0], (list, tuple)) and len(value[0]) == 2:
        return "CONDITIONING"
    return type(value).__name__


def release_models(
    mode: FreeMode,
    *,
    keep: Any | None = None,
    free_ram: bool = False,
    request_cache_drop: Callable[[], None] | None = None,
) -> ReleaseReport:
    """Unload models from the compute device and free the memory they held (see the module docstring).

    Args:
        mode: which models to release.
        keep: for ``ALL_BUT_CONNECTED``, the value whose model stays loaded (MODEL, CLIP or VAE).
        free_ram: also return freed heap to the OS and call ``request_cache_drop``.
        request_cache_drop: asks ComfyUI to drop its node-output cache after the prompt.
    """
    import comfy.model_management as mm

    start = time.perf_counter()
    before = take_snapshot()
    steps: list[str] = []
    notes: list[str] = []
    keep_patcher = find_patcher(keep) if keep is not None else None
    if mode is FreeMode.ALL_BUT_CONNECTED and keep is None:
        notes.append("nothing is connected, so no model is kept: released all")
    elif mode is FreeMode.ALL_BUT_CONNECTED and keep_patcher is None:
        notes.append(f"the connected value ({value_kind(keep)}) holds no model: released all")

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        steps.append("cuda synchronize")

    mm.cleanup_models_gc()
    unloaded, kept = _unload_selected(mode, keep_patcher)
    steps.append(f"unload {len(unloaded)} model(s)")

    gc.collect()
    steps.append("gc.collect")
    mm.soft_empty_cache(force=True)  # torch.cuda.empty_cache() + torch.cuda.ipc_collect() on CUDA
    steps.append("empty cache + ipc collect" if torch.cuda.is_available() else "empty cache (no CUDA: no-op)")

    if free_ram:
        if request_cache_drop is not None:
            request_cache_drop()
            steps.append("node cache dropped after this prompt")
        steps.append("malloc_trim" if trim_heap() else "malloc_trim (nothing returned or unavailable)")

    if not torch.cuda.is_available() and unloaded and not free_ram:
        notes.append(
            "no GPU: the models ran from RAM, and ComfyUI's node cache still holds their weights, so the RSS "
            "does not fall; free_ram drops that cache after the prompt and gives the memory back"
        )
    report = ReleaseReport(
        mode=mode.value,
        before=before,
        after=take_snapshot(),
        unloaded=tuple(unloaded),
        kept=tuple(kept),
        steps=tuple(steps),
        seconds=time.perf_counter() - start,
        notes=tuple(notes),
    )
    logger.info("%s", report.summary())
    return report
