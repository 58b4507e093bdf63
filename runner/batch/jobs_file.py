"""Read a batch's jobs file (JSONL or CSV) and check every job before anything is queued.

One job per line. JSONL::

    {"id": "fox-7", "workflow": "ltxv_tiny_t2v.api.json", "set": {"Sample.noise_seed": 7}, "priority": 2}

CSV (a header row; ``set:`` columns are overrides, an empty cell leaves that input alone)::

    id,workflow,set:Sample.noise_seed,set:Positive Prompt.text,priority
    fox-7,ltxv_tiny_t2v.api.json,7,a red fox,2

``id`` is optional (default: the line number), ``workflow`` is an API-format file (relative paths are
read from the jobs file's folder), overrides use the ``--set`` syntax of ``leanvideo run``
(``NODE.input`` → value, NODE an id, title or unique class) and ``priority`` (optional, 1 … 2³¹−1)
orders the queue: lower runs first, a job without one before all of them.

Checking happens in two passes, and each reports *every* problem with its line and field:
:func:`read_jobs_file` (bad JSON or CSV, unknown field, bad or duplicate id, bad priority, missing or
malformed workflow file) and :func:`prepare_jobs` (overrides and the whole workflow against a server's
``/object_info``: unknown node or input, value out of range, missing model).

Example::

    path = Path("benchmarks/batch_jobs.jsonl")
    lines = read_jobs_file(path)
    jobs = prepare_jobs(path, lines, client.get_json("/object_info"))
"""

from __future__ import annotations

import copy
import csv
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from runner.errors import ServerError, WorkflowError
from runner.graph.validate import validate_workflow
from runner.graph.workflow import (
    ObjectInfo,
    Workflow,
    apply_overrides,
    is_ui_workflow,
    load_workflow,
)
from runner.graph.workflow_file import refuse_duplicate_keys
from runner.transport.client import ComfyClient
from runner.transport.retry import RetryPolicy

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
FIELDS = ("id", "workflow", "set", "priority")
SET_COLUMN = "set:"
MAX_PRIORITY = 2**31 - 1
MAX_LISTED = 40  # problems listed in one error; the count says how many more
_Workflows = dict[Path, "Workflow | WorkflowError"]  # each workflow file of a batch, read once


@dataclass(frozen=True)
class JobLine:
    """One job as the file states it."""

    line: int
    job_id: str
    workflow: Path
    overrides: tuple[str, ...]
    priority: int | None = None


@dataclass(frozen=True)
class PreparedJob(JobLine):
    """A job ready to queue: the line's fields and its API prompt with the overrides applied and checked."""

    prompt: Workflow = field(kw_only=True)


def read_jobs_file(path: Path) -> list[JobLine]:
    """Every job of ``path`` (``.csv``: CSV, anything else: JSONL), checked as the module says.

    Raises:
        WorkflowError: the file is unreadable or empty, or lines are bad (all of them listed).
    """
    jobs, _, problems = _read_jobs(path, {})
    _raise_if_any(path, problems)
    return jobs


def _read_jobs(path: Path, workflows: _Workflows) -> tuple[list[JobLine], list[JobLine], list[str]]:
    """The good jobs of ``path``, the jobs of lines with problems that can still be checked by the
    second pass (their workflow reads), and the problems (the first pass); the workflows it read stay
    in ``workflows`` for the second."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # spreadsheets save "CSV UTF-8" with a BOM
    except UnicodeDecodeError as exc:
        raise WorkflowError(f"jobs file {path}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from exc
    except OSError as exc:
        raise WorkflowError(f"jobs file {path}: cannot read it: {exc.strerror or exc}") from exc
    _refuse_a_workflow(path, text)
    problems: list[str] = []
    rows = _csv_rows(text, problems) if path.suffix.lower() == ".csv" else _jsonl_rows(text, problems)
    jobs: list[JobLine] = []
    flawed: list[JobLine] = []  # every problem of a line is listed, so these go on to the second pass
    seen: dict[str, int] = {}
    for line, row in rows:
        before = len(problems)
        stated_id = str(row.get("id", line))
        if stated_id in seen:  # also when the line that used it first is bad
            problems.append(f"line {line}: id {stated_id!r} is already used on line {seen[stated_id]}")
        else:
            seen[stated_id] = line
        job = _job_from_row(line, row, path.parent, problems)
        if job is None:
            continue
        try:
            _load_once(job.workflow, workflows)
        except WorkflowError as exc:
            problems.append(f"line {line}: workflow: {exc}")
            continue
        (jobs if len(problems) == before else flawed).append(job)
    if not rows and not problems:
        problems.append("no jobs in the file")
    return jobs, flawed, problems


def prepare_jobs(path: Path, jobs: list[JobLine], object_info: ObjectInfo) -> list[PreparedJob]:
    """Apply each job's overrides to its workflow and validate the result against ``object_info``.

    Raises:
        WorkflowError: any job does not validate (every problem, with its line and field).
    """
    prepared, problems = _prepare(jobs, object_info, {})
    _raise_if_any(path, problems)
    return prepared


def _prepare(
    jobs: list[JobLine], object_info: ObjectInfo, workflows: _Workflows
) -> tuple[list[PreparedJob], list[str]]:
    """The jobs that validate, and the problems of the others (the second pass)."""
    problems: list[str] = []
    prepared: list[PreparedJob] = []
    for job in jobs:
        prompt = copy.deepcopy(_load_once(job.workflow, workflows))
        bad = False
        for spec in job.overrides:
            try:
                apply_overrides(prompt, [spec], object_info)
            except WorkflowError as exc:
                field = spec.partition("=")[0]
                problems.append(
                    f"line {job.line}: set {field!r}: {str(exc).removeprefix(f'--set {spec!r}: ')}"
                )
                bad = True
        if bad:
            continue
        errors = [p for p in validate_workflow(prompt, object_info) if p.kind == "error"]
        for problem in errors:
            problems.append(f"line {job.line}: workflow {job.workflow.name}: {problem}")
        if not errors:
            stated = {f.name: getattr(job, f.name) for f in fields(JobLine)}
            prepared.append(PreparedJob(**stated, prompt=prompt))
    return prepared, problems


def _refuse_a_workflow(path: Path, text: str) -> None:
    """A workflow file given where the jobs file goes is said as such (one line), not as hundreds of
    lines that are not JSON."""
    try:
        whole = json.loads(text)
    except (ValueError, RecursionError):
        return
    nodes = whole.values() if isinstance(whole, dict) else ()
    api = bool(nodes) and all(isinstance(node, dict) and "class_type" in node for node in nodes)
    if api or is_ui_workflow(whole):
        raise WorkflowError(
            f"jobs file {path}: this is a workflow, not a jobs file; a jobs file has one job per line, e.g. "
            f'{{"workflow": "{path.name}", "set": {{"KSampler.seed": 1}}}}'
        )


def _jsonl_rows(text: str, problems: list[str]) -> list[tuple[int, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw, object_pairs_hook=refuse_duplicate_keys)
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: not valid JSON: {exc.msg} (column {exc.colno})")
            continue
        except ValueError as exc:  # a key given twice
            problems.append(f"line {number}: {exc}")
            continue
        except RecursionError:
            problems.append(f"line {number}: not a job: its JSON is nested too deeply")
            continue
        if not isinstance(row, dict):
            problems.append(f"line {number}: expected a JSON object, got {type(row).__name__}")
            continue
        rows.append((number, row))
    return rows


def _csv_rows(text: str, problems: list[str]) -> list[tuple[int, dict[str, Any]]]:
    # strict: a quote left open is an error, not a cell that swallows every line after it
    reader = csv.reader(io.StringIO(text), strict=True)
    records = _csv_records(reader, problems)
    header = next(records, None)
    if not header or not header[1]:
        return []
    names = [name.strip() for name in header[1]]
    unknown = [n for n in names if (n not in FIELDS and not n.startswith(SET_COLUMN)) or n == "set"]
    for name in unknown:
        problems.append(f"line 1: column {name!r} is not one of id, workflow, priority, set:NODE.input")
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"line 1: column {name!r} appears {names.count(name)} times")
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, cells in records:
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) != len(names):
            problems.append(f"line {number}: {len(cells)} cells, the header has {len(names)}")
            continue
        row: dict[str, Any] = {"set": {}}
        for name, cell in zip(names, cells, strict=True):
            cell = cell.strip()
            if name.startswith(SET_COLUMN):
                if cell:
                    row["set"][name.removeprefix(SET_COLUMN)] = cell
            elif cell:
                row[name] = cell
        rows.append((number, row))
    return rows


def _csv_records(reader: Any, problems: list[str]) -> Iterator[tuple[int, list[str]]]:
    """``(line, cells)`` of each CSV record; reading stops at the first malformed one, said in
    ``problems`` with the line it starts on."""
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):
                problems.append(
                    f'line {start}: a quote (") opened on this line is never closed, so every line after it '
                    "would be read as one cell: close it"
                )
            else:
                problems.append(f"line {start}: not valid CSV: {exc}")
            return
        yield start, cells


def _job_from_row(line: int, row: dict[str, Any], base: Path, problems: list[str]) -> JobLine | None:
    """The job ``row`` states, each of its problems added to ``problems``; ``None`` only when it names no
    workflow (a job with other problems comes back, for the second pass to check it too)."""
    for name in row:
        if name not in FIELDS:
            problems.append(f"line {line}: unknown field {name!r} (fields: {', '.join(FIELDS)})")
    job_id = str(row.get("id", line))
    stated = row.get("id", "")
    if isinstance(stated, bool) or not isinstance(stated, (str, int)) or not JOB_ID.match(job_id):
        problems.append(
            f"line {line}: id {row.get('id')!r} must be 1-100 letters, digits, '.', '_' or '-' "
            "(not starting with '.', '_' or '-')"
        )
    workflow = row.get("workflow")
    if workflow is not None and not isinstance(workflow, str):
        problems.append(f"line {line}: workflow: {json.dumps(workflow)} is not a file path (a string)")
    elif not isinstance(workflow, str) or not workflow.strip():
        problems.append(f"line {line}: workflow: a workflow file path is required")
        workflow = None
    overrides = _overrides(line, row.get("set", {}), problems)
    priority = _priority(line, row.get("priority"), problems)
    if workflow is None:  # a line with other problems is still checked against its workflow
        return None
    path = Path(workflow).expanduser()
    return JobLine(line, job_id, (path if path.is_absolute() else base / path).resolve(), overrides, priority)


def _overrides(line: int, given: Any, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(given, dict):
        problems.append(f"line {line}: set: expected an object of NODE.input → value, got {given!r}")
        return ()
    specs = []
    for target, value in given.items():
        if "." not in str(target).strip(".") or not str(target).rpartition(".")[2]:
            problems.append(f"line {line}: set {target!r}: expected NODE.input (e.g. Sample.noise_seed)")
            continue
        if isinstance(value, (list, dict)):  # would be sent as its JSON text, or read as a link
            shown = json.dumps(value)[:60]
            problems.append(f"line {line}: set {target!r}: {shown} is no input value (a text goes in quotes)")
            continue
        if value is None:  # a value left out; it would be sent as the text "null"
            problems.append(f"line {line}: set {target!r}: null is no input value (a text goes in quotes)")
            continue
        raw = value if isinstance(value, str) else json.dumps(value)
        specs.append(f"{target}={raw}")
    return tuple(specs)


def _priority(line: int, given: Any, problems: list[str]) -> int | None:
    if given is None:
        return None
    try:
        value = int(given)
        if isinstance(given, (float, bool)) or not 1 <= value <= MAX_PRIORITY:
            raise ValueError
    except (ValueError, TypeError):  # a list or an object too
        problems.append(f"line {line}: priority {given!r} must be an integer from 1 to {MAX_PRIORITY}")
        return None
    return value


def _load_once(path: Path, workflows: _Workflows) -> Workflow:
    """``path``'s workflow, read at most once per batch (its error too, raised again each time)."""
    if path not in workflows:
        try:
            workflows[path] = load_workflow(path)
        except WorkflowError as exc:
            workflows[path] = exc
    found = workflows[path]
    if isinstance(found, WorkflowError):
        raise found
    return found


def _raise_if_any(path: Path, problems: list[str]) -> None:
    if not problems:
        return
    listed = "\n".join(f"  {p}" for p in problems[:MAX_LISTED])
    more = f"\n  … and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    raise WorkflowError(f"jobs file {path}: {len(problems)} problem(s); nothing was queued:\n{listed}{more}")


def fetch_object_info(
    servers: list[str], *, timeout: float = 30.0, headers: Mapping[str, str] | None = None
) -> ObjectInfo:
    """``/object_info`` of the first of ``servers`` that answers within ``timeout`` seconds (asked
    twice; they run the same ComfyUI), ``headers`` sent with each request.

    Raises:
        ServerError: none of them answers.
    """
    problems = []
    for url in servers:
        try:
            client = ComfyClient(url, http_timeout=timeout, retry=RetryPolicy(retries=1), headers=headers)
            with client:
                info: ObjectInfo = client.get_json("/object_info")
                return info
        except ServerError as exc:
            problems.append(str(exc))
    raise ServerError(
        "no server gave its /object_info, so the jobs cannot be checked:\n  " + "\n  ".join(problems)
    )


def load_batch(
    path: Path, servers: list[str], *, timeout: float = 30.0, headers: Mapping[str, str] | None = None
) -> list[PreparedJob]:
    """Read and check the jobs file, then every good line against the servers' ``/object_info`` (a
    server silent for ``timeout`` seconds, twice, is passed over; ``headers`` go with the requests);
    the problems of both passes are listed together, by line."""
    workflows: _Workflows = {}
    lines, flawed, problems = _read_jobs(path, workflows)
    if not lines and not flawed:
        _raise_if_any(path, problems)
    object_info = fetch_object_info(servers, timeout=timeout, headers=headers)
    prepared, more = _prepare([*lines, *flawed], object_info, workflows)
    _raise_if_any(path, sorted(problems + more, key=_line_number))
    return prepared


def _line_number(problem: str) -> int:
    found = re.match(r"line (\d+):", problem)
    return int(found[1]) if found else 0
