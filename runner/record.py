"""Run records: one immutable, versioned JSON document per executed prompt.

A record carries what ran (workflow hash), where (ComfyUI and torch versions, device, pack version),
how long each node took, and which files came out, with their hashes.

Example::

    record = build_run_record(result, workflow, workflow_path, server_info, files)
    write_run_record(record, out_dir / "run.json")
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runner.client import PromptResult

RECORD_SCHEMA = "leanvideo.run"
RECORD_VERSION = 1


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def workflow_digest(workflow: dict[str, Any]) -> str:
    """Hash of the workflow's canonical JSON (key order and whitespace do not matter)."""
    canonical = json.dumps(workflow, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat()


def build_run_record(
    result: PromptResult,
    workflow: dict[str, Any],
    workflow_path: Path | None,
    server_info: dict[str, Any],
    files: list[tuple[str, Path]],
) -> dict[str, Any]:
    """Assemble the record of one prompt; ``files`` pairs each downloaded file with its node id."""
    return {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "prompt_id": result.prompt_id,
        "status": result.status,
        "workflow": {
            "path": str(workflow_path) if workflow_path else None,
            "sha256": workflow_digest(workflow),
        },
        "environment": {
            "host_python": platform.python_version(),
            "machine": platform.machine(),
            **server_info,
        },
        "timing": {
            "submitted_at": _iso(result.submitted_at),
            "started_at": _iso(result.started_at),
            "finished_at": _iso(result.finished_at),
            "wall_s": round(result.wall_seconds, 4),
            "queue_s": round(result.queue_seconds, 4),
        },
        "nodes": [asdict(node) for node in result.nodes],
        "outputs": [
            {"node_id": node_id, "path": str(path), "bytes": path.stat().st_size, "sha256": sha256_file(path)}
            for node_id, path in files
        ],
    }


def write_run_record(record: dict[str, Any], path: Path) -> Path:
    """Write ``record`` as JSON; refuses to overwrite an existing file (records are immutable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2)
        handle.write("\n")
    return path


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
        "pytorch_version": system.get("pytorch_version"),
        "server_python": str(system.get("python_version", "")).split(" ")[0],
        "device": {"name": devices[0].get("name"), "type": devices[0].get("type")},
        "leanvideo_version": pack.get("version"),
    }
