"""Servers started with ``leanvideo serve --background``: found again from their records, and stopped.

:class:`runner.local.server.ComfyServer` writes ``server.json`` into a server's state folder when it
starts and removes it when it stops; a background server outlives the process that started it, so
``leanvideo stop`` finds it from that record (checking that the pid still is that ComfyUI) and stops
its process group.

Example::

    for record in find_running_servers(workspace.servers_dir):
        stop_background_server(record)
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil

from runner.local.process_group import terminate_process_group
from runner.local.server_record import RECORD_NAME

__all__ = ["find_running_servers", "stop_background_server"]


def find_running_servers(servers_dir: Path, *, owned: bool = False) -> list[dict[str, object]]:
    """Records of background servers started by ``leanvideo serve --background`` that still run (a
    server that belongs to a running command — ``serve`` in the foreground, ``run``, ``demo``, ``bench``,
    a ``ComfyServer`` in a script — is not one: stopping it would break that command). ``owned``: those
    servers instead."""
    found: list[dict[str, object]] = []
    for path in sorted(servers_dir.glob(f"*/{RECORD_NAME}")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        pid = int(record.get("pid") or 0)
        if not (pid > 0 and _is_comfyui_process(pid, int(record.get("port") or 0))):
            path.unlink(missing_ok=True)  # stale: the process is gone or the pid was reused
        elif record.get("background", True) != owned:  # records before 2026-12-01: serve's only
            record["record_path"] = str(path)
            found.append(record)
    return found


def _is_comfyui_process(pid: int, port: int) -> bool:
    try:
        args = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return any(a.endswith("main.py") for a in args) and str(port) in args


def stop_background_server(record: dict[str, object], timeout: float = 15.0) -> None:
    """Stop a server found by :func:`find_running_servers` (not a child of this process)."""
    pid = int(str(record["pid"]))

    def poll() -> int | None:
        return None if _pid_alive(pid) else 0

    def wait(grace: float) -> int:
        deadline = time.monotonic() + grace
        while _pid_alive(pid):
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {pid}", grace)
            time.sleep(0.1)
        return 0

    terminate_process_group(pid, timeout, poll, wait)
    Path(str(record["record_path"])).unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
