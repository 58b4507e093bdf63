"""Run records: one immutable, versioned JSON document per executed prompt (also failed or cancelled).

Schema ``leanvideo.run`` version 2 (top-level keys):

- ``schema``, ``version``, ``partial`` (true when the run was cancelled, timed out or lost)
- ``prompt_id``, ``status`` (success | error | interrupted | cancelled | timeout | lost | unreachable)
- ``error``: ``{node_id, class_type, exception_type, message}`` or null
- ``workflow``: ``{path, file_sha256, sha256}`` (the file as read; the canonical JSON actually submitted)
- ``overrides``: ``[{spec, node_id, input_name, value, previous}]``; ``seeds``: ``{"11.noise_seed": 7}``
- ``environment``: ComfyUI version and argv, torch, device, server python, node pack and runner versions
- ``timing``: submitted/started/finished (ISO), ``wall_s`` (client end to end), ``queue_s``,
  ``server_execution_s`` (the server's own execution window), ``overhead_s``, ``reconnects`` (websocket),
  ``retries`` (HTTP requests repeated after a cut),
  ``phases`` (seconds per phase)
- ``nodes``: ``[{node_id, class_type, seconds, cached, steps, step_seconds}]``
- ``telemetry``: the node pack's per-prompt figures, or ``{available: false, reason}``
- ``outputs``: ``[{node_id, kind, server_name, subfolder, type, path, bytes, sha256, video}]``

Example::

    record = build_run_record(result, workflow, workflow_path, server_info, files)
    write_run_record(record, out_dir / "run.json")
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from runner.errors import OutputWriteError
from runner.graph.workflow import Override
from runner.install.pin import sha256_file
from runner.tracking.outputs import OutputFile
from runner.tracking.result import PromptResult

RECORD_SCHEMA = "leanvideo.run"
RECORD_VERSION = 2

__all__ = [
    "RECORD_SCHEMA",
    "RECORD_VERSION",
    "build_run_record",
    "collect_server_info",
    "int8_kernels_measured",
    "runner_version",
    "workflow_digest",
    "write_run_record",
]


def int8_kernels_measured(telemetry: dict[str, Any]) -> int:
    """How many layer shapes the INT8 loaders' ``path=auto`` timed its kernels for during the prompt
    (first use on that server), from the prompt's telemetry: a run record's ``telemetry`` block."""
    events = telemetry.get("events") or []
    return sum(1 for e in events if e.get("kind") == "int8_kernel" and e.get("source") == "measured")


def unapplied_loras(telemetry: dict[str, Any]) -> list[str]:
    """What to say of the LoRA weights the prompt applied to nothing, one line per reason, from its
    telemetry (the node pack's ``lora_not_applied`` events: ComfyUI says them in its log only, and the
    frames are those without them)."""
    return [
        f"the server applied {e.get('calls', 1)} LoRA weight(s) to nothing: {e.get('key')}; the first: "
        f"{e.get('first')!r} (each is in the server's log; the frames are made without them)"
        for e in telemetry.get("events") or []
        if e.get("kind") == "lora_not_applied"
    ]


def workflow_digest(workflow: dict[str, Any]) -> str:
    """Hash of the workflow's canonical JSON (key order and whitespace do not matter)."""
    canonical = json.dumps(workflow, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def runner_version() -> str | None:
    try:
        return metadata.version("leanvideo")
    except metadata.PackageNotFoundError:
        return None


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def build_run_record(
    result: PromptResult,
    workflow: dict[str, Any],
    workflow_path: Path | None,
    server_info: dict[str, Any],
    files: list[OutputFile],
    *,
    overrides: list[Override] | None = None,
    seeds: dict[str, Any] | None = None,
    telemetry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the record of one prompt; see the module docstring for the schema."""
    read = workflow_path if workflow_path is not None and str(workflow_path) != "-" else None  # "-": stdin
    file_sha = sha256_file(read) if read is not None and read.is_file() else None
    return {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "partial": result.partial,
        "prompt_id": result.prompt_id,
        "status": result.status,
        "error": result.error,
        "workflow": {
            "path": str(workflow_path) if workflow_path else None,
            "file_sha256": file_sha,
            "sha256": workflow_digest(workflow),
        },
        "overrides": [asdict(o) for o in overrides or []],
        "seeds": seeds or {},
        "environment": {
            "host_python": platform.python_version(),
            "machine": platform.machine(),
            "runner_version": runner_version(),
            **server_info,
        },
        "timing": {
            "submitted_at": _iso(result.submitted_at),
            "started_at": _iso(result.started_at),
            "finished_at": _iso(result.finished_at),
            "wall_s": _round(result.wall_seconds),
            "queue_s": _round(result.queue_seconds),
            "server_execution_s": _round(result.server_seconds),
            "overhead_s": _round(result.overhead_seconds),
            "reconnects": result.reconnects,
            "retries": result.retries,
            "phases": result.phases,
        },
        "nodes": [asdict(node) for node in result.nodes],
        "telemetry": telemetry or {"available": False, "reason": "not requested"},
        "outputs": [f.to_json() for f in files],
    }


def write_run_record(record: dict[str, Any], path: Path) -> Path:
    """Write ``record`` as JSON; refuses to overwrite an existing file (records are immutable). Written
    beside it first and linked into place whole: a full disk leaves no half record to trip a reader.

    Raises:
        OutputWriteError: the record could not be written (the disk is full, the folder read-only).
        FileExistsError: ``path`` exists (it is never replaced).
    """
    text = json.dumps(record, indent=2) + "\n"
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text, encoding="utf-8")
        _link_into_place(partial, path)
    except FileExistsError:
        raise
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OutputWriteError(f"cannot write the run record {path} ({reason})") from exc
    finally:
        partial.unlink(missing_ok=True)
    return path


def _link_into_place(partial: Path, path: Path) -> None:
    try:
        os.link(partial, path)  # FileExistsError when a record is there: never replaced
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: check, then rename
        if path.exists():
            raise FileExistsError(f"{path} exists") from None
        os.replace(partial, path)


def collect_server_info(system_stats: dict[str, Any], pack_info: dict[str, Any] | None) -> dict[str, Any]:
    """The environment fields of a run record, from ``/system_stats`` and ``/leanvideo/info``."""
    system = system_stats.get("system", {})
    devices = system_stats.get("devices") or [{}]
    pack = pack_info or {}
    return {
        "comfyui_version": system.get("comfyui_version"),
        "comfyui_commit": (pack.get("pinned_comfyui") or {}).get("commit")
        if pack.get("matches_pin")
        else None,
        "comfyui_argv": system.get("argv"),
        "pytorch_version": system.get("pytorch_version"),
        "server_python": str(system.get("python_version", "")).split(" ")[0],
        "device": {
            "name": devices[0].get("name"),
            "type": devices[0].get("type"),
            "vram_total": devices[0].get("vram_total"),
        },
        "leanvideo_version": pack.get("version"),
    }
