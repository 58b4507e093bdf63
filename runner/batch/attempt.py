"""One attempt at one job on one server, and the job's folder of results, written exactly once.

An attempt submits the job's prompt, follows it (:func:`runner.tracking.prompt.run_prompt`),
downloads every output into a private folder under ``<out>/.partial/`` and writes ``result.json``
there, then renames that folder to ``<out>/<job id>``. The rename is atomic and never replaces a
folder that exists, so a job has one set of files whatever runs twice: when ``<out>/<job id>/
result.json`` already exists (an earlier run finished but died before the queue recorded it), the
attempt returns that record and runs nothing. Before it submits, it notes the prompt in its folder and
takes off the servers any prompt of this job that a worker killed mid-job left (:mod:`.orphans`).

What went wrong decides what happens next (``fault`` in the outcome):

============  =========================================================  ==========================
fault         cause                                                      the job
============  =========================================================  ==========================
``workflow``  the server rejected the prompt, or a node raised           fails: node id + message
``timeout``   the prompt ran past the job's timeout (it was interrupted)  fails
``server``    no answer for the health timeout, prompt lost, HTTP error   retried on another server
``output``    ``<out>/<job id>`` holds something else (another batch's)   fails, nothing is touched
============  =========================================================  ==========================

Example::

    outcome = run_attempt(job, "http://127.0.0.1:8188", worker="gpu-box-1", attempt=1)
    print(outcome["status"], outcome["files"])
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runner.batch.orphans import (
    HeadersFor,
    drop_note,
    no_headers,
    note_prompt,
    read_json_object,
    take_off_orphans,
)
from runner.errors import (
    LeanVideoError,
    OutputWriteError,
    PromptCancelledError,
    PromptFailedError,
    PromptTimeoutError,
    ServerError,
    WorkflowError,
)
from runner.tracking.events import ClientEvent
from runner.tracking.outputs import download_outputs
from runner.tracking.prompt import run_prompt
from runner.tracking.record import unapplied_loras
from runner.transport.client import ComfyClient

logger = logging.getLogger(__name__)

RESULT_NAME = "result.json"
CANCEL_CHECK_S = 1.0  # how often a running job asks the queue whether it was cancelled
PARTIAL_DIR = ".partial"
RESULT_VERSION = 2  # 2: the job spec's digest, so a folder is known to be this job's
_REJECTED_NODE = re.compile(r"node (\S+) \(([^)]*)\)")


def job_dir(job: dict[str, Any]) -> Path:
    """Where the job's files and ``result.json`` end up."""
    return Path(str(job["out_dir"])) / str(job["job_id"])


def finished_record(job: dict[str, Any]) -> dict[str, Any] | None:
    """The record of this job when its folder is already in place (an earlier run of it finished),
    else ``None``; a folder that holds anything else is :func:`occupant_problem`'s."""
    return inspect_folder(job)[0]


def occupant_problem(job: dict[str, Any]) -> str | None:
    """Why the job's folder cannot become its own (it holds another batch's or job's results, or files
    of the user's), or ``None`` when it does not exist or holds this job's finished results."""
    return inspect_folder(job)[1]


def inspect_folder(job: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """``(this job's finished record, why the folder is not the job's)`` from one look at
    ``<out>/<job id>``: at most one of them is set; neither when the folder does not exist."""
    folder = job_dir(job)
    if not folder.exists():
        return None, None
    record = read_json_object(folder / RESULT_NAME)
    if record is None:
        return None, f"{folder} already exists and holds no result of this job; nothing in it is touched"
    if _is_this_jobs(record, job):
        return record, None
    differs = [
        f"{what} {record.get(key)!r}"
        for key, what in (("batch", "batch"), ("job_id", "job"))
        if record.get(key) != job[key]
    ] or ["other settings"]  # same batch and id: its spec (workflow, overrides) differs
    return None, (
        f"{folder} holds the results of another job ({', '.join(differs)}); choose another --out or "
        "other job ids"
    )


def _is_this_jobs(record: dict[str, Any], job: dict[str, Any]) -> bool:
    """Same batch and job, and — for records that carry it (version 2 on) — the same job spec."""
    same = record.get("batch") == job["batch"] and record.get("job_id") == job["job_id"]
    return same and record.get("digest", job.get("digest")) == job.get("digest")


def output_fault(
    job: dict[str, Any], *, server: str | None, worker: str, attempt: int, message: str
) -> dict[str, Any]:
    """The outcome of an attempt that cannot put its files in place (not retried: it would not help)."""
    base = {"job_id": job["job_id"], "server": server, "worker": worker, "attempt": attempt}
    return _failed(base, "output", {"node_id": None, "class_type": None, "message": message})


def _failed(
    base: dict[str, Any],
    fault: str,
    error: dict[str, Any],
    prompt_id: str | None = None,
    seconds: float = 0.0,
) -> dict[str, Any]:
    """A failed attempt's outcome: ``base`` (job, server, worker, attempt), its fault and error."""
    return {**base, "status": "failed", "fault": fault, "error": error, "prompt_id": prompt_id,
            "seconds": seconds, "files": []}  # fmt: skip


class InFlight:
    """The prompts a worker's attempts have out on servers (``{prompt id: server}``). :meth:`close`
    hands them over when the worker stops early; from then on no attempt submits another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prompts: dict[str, str] = {}
        self.closed = False

    def add(self, prompt_id: str, server: str) -> bool:
        """Note a prompt about to be submitted; ``False`` (submit nothing) once closed."""
        with self._lock:
            if not self.closed:
                self._prompts[prompt_id] = server
            return not self.closed

    def discard(self, prompt_id: str) -> None:
        with self._lock:
            self._prompts.pop(prompt_id, None)

    def close(self) -> dict[str, str]:
        """Refuse further prompts; the ones still out, to be taken off their servers."""
        with self._lock:
            self.closed = True
            return dict(self._prompts)

    def __len__(self) -> int:
        with self._lock:
            return len(self._prompts)


def run_attempt(
    job: dict[str, Any],
    server: str,
    *,
    worker: str,
    attempt: int,
    cancelled: Callable[[], bool] | None = None,
    in_flight: InFlight | None = None,
    lost: list[dict[str, str]] | None = None,
    headers_for: HeadersFor = no_headers,
) -> dict[str, Any]:
    """Run ``job`` (a queued job spec) on ``server``; the outcome as the module docstring says.
    ``cancelled`` is asked (at most every :data:`CANCEL_CHECK_S`, as the prompt's events arrive)
    whether the job was cancelled: then the prompt is interrupted on the server and nothing is kept.
    ``in_flight`` holds the prompt while it is submitted or running; once it is closed (the worker is
    stopping) nothing is submitted and the prompt it still holds interrupts itself at its next event.

    ``lost``: what :func:`take_off_orphans` returned for the job, when the caller took a dead worker's
    prompts off already (before waiting for a server); None: it is done here. ``headers_for``: what
    each server's requests carry (the worker's ``--token`` and ``--header``, never in the job).

    Never raises for what the server or the workflow did: that is in the outcome's ``fault``.
    """
    began = time.monotonic()
    # A dead worker's prompt of this job must not run on beside it. It ran, so it counts as an attempt
    # (the outcome's "lost" lists it, and this attempt's number comes after it).
    if lost is None:
        lost = take_off_orphans(job, Path(job["out_dir"]) / PARTIAL_DIR, headers_for=headers_for)
    base = {"job_id": job["job_id"], "server": server, "worker": worker, "attempt": attempt + len(lost)}
    outcome = _attempt(job, server, base, began, cancelled, in_flight, headers_for(server))
    return {**outcome, "lost": lost} if lost else outcome


def _attempt(
    job: dict[str, Any],
    server: str,
    base: dict[str, Any],
    began: float,
    cancelled: Callable[[], bool] | None,
    in_flight: InFlight | None,
    headers: Mapping[str, str],
) -> dict[str, Any]:
    """:func:`run_attempt` once the orphans are off: the prompt, its files, the job's folder."""
    prompt_id = str(uuid.uuid4())
    if _was_cancelled(cancelled):  # cancelled while it waited for a server: nothing goes to it
        logger.info("job %s: cancelled before it was sent to %s", job["job_id"], server)
        error = {"node_id": None, "class_type": None, "message": "cancelled before it was sent to a server"}
        return _failed(base, "cancelled", error)
    partial = Path(job["out_dir"]) / PARTIAL_DIR / f"{job['job_id']}-{prompt_id[:8]}"
    deadline = began + float(job["timeout"])
    try:  # before the prompt: an unusable --out costs no GPU time
        partial.mkdir(parents=True)
        note_prompt(partial, job, prompt_id, server)
    except OSError as exc:
        message = f"--out {job['out_dir']}: cannot make {partial} ({exc.strerror or type(exc).__name__})"
        logger.warning("job %s: output fault: %s", job["job_id"], message)
        return _failed(base, "output", {"node_id": None, "class_type": None, "message": message})
    if in_flight is not None and not in_flight.add(prompt_id, server):  # never recorded: DBOS is down
        shutil.rmtree(partial, ignore_errors=True)
        return _failed(
            base, "server", {"node_id": None, "class_type": None, "message": "the worker is stopping"}
        )
    stop = cancelled if in_flight is None else lambda: in_flight.closed or bool(cancelled and cancelled())
    where = (job["job_id"], server)
    try:
        client = ComfyClient(
            server, reconnect_timeout=float(job["health_timeout"]), deadline=deadline, headers=headers
        )
        with client:
            try:
                result = run_prompt(
                    client,
                    job["prompt"],
                    timeout=float(job["timeout"]),
                    prompt_id=prompt_id,
                    on_event=None if stop is None else _stop_when(stop),
                )
            finally:  # out of the server's hands: nothing to take off it any more
                if in_flight is not None:
                    in_flight.discard(prompt_id)
            files = download_outputs(client, result.outputs, partial)
            warnings = unapplied_loras(client.read_telemetry(prompt_id))  # said in comfyui.log only
    except LeanVideoError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        fault, error = _classify(exc)
        if fault != "cancelled" and _was_cancelled(cancelled):  # `batch cancel` elsewhere took the prompt
            fault = "cancelled"  # off the server, which said "interrupted": no one's fault
        if in_flight is not None and in_flight.closed:  # the worker stopped and took the prompt off
            logger.info("job %s on %s: stopped with the worker; it runs again with that worker id", *where)
        else:
            what = fault if fault == "cancelled" else f"{fault} fault"
            say = logger.info if fault == "cancelled" else logger.warning
            say("job %s on %s: %s: %s", *where, what, error["message"])
        return _failed(base, fault, error, prompt_id, round(time.monotonic() - began, 3))
    final = job_dir(job)
    record = {
        "version": RESULT_VERSION,
        **base,
        "batch": job["batch"],
        "digest": job.get("digest"),
        "status": "success",
        "fault": None,
        "error": None,
        "prompt_id": prompt_id,
        "seconds": round(time.monotonic() - began, 3),
        "server_seconds": result.server_seconds,
        "overrides": list(job["overrides"]),
        "warnings": warnings,  # what the server did not do and said in its log only (a LoRA left out)
        "files": [
            {
                "name": f.path.name,
                "path": str(final / f.path.name),
                "node_id": f.node_id,
                "bytes": f.bytes,
                "sha256": f.sha256,
            }
            for f in files
        ],
    }
    for said in warnings:
        logger.warning("job %s on %s: %s", *where, said)
    (partial / RESULT_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    drop_note(partial)
    return _publish(job, partial, record)


def _was_cancelled(cancelled: Callable[[], bool] | None) -> bool:
    """Whether the job was cancelled, by ``cancelled()``; False when it cannot tell (DBOS down)."""
    try:
        return cancelled is not None and cancelled()
    except Exception:  # the database cannot say: the fault stays as the server gave it
        return False


def _stop_when(cancelled: Callable[[], bool]) -> Callable[[ClientEvent], None]:
    """An event handler that stops the prompt the way Ctrl-C does once ``cancelled()`` says so."""
    last = [0.0]

    def check(event: ClientEvent) -> None:
        now = time.monotonic()
        if now - last[0] >= CANCEL_CHECK_S:
            last[0] = now
            if cancelled():
                raise KeyboardInterrupt  # run_prompt interrupts the prompt on the server

    return check


def _publish(job: dict[str, Any], partial: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Rename the finished folder into place, unless another run of the job got there first (its
    record is kept) or something else took the folder (this run's files stay in ``partial``)."""
    final = job_dir(job)
    try:
        os.rename(partial, final)  # fails on a non-empty target: a job's folder is never replaced
    except OSError:
        kept, problem = inspect_folder(job)
        if kept is None:  # the prompt ran: its id, time and files (where they stay) are the record's
            problem = problem or f"cannot rename {partial} to {final}"
            fault = output_fault(
                job,
                server=record["server"],
                worker=record["worker"],
                attempt=record["attempt"],
                message=f"{problem}; this run's files are in {partial}",
            )
            files = [{**f, "path": str(partial / f["name"])} for f in record.get("files", [])]
            outcome = {**record, **fault, "prompt_id": record["prompt_id"], "files": files}
            outcome["seconds"] = record.get("seconds", 0.0)
            with contextlib.suppress(OSError):  # its result.json said success, naming files not there
                (partial / RESULT_NAME).write_text(json.dumps(outcome, indent=2) + "\n", encoding="utf-8")
            return outcome
        logger.warning("job %s already has its results in %s; discarding this run's", record["job_id"], final)
        shutil.rmtree(partial, ignore_errors=True)
        return kept
    return record


def _classify(exc: LeanVideoError) -> tuple[str, dict[str, Any]]:
    """``(fault, error)`` for an attempt that raised ``exc``."""
    message = str(exc)
    running = {"node_id": _error_field(exc, "node_id"), "class_type": _error_field(exc, "class_type")}
    if isinstance(exc, PromptCancelledError):  # batch cancel, or the worker is stopping: no one's fault
        return "cancelled", {**running, "message": message}
    if isinstance(exc, PromptTimeoutError):
        return "timeout", {**running, "message": message}
    if isinstance(exc, PromptFailedError):
        return "workflow", {
            "node_id": _error_field(exc, "node_id"),
            "class_type": _error_field(exc, "class_type"),
            "message": str(_error_field(exc, "message") or message),
        }
    if isinstance(exc, WorkflowError):  # rejected by the server's validation
        found = _REJECTED_NODE.search(message)
        return "workflow", {
            "node_id": found[1] if found else None,
            "class_type": found[2] if found else None,
            "message": message,
        }
    if isinstance(exc, ServerError):  # lost mid-prompt: the node that was running, when one was
        return "server", {**running, "message": message}
    if isinstance(exc, OutputWriteError):  # the disk filled up: `batch retry --failed` once there is room
        return "output", {"node_id": None, "class_type": None, "message": message}
    return "workflow", {"node_id": None, "class_type": None, "message": message}


def _error_field(exc: LeanVideoError, name: str) -> Any:
    error = getattr(exc.result, "error", None)
    return error.get(name) if isinstance(error, dict) else None
