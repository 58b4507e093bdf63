"""The batch queue on SQLite: submitting twice queues nothing twice, cancel and retry, and a job whose
node fails is failed once (not retried) with its node id and message, then run again by
``retry --failed``. The node error comes from the scripted fake server: a real one cannot be made to
fail a node on demand."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import logging
import signal
import threading
import time
from pathlib import Path

import pytest
from dbos import DBOSClient
from rich.console import Console

from runner.batch.attempt import run_attempt
from runner.batch.jobs_file import PreparedJob
from runner.batch.pool import ServerPool
from runner.batch.queue import (
    APP_VERSION,
    FINAL_STATES,
    JOB_WORKFLOW,
    QUEUE,
    BatchSettings,
    cancel_batch,
    job_spec,
    list_jobs,
    open_client,
    retry_batch,
    submit_batch,
)
from runner.batch.worker import BatchWorker
from runner.cli.main import main
from runner.errors import ServerError, UsageError
from runner.local.ports import pick_free_port
from tests.fake_server import VIDEO_BYTES, WORKFLOW, FakeComfy, now_ms


def prepared(job_id: str, seed: int = 1) -> PreparedJob:
    prompt = copy.deepcopy(WORKFLOW)
    prompt["2"]["inputs"]["seed"] = seed
    return PreparedJob(1, job_id, Path("wf.json"), (f"2.seed={seed}",), prompt=prompt)


def test_a_batch_is_queued_once_cancelled_and_requeued(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    settings = BatchSettings(out_dir=tmp_path / "out")
    with open_client(db_url) as client:
        assert submit_batch(client, "b", [prepared("a"), prepared("b", 2)], settings) == 2
        assert submit_batch(client, "b", [prepared("a"), prepared("b", 2)], settings) == 0
        with pytest.raises(
            UsageError, match=r"already has jobs with the ids b but other settings \(workflow "
        ):
            submit_batch(client, "b", [prepared("a"), prepared("b", 3)], settings)
        # which setting differs is named: it said all six whatever differed
        elsewhere = BatchSettings(out_dir=tmp_path / "other", timeout=60)
        with pytest.raises(UsageError) as refused:
            submit_batch(client, "b", [prepared("a"), prepared("b", 2)], elsewhere)
        assert (
            f"other settings (--out: {tmp_path / 'out'} then, {tmp_path / 'other'} now, --timeout); submit "
            "under another --name" in str(refused.value)
        )
        assert [(j.job_id, j.state) for j in list_jobs(client, "b")] == [("a", "queued"), ("b", "queued")]
        assert cancel_batch(client, "b") == 2
        assert {j.state for j in list_jobs(client, "b")} == {"cancelled"}
        assert sorted(retry_batch(client, "b")) == ["a", "b"]
        assert {j.state for j in list_jobs(client, "b")} == {"queued"}


def test_the_retry_command_says_what_it_requeued_or_why_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    with open_client(db_url) as client:
        submit_batch(client, "b", [prepared("a"), prepared("b", 2)], BatchSettings(out_dir=tmp_path / "out"))
    assert main(["batch", "retry", "b", "--db", db_url]) == 0
    assert capsys.readouterr().out.strip() == "nothing to requeue: batch b has no cancelled or errored jobs"
    assert main(["batch", "retry", "b", "--failed", "--db", db_url]) == 0
    assert "has no cancelled, errored or failed jobs" in capsys.readouterr().out
    assert main(["batch", "cancel", "b", "--db", db_url]) == 0
    capsys.readouterr()
    assert main(["batch", "retry", "b", "--db", db_url]) == 0
    assert capsys.readouterr().out.strip() == "requeued 2 job(s): a, b"
    # --json on every verb that changes the queue (cancel and retry refused it: exit 2)
    assert main(["batch", "cancel", "b", "--db", db_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"batch": "b", "cancelled": 2, "left_on_servers": []}
    assert main(["batch", "retry", "b", "--db", db_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"batch": "b", "requeued": ["a", "b"]}


def test_a_cancelled_job_whose_prompt_finished_first_reports_its_results(tmp_path: Path) -> None:
    """A job checks for a cancel at most once a second: one whose prompt ended just before published
    its folder, and its state is then that result's, files and all (not "cancelled" without them)."""
    out = tmp_path / "out"
    with open_client(f"sqlite:///{tmp_path / 'q.sqlite'}") as client:
        submit_batch(client, "k", [prepared("a"), prepared("b", 2)], BatchSettings(out_dir=out))
        assert cancel_batch(client, "k") == 2
        (status,) = client.list_workflows(workflow_ids=["k/a"])
        spec = status.input["args"][0]
        (out / "a").mkdir(parents=True)
        files = [{"path": "a/v.mp4", "sha256": "0" * 64, "bytes": 3}]
        record = {"batch": "k", "job_id": "a", "digest": spec["digest"], "status": "success", "files": files}
        (out / "a" / "result.json").write_text(json.dumps(record))
        jobs = {j.job_id: j for j in list_jobs(client, "k")}
        assert (jobs["a"].state, jobs["a"].record) == ("success", record)
        assert (jobs["b"].state, jobs["b"].record) == ("cancelled", None)
        assert retry_batch(client, "k") == ["b"]  # the finished one is not run again


def test_jobs_new_to_a_batch_are_added_only_when_asked(tmp_path: Path) -> None:
    """Two jobs files named alike (``jobs.jsonl`` in two folders) give one default batch name: the
    second must not silently join the first's batch, its progress and its manifest."""
    settings = BatchSettings(out_dir=tmp_path / "out")
    with open_client(f"sqlite:///{tmp_path / 'q.sqlite'}") as client:
        assert submit_batch(client, "b", [prepared("a"), prepared("b", 2)], settings) == 2
        with pytest.raises(UsageError, match=r"batch 'b' already has 2 job\(s\), and this jobs file has 1 it "
                           r"does not \(ids c\); nothing was queued.*--add"):  # fmt: skip
            submit_batch(client, "b", [prepared("a"), prepared("c", 3)], settings)
        assert [j.job_id for j in list_jobs(client, "b")] == ["a", "b"]
        assert submit_batch(client, "b", [prepared("a"), prepared("c", 3)], settings, add=True) == 1
        assert sorted(j.job_id for j in list_jobs(client, "b")) == ["a", "b", "c"]
        assert submit_batch(client, "b", [prepared("c", 3)], settings) == 0  # all there: harmless


def test_a_taken_job_folder_queues_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "b").mkdir(parents=True)
    (out / "b" / "mine.txt").write_text("mine")
    with open_client(f"sqlite:///{tmp_path / 'q.sqlite'}") as client:
        with pytest.raises(
            UsageError, match=r"nothing was queued; job folders are taken:\n  job b: .*holds no"
        ):
            submit_batch(client, "t", [prepared("a"), prepared("b", 2)], BatchSettings(out_dir=out))
        assert list_jobs(client, "t") == []
        (out / "b").rename(tmp_path / "b")
        assert submit_batch(client, "t", [prepared("a"), prepared("b", 2)], BatchSettings(out_dir=out)) == 2
        (tmp_path / "b").rename(out / "b")  # taken once the jobs are queued
        # submitting again (to --wait for it) queues nothing new and is not refused: job b, when it
        # runs, is failed for its folder, and job a runs
        assert submit_batch(client, "t", [prepared("a"), prepared("b", 2)], BatchSettings(out_dir=out)) == 0
    assert (out / "b" / "mine.txt").read_text() == "mine"


def test_an_out_that_is_a_file_queues_nothing(tmp_path: Path) -> None:
    """As ``run``, ``bench`` and ``demo`` do: refused up front (exit 2), not one failed job per line."""
    out = tmp_path / "afile"
    out.write_text("mine")
    with open_client(f"sqlite:///{tmp_path / 'q.sqlite'}") as client:
        with pytest.raises(UsageError, match=r"--out .*afile: .*afile is a file, not a folder; nothing was"):
            submit_batch(client, "t", [prepared("a")], BatchSettings(out_dir=out))
        with pytest.raises(UsageError, match=r"--out .*afile/run1: .*afile is a file, not a folder"):
            submit_batch(client, "t", [prepared("a")], BatchSettings(out_dir=out / "run1"))
        assert list_jobs(client, "t") == []
    assert out.read_text() == "mine"


def test_an_out_that_became_unusable_fails_the_job_before_its_prompt(tmp_path: Path) -> None:
    """A folder that turned into a file after the submit: fault ``output``, named, and no prompt sent
    (the server here answers nothing: a prompt would have given a ``server`` fault)."""
    out = tmp_path / "afile"
    out.write_text("mine")
    job = job_spec("t", prepared("a"), BatchSettings(out_dir=out, timeout=5, health_timeout=1))
    outcome = run_attempt(job, "http://127.0.0.1:9", worker="w", attempt=1)
    assert outcome["fault"] == "output", outcome
    assert outcome["error"]["message"].startswith(f"--out {out}: cannot make {out}/.partial/a-")
    assert out.read_text() == "mine"


def test_a_job_that_raised_is_run_again_by_retry(tmp_path: Path) -> None:
    """A job whose workflow raised (state error) is not resumable in DBOS: retry runs it anew."""
    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    with FakeComfy(lambda fake, pid: fake.vanish()) as fake, open_client(db_url) as client:
        broken = {"batch": "e", "job_id": "x", "out_dir": str(tmp_path / "out")}  # no timeout: KeyError
        options = {"workflow_name": JOB_WORKFLOW, "queue_name": QUEUE, "workflow_id": "e/x"}
        with BatchWorker(db_url, ServerPool([fake.url], per_server=1), grace=5):
            client.enqueue({**options, "app_version": APP_VERSION, "attributes": {"job": "x"}}, broken)
            wait_for_final(client, "e")
            assert [(j.job_id, j.state, j.workflow_id) for j in list_jobs(client, "e")] == [
                ("x", "error", "e/x")
            ]
            assert retry_batch(client, "e") == ["x"]
            wait_for_final(client, "e")
            (job,) = list_jobs(client, "e")
    assert (job.state, job.workflow_id) == ("error", "e/x/retry-1")  # ran again (and raised again)


def test_a_node_error_fails_the_job_once_with_the_node_and_retry_failed_runs_it_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
        if sum(1 for call in fake.calls if call[0] == "POST /prompt") == 1:  # the first run fails in node 2
            error = {"node_id": "2", "node_type": "KSampler", "exception_type": "RuntimeError"}
            data = {"prompt_id": pid, **error, "exception_message": "boom", "timestamp": now_ms()}
            await fake.send({"type": "execution_error", "data": data})
            fake.finish(pid, status="error", outputs={})
        else:
            fake.finish(pid)
        await fake.send({"type": "executing", "data": {"prompt_id": pid, "node": None}})

    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    out = tmp_path / "out"
    with FakeComfy(script) as fake, open_client(db_url) as client:
        pool = ServerPool([fake.url], per_server=1)
        with BatchWorker(db_url, pool, grace=30):
            submit_batch(client, "f", [prepared("only")], BatchSettings(out_dir=out, max_attempts=3))
            wait_for_final(client, "f")
            (job,) = list_jobs(client, "f")
            assert job.state == "failed" and job.record is not None
            assert job.record["attempts"] == 1 and job.record["fault"] == "workflow"
            assert job.record["error"] == {"node_id": "2", "class_type": "KSampler", "message": "boom"}
            assert not (out / "only").exists()
            assert main(["batch", "retry", "f", "--db", db_url]) == 0  # a failure is not retried unasked
            said = "nothing to requeue: batch f has no cancelled or errored jobs (1 failed: add --failed"
            assert capsys.readouterr().out.startswith(said)

            assert retry_batch(client, "f", failed=True) == ["only"]
            wait_for_final(client, "f")
        (job,) = list_jobs(client, "f")
        posted = [call for call in fake.calls if call[0] == "POST /prompt"]
    assert job.state == "success" and job.workflow_id == "f/only/retry-1"
    assert len(posted) == 2  # the failure was not retried on its own; `retry --failed` ran it once more
    assert (out / "only" / "clip_00001_.mp4").read_bytes() == VIDEO_BYTES


def wait_for_final(client: DBOSClient, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(j.state in FINAL_STATES for j in list_jobs(client, name)):
        assert time.monotonic() < deadline, [(j.job_id, j.state) for j in list_jobs(client, name)]
        time.sleep(0.1)


def test_cancel_interrupts_a_running_job_on_its_server(tmp_path: Path) -> None:
    said: list[str] = []  # what DBOS's logger lets through (it does not propagate to pytest's capture)
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]

    async def endless(fake: FakeComfy, pid: str) -> None:
        await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
        for step in range(1, 600):  # a long sampler, one step every 0.1 s, until interrupted
            if pid not in fake.running:
                return
            data = {"prompt_id": pid, "node": "2", "value": step, "max": 600}
            await fake.send({"type": "progress", "data": data})
            await asyncio.sleep(0.1)

    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    out = tmp_path / "out"
    with FakeComfy(endless) as fake, open_client(db_url) as client:
        with BatchWorker(db_url, ServerPool([fake.url], per_server=1), grace=30):
            logging.getLogger("dbos").addHandler(handler)
            submit_batch(client, "c", [prepared("long")], BatchSettings(out_dir=out))
            deadline = time.monotonic() + 20
            while not any(call[0] == "POST /prompt" for call in fake.calls):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)
            assert cancel_batch(client, "c") == 1
            deadline = time.monotonic() + 10
            while not any(call[0] == "POST /interrupt" for call in fake.calls):
                assert time.monotonic() < deadline, "the running prompt was not interrupted"
                time.sleep(0.05)
        (job,) = list_jobs(client, "c")
    assert job.state == "cancelled"
    assert not (out / "long").exists()
    logging.getLogger("dbos").removeHandler(handler)
    # DBOS's warning about the cancelled workflow would be printed into `submit --wait`'s live view
    assert not [line for line in said if "no longer owned" in line], said


async def _endless(fake: FakeComfy, pid: str) -> None:
    """A prompt that samples (a step every 0.1 s) until it is taken off the server."""
    await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
    for step in range(1, 600):
        if pid not in fake.running:
            return
        await fake.send(
            {"type": "progress", "data": {"prompt_id": pid, "node": "2", "value": step, "max": 600}}
        )
        await asyncio.sleep(0.1)


def _submit_one_long_job(client: DBOSClient, fake: FakeComfy, out: Path) -> None:
    """Queue batch ``g``'s one job and return once the worker has sent its prompt to ``fake``."""
    submit_batch(client, "g", [prepared("long")], BatchSettings(out_dir=out))
    deadline = time.monotonic() + 20
    while not any(call[0] == "POST /prompt" for call in fake.calls):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_worker_stopped_without_grace_takes_its_prompts_off_the_servers(tmp_path: Path) -> None:
    """``--grace 0`` (or a grace that ran out): the job stays unfinished and goes back on the queue, so
    the prompt it left is interrupted on its server instead of keeping it busy for nothing."""
    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    with FakeComfy(_endless) as fake, open_client(db_url) as client:
        with BatchWorker(db_url, ServerPool([fake.url], per_server=1), grace=0) as worker:
            _submit_one_long_job(client, fake, tmp_path / "out")
            time.sleep(0.5)
        assert any(call[0] == "POST /interrupt" for call in fake.calls), fake.calls
        assert not worker.runner.in_flight  # the attempt saw its prompt end (and recorded nothing)
        (job,) = list_jobs(client, "g")
    assert job.state == "queued" and worker.handed_back == 1  # unfinished: any worker runs it again


def test_ctrl_c_again_while_running_jobs_finish_stops_now_and_hands_them_back(tmp_path: Path) -> None:
    """A second Ctrl-C during the grace: the stop ended there (exit 130), the prompt kept computing,
    and the job stayed `running` under a worker that was gone until that worker id ran again."""
    import _thread

    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    # As the CLI has it; pytest started in the background (`pytest &`, nohup) inherits SIGINT ignored,
    # and interrupt_main() then does nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with FakeComfy(_endless) as fake, open_client(db_url) as client:
            with BatchWorker(db_url, ServerPool([fake.url], per_server=1), grace=120) as worker:
                _submit_one_long_job(client, fake, tmp_path / "out")
                again = threading.Timer(1.5, _thread.interrupt_main)  # while the stop waits out the grace
                again.start()
                stopping = time.monotonic()
            assert time.monotonic() - stopping < 30  # not the 120 s of grace
            assert any(call[0] == "POST /interrupt" for call in fake.calls), fake.calls
            (job,) = list_jobs(client, "g")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert job.state == "queued" and worker.handed_back == 1  # unfinished: any worker runs it again


def test_results_and_verbs_refuse_what_they_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runner.cli.main import main

    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    with open_client(db_url) as client:
        submit_batch(client, "m", [prepared("a")], BatchSettings(out_dir=tmp_path / "out"))
    db = ("--db", db_url)
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    assert main(["batch", "results", "m", "--out", str(a_file), *db]) == 2
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "results.csv").write_text("their,own,csv\n")
    assert main(["batch", "results", "m", "--out", str(theirs), *db]) == 2
    assert "is not the manifest of batch 'm'" in capsys.readouterr().err.replace("\n", "")
    assert (theirs / "results.csv").read_text() == "their,own,csv\n" and a_file.read_text() == "kept"
    ours = tmp_path / "ours"
    assert main(["batch", "results", "m", "--out", str(ours), *db]) == 0
    assert main(["batch", "results", "m", "--out", str(ours), *db]) == 0  # its own manifest: refreshed
    for verb in ("cancel", "retry", "status"):
        assert main(["batch", verb, "nosuch", *db]) == 1
        assert f"no batch named 'nosuch' in {db_url}" in capsys.readouterr().err.replace("\n", "")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--per-server", "0"], "--per-server: 0: must be at least 1"),
        (["--max-attempts", "0"], "--max-attempts: 0: must be at least 1"),
        (["--timeout", "-1"], "--timeout: -1: must be a positive number of seconds"),
        (["--grace", "x"], "--grace: 'x' is not a whole number of seconds"),
        (["--name", "../../evil"], "batch name '../../evil': 1-80 letters"),
        (["--name", ""], "batch name '': 1-80 letters"),
        (["--db", "sqlite:////nonexistent/dir/x.db"], "the folder /nonexistent/dir does not exist"),
        (["--db", "mysql://h/db"], "expected sqlite:///PATH or postgresql://"),
        (["--db", "mysql://a:secret@h/db"], "--db 'mysql://a:***@h/db': expected sqlite:///PATH"),
        (["--db", "postgresql://a:secret@h:5432/"], "--db 'postgresql://a:***@h:5432/' names no database"),
        (["--server", "localhost:8188"], "server must be an http:// or https:// URL"),
        (["--server", "http://127.0.0.1:9"], "--server: http://127.0.0.1:9 is given twice"),
        (["--server", "http://127.0.0.1:9/"], "--server: http://127.0.0.1:9 is given twice"),
        (["--server", "http://localhost:9"], "http://127.0.0.1:9 and http://localhost:9 are one server"),
    ],
)
def test_unusable_batch_options_are_usage_errors_and_queue_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    from runner.cli.main import main

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"workflow": "w.json"}\n')
    db = ["--db", f"sqlite:///{tmp_path / 'q.sqlite'}"] if "--db" not in argv else []
    try:
        code = main(["batch", "submit", str(jobs), "--server", "http://127.0.0.1:9", *db, *argv])
    except SystemExit as parser_exit:  # argparse refuses the value itself
        code = parser_exit.code
    assert code == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not Path("/nonexistent").exists()
    assert not (tmp_path / "q.sqlite").exists()


def test_the_progress_table_counts_jobs_that_raised() -> None:
    """A job that raised has no result record and so no server; the table still accounts for it."""
    from rich.console import Console

    from runner.batch.queue import JobState
    from runner.cli.batch import _progress_view

    record = {"status": "success", "server": "http://127.0.0.1:8188"}
    jobs = [
        JobState("a", "n/a", "success", record, 1, 2),
        JobState("b", "n/b", "error", None, 1, 2, error="KeyError: 'timeout'"),
    ]
    console = Console(width=120, record=True)
    console.print(_progress_view("n", jobs, None, None))
    text = console.export_text()
    assert "2/2 done · 1 ok · 1 failed" in text
    assert [line.split() for line in text.splitlines() if "no server" in line] == [
        ["no", "server", "(the", "job", "raised)", "0", "1"]
    ]
    jobs.append(JobState("c", "n/c", "cancelled", None, 1, 2))  # cancelled: counted, not hidden in "done"
    console = Console(width=120, record=True)
    console.print(_progress_view("n", jobs, None, None))
    assert "3/3 done · 1 ok · 1 failed · 1 cancelled · 0 running" in console.export_text()


def test_status_names_the_worker_that_holds_running_jobs() -> None:
    """After a worker stopped (its jobs stay running on the queue), status says whose id resumes them."""
    from rich.console import Console

    from runner.batch.queue import JobState
    from runner.cli.batch import _progress_view

    jobs = [JobState("a", "n/a", "running", None, 1, None, worker="vm-2172df9e")]
    console = Console(width=200, record=True)
    console.print(_progress_view("n", jobs, None, None))
    text = console.export_text()
    assert "running jobs are held by worker vm-2172df9e" in text and "--worker-id" in text
    assert "no job has finished on a server yet" in text and "health" not in text  # no bare table header
    jobs.append(JobState("b", "n/b", "success", {"status": "success", "server": "http://s:1"}, 1, 2))
    console = Console(width=200, record=True)
    console.print(_progress_view("n", jobs, None, None))
    header = next(line.split() for line in console.export_text().splitlines() if "server" in line.split())
    assert header == ["server", "ok", "failed"]  # status has no pool: no health, no running (all "—")


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        ("PromptTimeoutError", "timeout"),
        ("PromptCancelledError", "cancelled"),
        ("ServerUnreachableError", "server"),
    ],
)
def test_a_job_stopped_mid_prompt_names_the_node_that_was_running(error: str, fault: str) -> None:
    import runner.errors
    from runner.batch.attempt import _classify
    from runner.tracking.result import PromptResult

    result = PromptResult("p", "timeout", 0.0, 0.0, 1.0, error={"node_id": "2", "class_type": "KSampler"})
    exc = getattr(runner.errors, error)("stopped")
    exc.result = result  # as run_prompt sets it on a server lost mid-prompt
    assert _classify(exc) == (fault, {"node_id": "2", "class_type": "KSampler", "message": "stopped"})
    assert _classify(getattr(runner.errors, error)("stopped")) == (
        fault,
        {"node_id": None, "class_type": None, "message": "stopped"},
    )


def test_a_left_prompt_the_server_did_not_take_off_is_not_said_taken_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from runner.batch.orphans import cancel_left_prompts

    cancel_left_prompts({"p-1": "http://127.0.0.1:9"}, "w-1")  # nothing listens there
    said = (
        "prompt p-1 on http://127.0.0.1:9: could not be taken off (the server did not answer): it may run on"
    )
    assert said in caplog.text
    assert "taken off the server" not in caplog.text


def test_a_left_prompt_that_ended_as_the_worker_stopped_is_not_said_taken_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its cancel requests were taken (ComfyUI takes them for any id), so it was 'taken off the
    server' though it had finished."""
    from runner.batch.orphans import cancel_left_prompts

    with FakeComfy(_endless) as fake:
        cancel_left_prompts({"p-ended": fake.url}, "w-1")  # the fake's queue does not hold it
    assert f"prompt p-ended on {fake.url}: no longer on the server (it finished" in caplog.text
    assert not [call for call in fake.calls if call[0] in ("POST /queue", "POST /interrupt")]


def test_a_stop_with_every_server_out_leaves_at_once_and_loses_no_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Jobs waiting for a server that never answers hold no prompt: a stop does not give them the
    grace (it used to wait all of it, then log a DBOS traceback per job), and they are neither failed
    nor errored: the stopped worker hands them back to the queue, and a worker of any id runs each of
    them once (they used to wait, pending, for a worker of the stopped one's id)."""
    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    out = tmp_path / "out"
    nobody = f"http://127.0.0.1:{pick_free_port()}"  # nothing listens there
    answers = iter([True])  # it answered as the worker started (a worker takes no job before), then went
    pool = ServerPool([nobody], per_server=1, probe=lambda url: next(answers, False))
    with open_client(db_url) as client:
        with BatchWorker(db_url, pool, worker_id="w1", grace=60) as worker:
            _lose_the_server_holding_two_jobs(client, pool, "d", out)
            time.sleep(1.5)  # the server has been probed and found out
            assert worker.running_jobs() == 0
            stopping = time.monotonic()
        assert time.monotonic() - stopping < 10  # not the 60 s grace
        assert [j.state for j in list_jobs(client, "d")] == ["queued", "queued"]  # unfinished, handed back
        assert worker.handed_back == 2
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
        with FakeComfy(lambda fake, pid: _finish(fake, pid)) as fake:
            with BatchWorker(db_url, ServerPool([fake.url], per_server=1), worker_id="w2", grace=30):
                wait_for_final(client, "d")
            posted = [call for call in fake.calls if call[0] == "POST /prompt"]
        jobs = list_jobs(client, "d")
    assert [(j.job_id, j.state) for j in jobs] == [("a", "success"), ("b", "success")]
    assert len(posted) == 2 and all(job.record and job.record["attempts"] == 1 for job in jobs)


def _lose_the_server_holding_two_jobs(client: DBOSClient, pool: ServerPool, batch: str, out: Path) -> None:
    """The pool's only server goes out (a job lost it), then ``batch``'s two jobs are queued; returns
    once the worker holds both (a slot's and the next one), waiting for a server."""
    pool.release(pool.acquire(), server_failed=True, reason="it went away")
    submit_batch(client, batch, [prepared("a"), prepared("b", 2)], BatchSettings(out_dir=out))
    deadline = time.monotonic() + 20
    while [j.state for j in list_jobs(client, batch)] != ["running", "running"]:
        assert time.monotonic() < deadline, list_jobs(client, batch)
        time.sleep(0.1)


def test_a_worker_whose_servers_all_went_away_gives_its_jobs_back_and_takes_jobs_once_one_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose only server died mid-batch held the jobs it had taken (a slot and the next one)
    while they waited for that server to come back, however long: a batch shared with other workers
    never ended although their servers sat idle. It now gives them back, then runs jobs again once its
    server answers (its job workflow still bound to it: DBOS keeps registrations across a relaunch)."""
    from runner.batch.pool import probe_server

    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    fake = FakeComfy(lambda fake, pid: _finish(fake, pid))  # not serving yet: its port is free
    url = f"http://127.0.0.1:{fake.port}"
    answers = iter([True])  # it answered as the worker started, then went
    pool = ServerPool([url], per_server=1, probe=lambda u: next(answers, False) or probe_server(u))
    worker = BatchWorker(db_url, pool, worker_id="w1", grace=60, stand_down_after=2)
    done, failed = threading.Event(), []

    def watch() -> None:  # what the CLI's loop does
        try:
            while not done.is_set():
                worker.check_servers()  # returns at once, or once stood down and a server answers
                time.sleep(0.1)
        except BaseException as exc:
            failed.append(exc)

    with open_client(db_url) as client, caplog.at_level(logging.WARNING):
        with worker:
            _lose_the_server_holding_two_jobs(client, pool, "g", tmp_path)
            deadline = time.monotonic() + 20
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            while [j.state for j in list_jobs(client, "g")] != ["queued", "queued"]:  # given back
                assert time.monotonic() < deadline + 20, list_jobs(client, "g")
                time.sleep(0.1)
            assert worker.stood_down == 1
            with fake:  # its server is back: it takes the jobs again and runs them
                wait_for_final(client, "g")
                posted = [call for call in fake.calls if call[0] == "POST /prompt"]
            done.set()
            watcher.join(timeout=20)
        assert not failed
        said = f"worker w1: none of its servers ({url}) has answered for 2 s: 2 job(s) it held went back"
        assert said in caplog.text
        jobs = list_jobs(client, "g")
    assert [(j.job_id, j.state) for j in jobs] == [("a", "success"), ("b", "success")]
    assert len(posted) == 2 and all(job.record and job.record["attempts"] == 1 for job in jobs)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_registering_the_job_workflow_again_is_not_warned_about() -> None:
    """A worker registers its job workflow each time it launches DBOS (after a stand-down too, so the
    workflow runs on its new pool state); DBOS's warning about a second registration of a name was
    printed to the worker's terminal."""
    from runner.batch.job_runner import JobRunner, register_job_workflow

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("dbos").addHandler(handler)  # DBOS's logger does not reach pytest's capture
    try:
        pool = ServerPool(["http://127.0.0.1:9"])
        register_job_workflow(JobRunner(pool, "w1"))
        register_job_workflow(JobRunner(pool, "w1"))
    finally:
        logging.getLogger("dbos").removeHandler(handler)
    assert not [line for line in said if "registration" in line], said


def test_a_worker_takes_no_job_before_one_of_its_servers_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose only server was down (a typo, a server not started yet) took jobs off the shared
    queue and held them, `running` under its id, while another worker's servers sat idle."""
    import threading

    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    nobody = f"http://127.0.0.1:{pick_free_port()}"
    worker = BatchWorker(db_url, ServerPool([nobody], per_server=1), worker_id="w1", grace=5)
    ended: list[BaseException] = []

    def start() -> None:
        try:
            worker.__enter__()
        except BaseException as exc:
            ended.append(exc)

    with open_client(db_url) as client:
        submit_batch(client, "n", [prepared("a")], BatchSettings(out_dir=tmp_path / "out"))
        with caplog.at_level(logging.WARNING, logger="runner.batch.worker"):
            waiting = threading.Thread(target=start, daemon=True)
            waiting.start()
            time.sleep(7)  # past the first wait: it says so, and takes nothing
            assert [j.state for j in list_jobs(client, "n")] == ["queued"] and waiting.is_alive()
            worker.runner.draining.set()  # given up on
            waiting.join(timeout=20)
        assert len(ended) == 1 and isinstance(ended[0], ServerError)
        said = f"worker w1: none of its servers ({nobody}) answers; it takes no job until one does"
        assert said in caplog.text
        with (
            FakeComfy(lambda fake, pid: _finish(fake, pid)) as fake,
            BatchWorker(db_url, ServerPool([fake.url], per_server=1), worker_id="w2", grace=30),
        ):
            wait_for_final(client, "n")
        assert [j.state for j in list_jobs(client, "n")] == ["success"]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_stopped_while_it_waits_for_its_servers_exits_0(
    tmp_path: Path, stop: signal.Signals
) -> None:
    """`batch worker --help`: "0 stopped with Ctrl-C or SIGTERM"; one stopped before any of its servers
    had answered ended `interrupted`, exit 130 (a service manager's failure)."""
    from tests.batch_helpers import start_batch

    nobody, log = f"http://127.0.0.1:{pick_free_port()}", tmp_path / "worker.log"
    db = ["--db", f"sqlite:///{tmp_path / 'q.sqlite'}", "--worker-id", "w1"]
    worker = start_batch("worker", "--server", nobody, *db, log=log)
    try:
        deadline = time.monotonic() + 60
        while "it takes no job until one does" not in log.read_text(encoding="utf-8"):
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text(encoding="utf-8")
            time.sleep(0.2)
        worker.send_signal(stop)
        assert worker.wait(timeout=30) == 0, log.read_text(encoding="utf-8")
    finally:
        if worker.poll() is None:
            worker.kill()
    said = log.read_text(encoding="utf-8")
    assert said.rstrip().endswith("stopped before taking any job (none of its servers had answered)"), said


async def _finish(fake: FakeComfy, pid: str) -> None:
    await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
    fake.finish(pid)
    await fake.send({"type": "executing", "data": {"prompt_id": pid, "node": None}})


def test_a_worker_counts_each_batchs_jobs_on_its_servers_apart(tmp_path: Path) -> None:
    """`submit --wait` of one batch is a worker of the shared queue: it may run another batch's job
    first, and its progress line must not count that job as its own ("0/1 finished, 1 running on
    servers, 1 waiting" for a one-job batch). Which of the two takes the one slot first is DBOS's."""
    from runner.batch.results import summarize
    from runner.cli.batch import _say_progress

    release = threading.Event()

    async def held(fake: FakeComfy, pid: str) -> None:
        await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
        while not release.is_set():
            await asyncio.sleep(0.05)
        await _finish(fake, pid)

    db_url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    with FakeComfy(held) as fake, open_client(db_url) as client:
        submit_batch(client, "first", [prepared("a")], BatchSettings(out_dir=tmp_path / "first"))
        submit_batch(client, "mine", [prepared("m", 2)], BatchSettings(out_dir=tmp_path / "mine"))
        with BatchWorker(db_url, ServerPool([fake.url], per_server=1), grace=30) as worker:
            deadline = time.monotonic() + 20
            while worker.running_jobs() < 1:  # the first batch's job holds the only slot
                assert time.monotonic() < deadline
                time.sleep(0.05)
            holder, other = ("first", "mine") if worker.running_jobs("first") else ("mine", "first")
            assert (worker.running_jobs(holder), worker.running_jobs(other)) == (1, 0)
            console = Console(file=io.StringIO(), width=200)
            summary = summarize(list_jobs(client, other))
            _say_progress(console, other, summary, worker.running_jobs(other), ("", 0.0))
            said = console.file.getvalue()  # type: ignore[attr-defined]
            assert (
                f"batch {other}: 0/1 finished (0 succeeded, 0 failed), 0 running on servers, 1 waiting"
                in said
            )
            release.set()
            wait_for_final(client, "mine")
        assert [j.state for j in list_jobs(client, "first") + list_jobs(client, "mine")] == ["success"] * 2


def test_a_database_password_is_starred_out_wherever_the_url_gives_it() -> None:
    """As a connection parameter too (libpq's ``?password=``): `batch status --db "…?password=X"`
    printed it in clear when the database could not be opened."""
    from runner.batch.database_url import redact_db_url

    assert redact_db_url("postgresql://lv:s3cret@db:5432/q") == "postgresql://lv:***@db:5432/q"
    assert (
        redact_db_url("postgresql://lv@db/q?sslmode=require&PASSWORD=s3cret&x=1")
        == "postgresql://lv@db/q?sslmode=require&PASSWORD=***&x=1"
    )
    assert redact_db_url("sqlite:////tmp/q.sqlite") == "sqlite:////tmp/q.sqlite"


def test_a_python_whose_sqlite_cannot_hold_the_queue_is_said_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under Python 3.12+ DBOS stamps SQLite rows with unixepoch('subsec'), which SQLite has from 3.42:
    with Python 3.13 linking SQLite 3.40, every `batch submit` ended in an IntegrityError traceback."""
    from runner.batch import database_url as queue
    from runner.errors import WorkspaceError

    assert queue.sqlite_problem((3, 11, 7), "3.40.1") is None
    assert queue.sqlite_problem((3, 13, 0), "3.42.0") is None
    said = queue.sqlite_problem((3, 13, 0), "3.40.1")
    assert said is not None and "this Python (3.13.0) links SQLite 3.40.1" in said
    monkeypatch.setattr(queue, "sqlite_problem", lambda: said)
    db = f"sqlite:///{tmp_path / 'q.sqlite'}"
    with pytest.raises(WorkspaceError, match=r"needs SQLite 3.42 or newer under Python 3.12") as refused:
        queue.resolve_db_url(db, tmp_path)
    assert refused.value.exit_code == 3 and not (tmp_path / "q.sqlite").exists()
    assert queue.resolve_db_url("postgresql://lv@db/q", tmp_path) == "postgresql://lv@db/q"  # unaffected


def test_a_prompt_that_batch_cancel_interrupted_elsewhere_is_cancelled_not_a_workflow_fault(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`batch cancel` on another machine takes the prompt off its server, whose "interrupted" can reach
    the worker before its own check of the queue: it was logged as a workflow fault."""
    cancelled = {"now": False}

    async def cancelled_elsewhere(fake: FakeComfy, pid: str) -> None:
        await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
        await asyncio.sleep(0.2)
        cancelled["now"] = True  # the queue says so, and the server is told to interrupt the prompt
        fake.finish(pid, status="interrupted", outputs={})
        data = {"prompt_id": pid, "node_id": "2", "node_type": "KSampler", "executed": []}
        await fake.send({"type": "execution_interrupted", "data": data})
        await fake.send({"type": "executing", "data": {"prompt_id": pid, "node": None}})  # as ComfyUI ends

    job = job_spec("c", prepared("a"), BatchSettings(out_dir=tmp_path / "out", timeout=30, health_timeout=5))
    with FakeComfy(cancelled_elsewhere) as fake, caplog.at_level(logging.INFO, logger="runner.batch"):
        outcome = run_attempt(job, fake.url, worker="w", attempt=1, cancelled=lambda: cancelled["now"])
    assert outcome["fault"] == "cancelled", outcome
    assert not [r for r in caplog.records if "workflow fault" in r.getMessage()], caplog.text


def test_a_postgres_url_is_opened_with_a_connect_timeout_unless_it_gives_one() -> None:
    """A database host that took connections and answered nothing held `batch status` 261 s."""
    from runner.batch.database_url import with_connect_timeout

    assert with_connect_timeout("postgresql://a:b@h/q") == "postgresql://a:b@h/q?connect_timeout=10"
    assert (
        with_connect_timeout("postgres://h/q?sslmode=require")
        == "postgres://h/q?sslmode=require&connect_timeout=10"
    )
    assert with_connect_timeout("postgresql://h/q?connect_timeout=3") == "postgresql://h/q?connect_timeout=3"
    assert with_connect_timeout("sqlite:////tmp/q.sqlite") == "sqlite:////tmp/q.sqlite"


def test_a_database_that_cannot_be_opened_is_said_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """It came after DBOS's "Could not connect to postgres database to verify existence" warning and
    ended with SQLAlchemy's "(Background on this error at: …)" link."""
    from runner.cli.main import main

    assert main(["batch", "status", "x", "--db", "postgresql://a:secret@127.0.0.1:1/q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot open the batch database postgresql://a:***@127.0.0.1:1/q: ("), err
    assert len(err.splitlines()) == 1 and "Connection refused" in err, err


@pytest.mark.parametrize(
    ("argv", "timed"),
    [
        (["batch", "worker", "--server", "http://127.0.0.1:9"], True),
        (["batch", "submit", "j.jsonl", "--server", "http://127.0.0.1:9", "--wait"], True),
        (["batch", "submit", "j.jsonl", "--server", "http://127.0.0.1:9"], False),
        (["batch", "status", "b"], False),
        (["run", "w.json"], False),
    ],
)
def test_a_workers_log_lines_say_when(argv: list[str], timed: bool) -> None:
    """A worker runs for hours: its lines had no time, so how long an outage lasted could not be read."""
    from runner.cli.main import build_parser, log_format

    assert log_format(build_parser().parse_args(argv)).startswith("%(asctime)s ") is timed
