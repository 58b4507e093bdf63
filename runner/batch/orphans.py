"""Prompts a dead worker left on the servers, taken off before their jobs run again.

An attempt notes its prompt (batch, job, prompt id, server) in its private folder under
``<out>/.partial/`` before it submits it (:func:`note_prompt`); the note is dropped before the folder
becomes the job's (:func:`drop_note`), and goes with the folder when the attempt fails. A worker killed
in the middle of a job (SIGKILL, a power cut) leaves both the folder and, on its server, the prompt,
which would keep that GPU busy for a result nobody records while the job runs again. So before a job's
attempt, :func:`take_off_orphans` cancels each prompt noted for that job (queue delete, then interrupt;
best effort) and removes its folder. :func:`cancel_left_prompts` takes off the prompts a worker that
stops early (``--grace`` ran out) leaves running. ``headers_for`` says what each server is sent (a
worker's ``--token`` and ``--header`` go to its own servers only: see
:meth:`~runner.batch.pool.ServerPool.headers_for`).

Example::

    take_off_orphans(job, Path(job["out_dir"]) / ".partial")  # [{"prompt_id": "5f0c…", "server": …}]
"""

from __future__ import annotations

import glob
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runner.errors import ServerError
from runner.transport.client import ComfyClient
from runner.transport.retry import RetryPolicy

logger = logging.getLogger(__name__)

NOTE = ".prompt.json"
CANCEL_TIMEOUT_S = 5.0  # per request: a dead server must not hold the job up
GONE = "no longer on the server (it finished, or the server restarted); nothing to take off"

HeadersFor = Callable[[str], Mapping[str, str]]  # a server URL -> the headers its requests carry


def no_headers(server: str) -> Mapping[str, str]:
    """No header for any server: none behind an authenticating proxy."""
    return {}


def note_prompt(partial: Path, job: dict[str, Any], prompt_id: str, server: str) -> None:
    """Note in ``partial`` (an attempt's folder) the prompt it is about to submit."""
    note = {"batch": job["batch"], "job_id": job["job_id"], "prompt_id": prompt_id, "server": server}
    (partial / NOTE).write_text(json.dumps(note), encoding="utf-8")


def drop_note(partial: Path) -> None:
    """Remove the note before ``partial`` becomes the job's folder: the prompt is done."""
    (partial / NOTE).unlink(missing_ok=True)


def take_off_orphans(
    job: dict[str, Any],
    partial_root: Path,
    *,
    keep_folders: bool = False,
    why: str = "a worker killed mid-job",
    headers_for: HeadersFor = no_headers,
    left: list[dict[str, str]] | None = None,
) -> list[dict[str, str]]:
    """Cancel the prompts earlier attempts of ``job`` noted in ``partial_root`` and left behind, and
    remove their folders (unless ``keep_folders``: a live worker may still be writing there; then only
    the note of a prompt no longer on its server goes, so it is not asked of again); returns each such
    attempt's ``{"prompt_id", "server"}``, and adds those that could not be taken off to ``left``. A note
    of another batch's job of the same id (one ``--out`` for two batches) is left alone."""
    taken = []
    for folder in sorted(partial_root.glob(f"{glob.escape(str(job['job_id']))}-*")):
        note = read_json_object(folder / NOTE)
        if note is None or (note.get("batch"), note.get("job_id")) != (job["batch"], job["job_id"]):
            continue
        prompt_id, server = str(note.get("prompt_id")), str(note.get("server"))
        said, off = _take_off(server, prompt_id, headers_for)
        logger.warning(
            "job %s: prompt %s on %s, of an attempt that did not finish (%s): %s",
            job["job_id"],
            prompt_id,
            server,
            why,
            said,
        )
        if not keep_folders:
            shutil.rmtree(folder, ignore_errors=True)
        elif off:
            drop_note(folder)
        if not off and left is not None:
            left.append({"job_id": str(job["job_id"]), "prompt_id": prompt_id, "server": server})
        taken.append({"prompt_id": prompt_id, "server": server})
    return taken


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a note, a job's ``result.json``); None when there is none: missing,
    unreadable, half-written, or not an object."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _quick_client(server: str, headers_for: HeadersFor) -> ComfyClient:
    """A client for cancel requests: a dead or paused server must not hold a job or a stop up."""
    return ComfyClient(
        server, http_timeout=CANCEL_TIMEOUT_S, retry=RetryPolicy(retries=0), headers=headers_for(server)
    )


def _take_off(server: str, prompt_id: str, headers_for: HeadersFor) -> tuple[str, bool]:
    """Cancel ``prompt_id`` on ``server`` if it is still there: what happened, for the log, and whether
    the prompt is off the server now."""
    try:
        with _quick_client(server, headers_for) as client:
            if not client.is_queued(prompt_id):
                return GONE, True
            if client.cancel(prompt_id):
                return "taken off the server (queue delete + interrupt)", True
    except Exception as exc:  # a bad note or a gone server must not stop the job from running again
        if isinstance(exc, ServerError) and exc.status is not None:  # it answered, refusing (a 401)
            return f"could not be taken off ({exc}): it may run on", False
        logger.debug("cancelling %s on %s failed", prompt_id, server, exc_info=True)
    return "could not be taken off (the server did not answer): it may run on", False


def cancel_left_prompts(
    in_flight: dict[str, str], worker_id: str, headers_for: HeadersFor = no_headers
) -> None:
    """Take the prompts of jobs still running when the worker stopped (``--grace`` ran out) off their
    servers: DBOS is shut down, so their jobs stay unfinished and go back on the queue, and a prompt
    left running would only keep its server busy for nothing. Best effort, prompt by prompt."""
    for prompt_id, server in in_flight.items():  # one server's trouble leaves the others' prompts
        logger.warning(
            "prompt %s on %s: %s; its job goes back on the queue (worker %s stopped)",
            prompt_id,
            server,
            _take_off(server, prompt_id, headers_for)[0],  # a prompt that ended as it stopped: said so
            worker_id,
        )
