"""Server-side telemetry: process and GPU memory, GPU energy, and one record per prompt.

ComfyUI's API has no peak VRAM, peak RSS or energy per prompt, so the pack measures them in the server
process at each prompt's start and end and keeps the records, so that a client can ask late.

How prompt boundaries are observed (no ComfyUI file is patched): :meth:`Telemetry.attach` wraps two
methods of the server's ``PromptQueue`` *instance* (``PromptServer.instance.prompt_queue``):

======================  ====================================================================
wrapped method          meaning in ``main.prompt_worker`` (pinned v0.3.75)
======================  ====================================================================
``get()`` → item        the worker took a prompt and is about to execute it: prompt start
``task_done(.., st)``   execution returned and history is written: prompt end; ``st`` carries
                        ``success``/``error`` and the status messages (``execution_error`` has
                        the exception type, ``execution_interrupted`` marks an interrupt)
======================  ====================================================================

The websocket messages (``execution_start`` …) were not used: ComfyUI only sends them when the prompt
has a ``client_id``, while every prompt goes through the queue. ``task_done`` runs before the worker sends
``executing{node: null}``, so a client that waits for that message finds the record complete.

Per-prompt peaks: at each start the CUDA peak counters (``torch.cuda.reset_peak_memory_stats``) and the
kernel's peak RSS (``VmHWM``, reset by writing ``5`` to ``/proc/self/clear_refs``) are reset, after
folding the old peak into the "since last reset" figure the snapshot reports. NVML (``pynvml`` from
``nvidia-ml-py``) is used only when importable; its total-energy counter gives energy per prompt.
Without CUDA/NVML those fields are ``null`` and a ``reason`` says why; RSS is always real.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_PROMPT_RECORDS = 1000
MILLIJOULES_PER_WH = 3.6e6
CLEAR_REFS = Path("/proc/self/clear_refs")
PROC_STATUS = Path("/proc/self/status")


# --- samplers -------------------------------------------------------------------------------------------


def read_rss() -> int:
    return int(psutil.Process().memory_info().rss)


def read_peak_rss() -> int:
    """The kernel's peak RSS (``VmHWM``) since the process start or the last :func:`reset_peak_rss`."""
    try:
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return read_rss()


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux ≥ 4.0); False where that is not possible."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def cuda_reason() -> str | None:
    """None when CUDA figures are available, else why not."""
    return None if torch.cuda.is_available() else "no CUDA device: torch.cuda.is_available() is False"


class Nvml:
    """NVML device memory and energy, when ``pynvml`` imports and initialises; else ``reason`` says why."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.gpu_index: int | None = None
        self._nvml: Any = None
        self._handle: Any = None
        try:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
            self.gpu_index = torch.cuda.current_device() if torch.cuda.is_available() else 0
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
            self._nvml = nvml
        except ImportError:
            self.reason = "pynvml is not installed (pip install nvidia-ml-py)"
        except Exception as exc:  # NVMLError: no driver, no device
            self.reason = f"NVML unavailable: {exc}"

    def memory_used(self) -> int | None:
        if self._nvml is None:
            return None
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def energy_mj(self) -> int | None:
        """Total energy since the driver loaded, in millijoules (Volta and newer), else None.

        None without a counter (an older GPU or driver); any other NVML failure is logged as an error
        naming the GPU, and also gives None.
        """
        if self._nvml is None:
            return None
        nvml = self._nvml
        try:
            return int(nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except nvml.NVMLError as exc:
            if exc.value not in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                logger.error("NVML could not read the energy counter of GPU %s: %s", self.gpu_index, exc)
            return None


# --- records --------------------------------------------------------------------------------------------


@dataclass
class PromptRecord:
    """Figures of one prompt. Fields that need CUDA/NVML are None without them (``gpu_reason``)."""

    prompt_id: str
    status: str  # running, success, error, interrupted
    started_at: float
    finished_at: float | None = None
    duration_s: float | None = None
    rss_start_bytes: int = 0
    rss_end_bytes: int | None = None
    peak_rss_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    cuda_max_reserved_bytes: int | None = None
    nvml_used_start_bytes: int | None = None
    nvml_used_end_bytes: int | None = None
    energy_start_mj: int | None = None
    energy_wh: float | None = None
    error_type: str | None = None
    gpu_reason: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("energy_start_mj")
        return data


def exception_name(raw: str) -> str:
    """An exception type as ComfyUI reports it, without where the pack is installed: ComfyUI names a
    custom node package's modules by its path (``/srv/ComfyUI/custom_nodes/leanvideo.int8.spec.X``, or
    ``….custom_nodes.leanvideo.int8.spec.X`` when the pack sits in a repository's folder), which would
    make one error a different metrics label on every machine."""
    name = raw.rpartition("/")[2]
    return name.rpartition("custom_nodes.")[2]


def outcome_of(status: Any) -> tuple[str, str | None]:
    """``(status, error type)`` from the ``ExecutionStatus`` ComfyUI passes to ``task_done``."""
    if status is None:
        return "success", None
    for event, data in getattr(status, "messages", None) or []:
        if event == "execution_interrupted":
            return "interrupted", None
        if event == "execution_error":
            return "error", exception_name(str(data.get("exception_type") or "unknown"))
    return (
        ("success", None) if getattr(status, "status_str", "success") == "success" else ("error", "unknown")
    )


# --- the telemetry object -------------------------------------------------------------------------------


class Telemetry:
    """Live figures and per-prompt records for one server. Create one per server (see ``extension``).

    Example::

        telemetry = Telemetry()
        telemetry.attach(PromptServer.instance.prompt_queue)
        telemetry.snapshot()["process"]["rss_bytes"]
    """

    def __init__(self, *, max_records: int = MAX_PROMPT_RECORDS, nvml: Nvml | None = None) -> None:
        self.nvml = nvml if nvml is not None else Nvml()
        self.max_records = max_records
        self.queue: Any = None
        self.listeners: list[Callable[[PromptRecord], None]] = []
        self._lock = threading.Lock()
        self._records: OrderedDict[str, PromptRecord] = OrderedDict()
        self._running: str | None = None
        self._running_client: str | None = None  # the websocket client that queued it
        self.starts: list[Callable[[str, dict[str, Any]], None]] = []  # told (prompt id, prompt) at start
        self._running_since = 0.0  # time.perf_counter() at the running prompt's start
        self._totals = {"finished": 0, "errors": 0}
        self.reset()

    def reset(self) -> dict[str, Any]:
        """Reset the peaks (RSS, CUDA) that the snapshot reports; records are kept. Returns the snapshot.

        While a prompt runs, the process counters are left alone so that its record stays right; the
        snapshot's peaks then include the part of that prompt before the reset.
        """
        with self._lock:
            self._reset_at = time.time()
            self._peak_rss, self._peak_cuda = 0, (0, 0)
            if self._running is None:
                reset_peak_rss()
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
        return self.snapshot()

    def _restart_peaks(self) -> None:
        """Fold the current peaks into the since-reset figures, then restart the counters for a prompt."""
        self._peak_rss = max(self._peak_rss, read_peak_rss())
        reset_peak_rss()
        if torch.cuda.is_available():
            current = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
            self._peak_cuda = (max(self._peak_cuda[0], current[0]), max(self._peak_cuda[1], current[1]))
            torch.cuda.reset_peak_memory_stats()

    def prompt_started(self, prompt_id: str, client_id: str | None = None) -> None:
        """A prompt starts (``client_id``: the websocket client that queued it, when it says)."""
        with self._lock:
            self._running_client = client_id
            self._restart_peaks()
            record = PromptRecord(
                prompt_id=prompt_id,
                status="running",
                started_at=time.time(),
                rss_start_bytes=read_rss(),
                nvml_used_start_bytes=self.nvml.memory_used(),
                energy_start_mj=self.nvml.energy_mj(),
                gpu_reason=cuda_reason() or self.nvml.reason,
            )
            self._records[prompt_id] = record
            self._records.move_to_end(prompt_id)
            while len(self._records) > self.max_records:
                self._records.popitem(last=False)
            self._running, self._running_since = prompt_id, time.perf_counter()

    def prompt_finished(self, prompt_id: str, status: str, error_type: str | None = None) -> None:
        with self._lock:
            record = self._records.get(prompt_id)
            if record is None:
                return
            record.finished_at = time.time()
            record.duration_s = time.perf_counter() - self._running_since
            record.status, record.error_type = status, error_type
            record.rss_end_bytes = read_rss()
            record.peak_rss_bytes = max(read_peak_rss(), record.rss_start_bytes, record.rss_end_bytes)
            if torch.cuda.is_available():
                record.cuda_max_allocated_bytes = torch.cuda.max_memory_allocated()
                record.cuda_max_reserved_bytes = torch.cuda.max_memory_reserved()
            record.nvml_used_end_bytes = self.nvml.memory_used()
            energy = self.nvml.energy_mj()
            if energy is not None and record.energy_start_mj is not None:
                record.energy_wh = (energy - record.energy_start_mj) / MILLIJOULES_PER_WH
            self._totals["finished"] += 1
            self._totals["errors"] += status == "error"
            self._running = None
        for listener in self.listeners:
            listener(record)

    def _running_record(self) -> PromptRecord | None:
        """The running prompt's record (the caller holds the lock)."""
        return self._records.get(self._running) if self._running else None

    def note_event(self, kind: str, data: dict[str, Any]) -> None:
        """Attach an event (e.g. a Free VRAM report) to the running prompt's record."""
        with self._lock:
            record = self._running_record()
            if record is not None:
                record.events.append({"kind": kind, "time": time.time(), **data})

    def count_event(self, kind: str, key: str, n: int = 1, **data: Any) -> int:
        """Count ``n`` occurrences of ``key`` (e.g. an attention fallback reason) in the running prompt's
        record: one event per kind and key, ``{"kind", "key", "calls", **data}``, its ``calls`` counted;
        returns that count (0: no prompt is running)."""
        with self._lock:
            record = self._running_record()
            if record is None:
                return 0
            for event in record.events:
                if event["kind"] == kind and event.get("key") == key:
                    event["calls"] += n
                    return int(event["calls"])
            record.events.append({"kind": kind, "time": time.time(), "key": key, "calls": n, **data})
            return n

    def running(self) -> tuple[str | None, str | None]:
        """The running prompt's id and the client that queued it (None, None between prompts)."""
        with self._lock:
            return (self._running, self._running_client) if self._running else (None, None)

    def record(self, prompt_id: str) -> dict[str, Any] | None:
        with self._lock:
            record = self._records.get(prompt_id)
            return record.as_dict() if record is not None else None

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.as_dict() for r in self._records.values()]

    def queue_depth(self) -> int | None:
        return None if self.queue is None else int(self.queue.get_tasks_remaining())

    def snapshot(self) -> dict[str, Any]:
        """Everything ``GET /leanvideo/telemetry`` answers (see ``routes``)."""
        with self._lock:
            peak_rss = max(self._peak_rss, read_peak_rss())
            peak_cuda = self._peak_cuda
            running, reset_at, totals = self._running, self._reset_at, dict(self._totals)
            count = len(self._records)
            last = next(reversed(self._records)) if self._records else None
        reason = cuda_reason()
        cuda: dict[str, Any] = {"available": reason is None, "reason": reason, "device": None}
        for key in ("allocated", "reserved", "max_allocated", "max_reserved"):
            cuda[f"{key}_bytes"] = None
        if reason is None:
            cuda.update(
                device=torch.cuda.get_device_name(),
                allocated_bytes=torch.cuda.memory_allocated(),
                reserved_bytes=torch.cuda.memory_reserved(),
                max_allocated_bytes=max(peak_cuda[0], torch.cuda.max_memory_allocated()),
                max_reserved_bytes=max(peak_cuda[1], torch.cuda.max_memory_reserved()),
            )
        energy = self.nvml.energy_mj()
        return {
            "schema": SCHEMA_VERSION,
            "time": time.time(),
            "since_reset": reset_at,
            "process": {"rss_bytes": (rss := read_rss()), "peak_rss_bytes": max(peak_rss, rss)},
            "cuda": cuda,
            "nvml": {
                "available": self.nvml.reason is None,
                "reason": self.nvml.reason,
                "memory_used_bytes": self.nvml.memory_used(),
                "energy_total_wh": None if energy is None else energy / MILLIJOULES_PER_WH,
            },
            "comfy": {"loaded_models": loaded_models(), "queue_depth": self.queue_depth()},
            "prompts": {"kept": count, "running": running, "last": last, **totals},
        }

    # --- hooking into the server ---------------------------------------------------------------------

    def attach(self, queue: Any) -> None:
        """Observe prompt start and end by wrapping ``queue.get`` and ``queue.task_done`` (see above)."""
        if getattr(queue, "_leanvideo_telemetry", None) is not None:
            raise RuntimeError(f"telemetry is already attached to {queue!r}")
        original_get, original_done = queue.get, queue.task_done
        running: dict[Any, str] = {}

        def get(*args: Any, **kwargs: Any) -> Any:
            got = original_get(*args, **kwargs)
            if got is not None:
                self._guard(self._on_start, got, running)
            return got

        def task_done(item_id: Any, *args: Any, **kwargs: Any) -> Any:
            result = original_done(item_id, *args, **kwargs)
            status = kwargs.get("status", args[1] if len(args) > 1 else None)
            prompt_id = running.pop(item_id, None)
            if prompt_id is not None:
                self._guard(lambda: self.prompt_finished(prompt_id, *outcome_of(status)))
            return result

        queue.get, queue.task_done = get, task_done
        queue._leanvideo_telemetry = self
        self.queue = queue

    def _on_start(self, got: Any, running: dict[Any, str]) -> None:
        item, item_id = got  # item: (number, prompt id, prompt, extra data, outputs to run, …)
        running[item_id] = str(item[1])
        extra = item[3] if len(item) > 3 and isinstance(item[3], dict) else {}
        client_id = extra.get("client_id")
        self.prompt_started(str(item[1]), client_id if isinstance(client_id, str) else None)
        for listener in self.starts:  # each is told the prompt (its nodes) as it starts
            self._guard(listener, str(item[1]), item[2] if isinstance(item[2], dict) else {})

    @staticmethod
    def _guard(function: Callable[..., None], *args: Any) -> None:
        # Telemetry must never break the prompt worker.
        try:
            function(*args)
        except Exception:
            logger.exception("LeanVideo telemetry failed; the prompt itself is unaffected")


def loaded_models() -> list[dict[str, Any]] | None:
    """ComfyUI's loaded-model list (None outside a ComfyUI process)."""
    try:
        from .memory_ops import describe_loaded_models

        return [asdict(m) for m in describe_loaded_models()]
    except ImportError:
        return None
