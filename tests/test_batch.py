"""`leanvideo batch` over real pinned servers and the tiny model, on the default SQLite queue: a bad
jobs file queues nothing; a batch spreads over two servers with a correct manifest; the submitting
process SIGKILLed mid-batch and started again finishes every job exactly once; a server SIGKILLed
mid-job has its job finished on the other server."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from benchmarks.batch_bench import write_jobs
from runner.cli.main import main
from runner.install.pin import sha256_file
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import Workspace
from tests.batch_helpers import (
    assert_exactly_once,
    history_ids,
    jobs_of,
    run_batch,
    start_batch,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_a_malformed_jobs_file_is_refused_naming_its_lines_and_nothing_is_queued(
    comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = write_jobs(tmp_path / "jobs.jsonl", 3)
    lines = jobs.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].replace('"LTXV Scheduler.steps": 8', '"LTXV Scheduler.steps": 100000')
    lines[2] = lines[2].replace("Sample.noise_seed", "Sample.noise_sede")
    jobs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    db = tmp_path / "queue.sqlite"
    argv = ["batch", "submit", str(jobs), "--server", comfy_server.url, "--db", f"sqlite:///{db}"]
    code = main([*argv, "--out", str(tmp_path / "out"), "--wait"])
    err = capsys.readouterr().err
    assert code == 5, err
    assert "2 problem(s); nothing was queued" in err
    assert "line 2: set 'LTXV Scheduler.steps'" in err and "100000 is above the maximum" in err
    assert "line 3: set 'Sample.noise_sede'" in err and "close inputs: noise_seed" in err
    assert not db.exists() and not (tmp_path / "out").exists()  # no queue was even opened


def test_a_batch_spreads_over_two_servers_and_its_manifest_lists_every_file(
    comfy_server: ComfyServer, second_comfy_server: ComfyServer, tmp_path: Path
) -> None:
    servers = [comfy_server.url, second_comfy_server.url]
    db_url, out = f"sqlite:///{tmp_path / 'queue.sqlite'}", tmp_path / "out"
    jobs_file = write_jobs(tmp_path / "four.jsonl", 4, first_seed=7000)
    submit = ["submit", str(jobs_file), "--db", db_url, "--out", str(out), "--wait"]
    done = run_batch(*submit, "--server", servers[0], "--server", servers[1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "batch four: 4 succeeded, 0 did not" in done.stdout
    assert f"job folders in {out.resolve()}" in " ".join(done.stdout.split())
    last = done.stderr.splitlines(keepends=True)[-1]  # the progress view's last line (not a terminal)
    assert last.startswith(tuple(servers)) and last.endswith("0\n"), repr(last)
    said = [line for line in done.stderr.splitlines() if " finished (" in line]  # as it went, timed
    assert re.match(r"\d\d:\d\d:\d\d batch four: 0/4 finished \(0 succeeded, 0 failed\)", said[0]), (
        done.stderr
    )
    ended = " batch four: 4/4 finished (4 succeeded, 0 failed), 0 running on servers, 0 waiting"
    assert any(line.endswith(ended) for line in said), said
    assert all(int(line.split(", ")[-2].split()[0]) <= 2 for line in said)  # two servers, one slot each
    records = assert_exactly_once(jobs_of(db_url, "four"), out, 4)
    assert {r["server"] for r in records} == set(servers)
    assert all(r["attempts"] == 1 and r["server_seconds"] > 0 for r in records)

    manifest_dir = tmp_path / "manifest"
    shown = run_batch("results", "four", "--db", db_url, "--out", str(manifest_dir))
    assert shown.returncode == 0, shown.stderr
    manifest = json.loads((manifest_dir / "results.json").read_text(encoding="utf-8"))
    assert manifest["counts"] == {"success": 4}
    rows = {row["job_id"]: row for row in manifest["jobs"]}
    for record in records:
        (video,) = rows[record["job_id"]]["files"]
        assert video["sha256"] == sha256_file(Path(video["path"])) == record["files"][0]["sha256"]
    with (manifest_dir / "results.csv").open(encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    assert sorted(r["job_id"] for r in table) == sorted(rows)
    assert all(r["status"] == "success" and r["server"] in servers and r["attempts"] == "1" for r in table)

    again = run_batch(*submit, "--server", servers[0], "--server", servers[1])  # idempotent: nothing new
    assert again.returncode == 0 and "0 newly queued" in again.stderr, again.stderr
    queue_only = [arg for arg in submit if arg != "--wait"]
    listed = run_batch(*queue_only, "--server", servers[0], "--json")  # without --wait: what was queued
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"batch": "four", "jobs": 4, "newly_queued": 0}
    ended = run_batch(*submit, "--server", servers[0], "--json")  # with --wait: how the jobs ended
    assert ended.returncode == 0 and json.loads(ended.stdout)["counts"] == {"success": 4}, ended.stdout
    after = jobs_of(db_url, "four")
    assert sorted(j.record["prompt_id"] for j in after if j.record) == sorted(r["prompt_id"] for r in records)


def test_the_submitter_killed_mid_batch_and_started_again_finishes_every_job_exactly_once(
    comfy_server: ComfyServer, second_comfy_server: ComfyServer, tmp_path: Path
) -> None:
    servers = [comfy_server.url, second_comfy_server.url]
    before = history_ids(servers[0]) | history_ids(servers[1])
    db_url, out = f"sqlite:///{tmp_path / 'queue.sqlite'}", tmp_path / "out"
    jobs_file = write_jobs(tmp_path / "six.jsonl", 6, steps=16, first_seed=8000)
    argv = ["submit", str(jobs_file), "--db", db_url, "--out", str(out), "--wait"]
    argv += ["--server", servers[0], "--server", servers[1]]
    first = start_batch(*argv, log=tmp_path / "first.log")
    try:
        wait_until(lambda: len(list(out.glob("job-*/result.json"))) >= 2, 240, "two finished jobs")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finished = {p.parent.name: (p.stat().st_ino, p.read_bytes()) for p in out.glob("job-*/result.json")}
    videos = {p.parent.name: (p.stat().st_ino, sha256_file(p)) for p in out.glob("job-*/*.mp4")}
    assert 2 <= len(finished) < 6, f"{len(finished)} jobs finished before the kill"

    second = run_batch(*argv, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    records = assert_exactly_once(jobs_of(db_url, "six"), out, 6)
    for job_id, (inode, content) in finished.items():  # what was done before the kill is untouched
        path = out / job_id / "result.json"
        assert (path.stat().st_ino, path.read_bytes()) == (inode, content)
    for job_id, (inode, digest) in videos.items():
        (video,) = (out / job_id).glob("*.mp4")
        assert (video.stat().st_ino, sha256_file(video)) == (inode, digest)
    ran = (history_ids(servers[0]) | history_ids(servers[1])) - before
    assert {r["prompt_id"] for r in records} <= ran
    # finished jobs were not run again; only those in flight at the kill (≤ 1 per server) ran twice
    assert 6 <= len(ran) <= 6 + len(servers), len(ran)
    # and their records count the attempt that died with the submitter (a prompt noted but not yet
    # submitted is counted too: it cannot be told from one the server had already finished)
    lost = [r for r in records if r["attempt_log"][0]["status"] == "lost"]
    assert all(r["attempts"] == len(r["attempt_log"]) for r in records)
    assert len(ran) - 6 <= len(lost) <= len(servers), [r["attempt_log"] for r in records]


def test_a_server_killed_mid_job_has_its_job_finished_on_the_other_server(
    workspace: Workspace, comfy_server: ComfyServer, tmp_path: Path
) -> None:
    victim = ComfyServer(ServerConfig.in_workspace(workspace, tmp_path / "victim", cpu=True))
    victim.start()
    db_url, out = f"sqlite:///{tmp_path / 'queue.sqlite'}", tmp_path / "out"
    jobs_file = write_jobs(tmp_path / "two.jsonl", 2, steps=30, first_seed=9000)
    argv = ["submit", str(jobs_file), "--db", db_url, "--out", str(out), "--wait", "--health-timeout", "3"]
    submitter = start_batch(*argv, "--server", victim.url, "--server", comfy_server.url, log=tmp_path / "log")
    try:
        wait_until(
            lambda: httpx.get(f"{victim.url}/queue", timeout=10).json()["queue_running"],
            120,
            "a job on the victim",
        )
        assert victim.pid is not None
        os.killpg(victim.pid, signal.SIGKILL)
        assert submitter.wait(timeout=300) == 0, (tmp_path / "log").read_text(encoding="utf-8")[-3000:]
    finally:
        victim.stop()
        if submitter.poll() is None:
            os.killpg(submitter.pid, signal.SIGKILL)
    records = assert_exactly_once(jobs_of(db_url, "two"), out, 2)
    (moved,) = [r for r in records if r["attempts"] == 2]
    assert moved["server"] == comfy_server.url
    assert [(a["server"], a["fault"]) for a in moved["attempt_log"]] == [
        (victim.url, "server"),
        (comfy_server.url, None),
    ]
    (stayed,) = [r for r in records if r["attempts"] == 1]
    assert stayed["server"] == comfy_server.url


def test_submit_wait_json_stopped_prints_one_json_document(comfy_server: ComfyServer, tmp_path: Path) -> None:
    """Stopped (SIGINT), it printed where the batch ended as JSON and then the interruption's error:
    two documents on stdout, which `json.loads` refuses. The batch's state goes to stderr in words."""
    import subprocess

    from tests.batch_helpers import batch_command

    jobs_file = write_jobs(tmp_path / "long.jsonl", 1, steps=1000, first_seed=31_000)  # long enough
    db_url, out = f"sqlite:///{tmp_path / 'queue.sqlite'}", tmp_path / "out"
    argv = ["submit", str(jobs_file), "--db", db_url, "--out", str(out), "--wait", "--json", "--grace", "0"]
    submitter = subprocess.Popen(
        batch_command(*argv, "--server", comfy_server.url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: httpx.get(f"{comfy_server.url}/queue", timeout=10).json()["queue_running"],
            120,
            "the job on the server",
        )
        os.killpg(submitter.pid, signal.SIGINT)
        stdout, stderr = submitter.communicate(timeout=120)
    finally:
        if submitter.poll() is None:
            os.killpg(submitter.pid, signal.SIGKILL)
    assert submitter.returncode == 130, stderr.decode()[-2000:]
    document = json.loads(stdout)  # one document
    assert document["error"]["type"] == "KeyboardInterrupt", document
    assert "batch long: 0 succeeded, 1 did not" in stderr.decode(), stderr.decode()[-2000:]
