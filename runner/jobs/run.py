"""Run one workflow file on a ComfyUI server, end to end: what ``leanvideo run`` does.

Load the API-format workflow, apply the ``--set`` overrides (type-checked against ``/object_info``),
validate it, submit and follow it, download and hash every output into a folder of its own, read the
node pack's telemetry when the server has it, and write the run record (``run.json``) beside the
files. When the prompt fails, times out, is cancelled (Ctrl-C) or is lost, a partial record is still
written and the raised error carries its path in ``record_path``.

Example::

    options = RunOptions(overrides=("11.noise_seed=7",))
    outcome = run_workflow(Path("workflows/ltxv_tiny_t2v.api.json"), options)
    print(outcome.record_path, outcome.result.server_seconds)
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.errors import (
    LeanVideoError,
    OutputWriteError,
    PromptCancelledError,
    ServerError,
    UsageError,
    WorkflowError,
)
from runner.graph.convert import CutLinks, as_api_workflow, check_workflow_document
from runner.graph.editor_nodes import editor_only_hints
from runner.graph.validate import validate_workflow
from runner.graph.workflow import Override, apply_overrides, find_seeds, is_ui_workflow
from runner.graph.workflow_file import read_json_file
from runner.local.out_folder import check_out_folder, remove_empty_folders
from runner.tracking.follow import EventHandler
from runner.tracking.outputs import OutputFile, download_outputs
from runner.tracking.prompt import run_prompt
from runner.tracking.record import (
    build_run_record,
    collect_server_info,
    unapplied_loras,
    write_run_record,
)
from runner.tracking.result import PromptResult
from runner.transport.client import DEFAULT_SERVER, ComfyClient
from runner.transport.retry import DEFAULT_RETRIES, RetryPolicy
from runner.transport.server_url import check_server_url

logger = logging.getLogger(__name__)

RECORD_NAME = "run.json"


@dataclass(frozen=True)
class RunOptions:
    """How to run a workflow: which server, what to change, where the files go, how long to wait."""

    server: str = DEFAULT_SERVER
    out_dir: Path = Path("leanvideo-out")
    overrides: tuple[str, ...] = ()
    timeout: float = 1800.0
    headers: tuple[tuple[str, str], ...] = ()
    token: str | None = None
    validate: bool = True
    reconnect_timeout: float = 60.0
    retries: int = DEFAULT_RETRIES  # per request the network cuts; all of it within ``timeout``
    # overrides the file already carries, applied by whoever wrote it (a bench's variant workflow), with
    # the values they replaced there: recorded ahead of ``overrides``, not applied again
    prior_overrides: tuple[Override, ...] = ()

    def __post_init__(self) -> None:
        if not math.isfinite(self.timeout) or self.timeout <= 0:
            raise UsageError(f"timeout must be a positive number of seconds, got {self.timeout}")
        if self.retries < 0:
            raise UsageError(f"retries must be ≥ 0, got {self.retries}")
        check_server_url(self.server)

    def make_client(self, deadline: float | None = None) -> ComfyClient:
        """A client with these options; ``deadline`` (``time.monotonic()``): no retry starts after it."""
        return ComfyClient(
            self.server,
            headers=dict(self.headers),
            token=self.token,
            reconnect_timeout=min(self.reconnect_timeout, self.timeout),
            retry=RetryPolicy(retries=self.retries),
            deadline=deadline,
        )


@dataclass(frozen=True)
class RunOutcome:
    """The finished run: its record (as written), where it is, the prompt result and the files."""

    record: dict[str, Any]
    record_path: Path
    result: PromptResult
    files: list[OutputFile] = field(default_factory=list)


def collect_environment(client: ComfyClient) -> dict[str, Any]:
    """Environment fields from ``/system_stats`` and, when the pack is loaded, ``/leanvideo/info``, and
    the server's URL as given (the run record says which server ran it)."""
    try:
        pack_info = client.get_json("/leanvideo/info")
    except ServerError:
        pack_info = None
    return {"server_url": client.base_url, **collect_server_info(client.get_json("/system_stats"), pack_info)}


def prepare_workflow(
    path: Path, client: ComfyClient, overrides: tuple[str, ...], *, validate: bool = True
) -> tuple[dict[str, Any], list[Override]]:
    """The workflow (an editor file converted as the editor would submit it) with overrides applied,
    validated against the server's ``/object_info``.

    Raises:
        WorkflowError: unreadable file, bad override, or validation errors (each naming its node).
    """
    document = read_json_file(path)  # a missing or broken file is said before the server is asked
    check_workflow_document(document, path)
    object_info = client.get_json("/object_info")
    cut: CutLinks = {}
    workflow = as_api_workflow(document, path, object_info, cut)
    hints = editor_only_hints(document) if overrides and is_ui_workflow(document) else None  # for --set only
    applied = apply_overrides(workflow, list(overrides), object_info, hints)
    if validate:
        errors = [p for p in validate_workflow(workflow, object_info, cut) if p.kind == "error"]
        if errors:
            lines = "\n".join(f"  {problem}" for problem in errors)
            raise WorkflowError(f"workflow {path} does not validate against {client.base_url}:\n{lines}")
    return workflow, applied


def run_workflow(path: Path, options: RunOptions, on_event: EventHandler | None = None) -> RunOutcome:
    """Run ``path`` as the module docstring says; ``on_event`` sees every :class:`ClientEvent`.

    Raises:
        WorkflowError, ServerError, PromptFailedError (and subclasses): see :mod:`runner.errors`; when a
        prompt was submitted, the error's ``record_path`` names the partial run record.
    """
    deadline = time.monotonic() + options.timeout  # --timeout bounds the whole run, retries included
    with options.make_client(deadline) as client:
        workflow, applied = prepare_workflow(path, client, options.overrides, validate=options.validate)
        applied = [*options.prior_overrides, *applied]  # for the record
        environment = collect_environment(client)
        prompt_id = str(uuid.uuid4())
        # A folder per run, made before the prompt is submitted (a bad --out costs no GPU time):
        # outputs never collide.
        run_dir = options.out_dir / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{prompt_id[:8]}"
        made = [run_dir, *(folder for folder in run_dir.parents if not folder.exists())]
        make_run_dir(run_dir)
        try:
            result = run_prompt(
                client,
                workflow,
                timeout=options.timeout,
                deadline=deadline,
                on_event=on_event,
                prompt_id=prompt_id,
            )
        except LeanVideoError as exc:
            if isinstance(exc.result, PromptResult):
                if exc.result.error is None:
                    exc.result.error = {
                        "node_id": None,
                        "class_type": None,
                        "exception_type": type(exc).__name__,
                        "message": str(exc),
                    }
                written = (client, exc.result, workflow, path, environment, applied, run_dir)
                try:
                    exc.record_path = _write(*written)[0]
                except OutputWriteError as unwritten:  # the disk is full: the prompt's own failure says more
                    logger.warning("no partial run record: %s", unwritten)
            else:  # never queued (the server rejected it, or was not reached): no run, no folders
                remove_empty_folders(made)
            raise
        except BaseException:  # the caller's event handler raised: its prompt was cancelled, no record
            remove_empty_folders(made)
            raise
        record_path, record, files = _write(client, result, workflow, path, environment, applied, run_dir)
    return RunOutcome(record=record, record_path=record_path, result=result, files=files)


def make_run_dir(run_dir: Path) -> None:
    """Create the new folder ``run_dir`` (parents as needed) in the ``--out`` folder.

    Raises:
        UsageError: ``--out`` is a file, not writable, or the folder already exists.
    """
    check_out_folder(run_dir.parent, create=False)
    try:
        run_dir.mkdir(parents=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(
            f"--out {run_dir.parent}: cannot make the run folder {run_dir.name} there ({reason})"
        ) from exc


def _write(
    client: ComfyClient,
    result: PromptResult,
    workflow: dict[str, Any],
    path: Path,
    environment: dict[str, Any],
    applied: list[Override],
    run_dir: Path,
) -> tuple[Path, dict[str, Any], list[OutputFile]]:
    """Download the outputs and write the record; on a failed prompt, whatever can be had. A download
    of a finished prompt's outputs that fails (the server gone or paused, a full disk) or is stopped
    (Ctrl-C, SIGTERM) still writes a partial record, of the files it got, before the error goes on."""
    files: list[OutputFile] = []
    telemetry: dict[str, Any] = {"available": False, "reason": f"prompt {result.status}"}
    failure: LeanVideoError | None = None  # why a finished prompt's outputs did not all arrive
    cause: KeyboardInterrupt | None = None  # what stopped the download, when that was a signal
    try:
        telemetry = client.read_telemetry(result.prompt_id)
        for said in unapplied_loras(telemetry):  # a LoRA of another model: the prompt still succeeds
            logger.warning("%s", said)
        download_outputs(client, result.outputs, run_dir, done=files)
    except ServerError as exc:
        if result.status == "success":
            failure = exc
        else:
            logger.warning("partial run %s: could not fetch outputs: %s", result.prompt_id, exc)
    except OutputWriteError as unwritten:  # a full disk: the file and where the server keeps it named
        if result.status != "success":  # a failed prompt's record keeps its own error (the caller's)
            raise
        failure = unwritten
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM mid-download
        if result.status != "success":
            raise
        failure, cause = (
            PromptCancelledError(
                f"prompt {result.prompt_id} finished on the server; the download of its outputs was stopped"
            ),
            stop,
        )
    if failure is not None:
        result.partial = True
        result.error = {
            "node_id": None,
            "class_type": None,
            "exception_type": type(failure).__name__,
            "message": f"outputs not all downloaded ({len(files)} were): {failure}",
        }
    result.retries = client.retries_made
    record = build_run_record(
        result,
        workflow,
        path,
        environment,
        files,
        overrides=applied,
        seeds=find_seeds(workflow),
        telemetry=telemetry,
    )
    if failure is None:
        return write_run_record(record, run_dir / RECORD_NAME), record, files
    try:
        failure.record_path = write_run_record(record, run_dir / RECORD_NAME)
    except OutputWriteError as unwritten:  # the disk is full: the failure itself says more
        logger.warning("no partial run record: %s", unwritten)
    failure.result = result
    if cause is not None:
        raise failure from cause
    raise failure
