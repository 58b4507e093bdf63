"""``batch`` and ``bench`` against the real pinned server behind an authenticating reverse proxy
(:class:`~tests.auth_proxy.AuthProxy`): with ``--token`` (or ``$LEANVIDEO_TOKEN``) a batch runs there,
its prompt, websocket and downloads all through the proxy, and the token is written nowhere; without
it the command says the proxy answered 401; ``bench --server`` runs there with ``--header``. One job of
two steps each: the point is the path, not the work."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.batch_bench import write_jobs
from runner.cli.bench import main as bench_main
from runner.local.server import ComfyServer
from runner.local.workspace import REPO_ROOT
from tests.auth_proxy import AuthProxy
from tests.batch_helpers import batch_command, start_batch, wait_until

pytestmark = pytest.mark.integration

TOKEN = "s3cret-t0ken-for-the-proxy"
API_KEY = "k3y-for-the-proxy-0123"


def _batch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "LEANVIDEO_TOKEN"}
    return subprocess.run(
        batch_command(*args), cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**environ, **(env or {})},
    )  # fmt: skip


def _files_holding(folder: Path, secret: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_batch_runs_behind_a_proxy_with_the_token_and_writes_it_nowhere(
    comfy_server: ComfyServer, tmp_path: Path
) -> None:
    db = tmp_path / "db" / "queue.sqlite"
    db.parent.mkdir()
    with AuthProxy(comfy_server.url, token=TOKEN) as proxy:
        for name, given, env in (("flag", ["--token", TOKEN], None), ("env", [], {"LEANVIDEO_TOKEN": TOKEN})):
            jobs = write_jobs(tmp_path / f"{name}.jsonl", 1, steps=2, first_seed=9100)
            out = tmp_path / f"out-{name}"
            argv = ["submit", str(jobs), "--server", proxy.url, "--db", f"sqlite:///{db}", "--out", str(out)]
            done = _batch(*argv, "--wait", *given, env=env)
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"batch {name}: 1 succeeded, 0 did not" in done.stdout
            (record,) = [json.loads(p.read_text()) for p in out.glob("*/result.json")]
            assert record["status"] == "success" and record["server"] == proxy.url
            assert TOKEN not in done.stdout + done.stderr
        assert proxy.refused == 0
        assert {"POST /prompt", "GET /ws", "GET /view"} <= set(proxy.seen)  # all of it went through it
    manifest = tmp_path / "manifest"
    assert _batch("results", "flag", "--db", f"sqlite:///{db}", "--out", str(manifest)).returncode == 0
    assert _files_holding(tmp_path, TOKEN) == []  # job folders, manifest, the database and its WAL


def test_without_the_token_submit_and_worker_say_the_proxy_answered_401(
    comfy_server: ComfyServer, tmp_path: Path
) -> None:
    jobs = write_jobs(tmp_path / "none.jsonl", 1, steps=2)
    db_url = f"sqlite:///{tmp_path / 'queue.sqlite'}"
    with AuthProxy(comfy_server.url, token=TOKEN) as proxy:
        refused = _batch("submit", str(jobs), "--server", proxy.url, "--db", db_url, "--wait")
        assert refused.returncode == 4, refused.stdout + refused.stderr
        assert "answered 401" in refused.stderr
        log = tmp_path / "worker.log"
        worker = start_batch("worker", "--server", proxy.url, "--db", db_url, "--token", "wrong", log=log)
        try:
            wait_until(lambda: "check --token/--header" in log.read_text(), 60, "the worker's probe")
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    said = log.read_text()
    assert f"server {proxy.url} out (it answered 401: authentication refused; check --token/--header)" in said
    assert "no answer to GET /system_stats" not in said and "wrong" not in said.replace("--token", "")


def test_bench_runs_on_a_server_behind_a_proxy_with_a_header(
    second_comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the second server: the shared first one is left alone (RSS history, see test_bench_e2e)."""
    workflow = (REPO_ROOT / "workflows" / "ltxv_tiny_t2v.api.json").as_posix()
    matrix = tmp_path / "one.toml"
    matrix.write_text(
        f'[bench]\nworkflow = "{workflow}"\nwarmups = 0\nrepeats = 1\nmode = "warm"\n'
        '[[variant]]\nname = "base"\nset = ["9.steps=2"]\n',
        encoding="utf-8",
    )
    out = tmp_path / "bench"
    with AuthProxy(second_comfy_server.url, token=TOKEN, api_key=API_KEY) as proxy:
        base = [str(matrix), "--server", proxy.url, "--no-plots"]
        assert bench_main([*base, "--out", str(tmp_path / "refused")]) == 4
        assert "answered 401" in capsys.readouterr().err
        began = time.monotonic()
        code = bench_main([*base, "--out", str(out), "--header", f"X-Api-Key: {API_KEY}"])
        said = capsys.readouterr()
        assert code == 0, said.out + said.err
        assert "POST /prompt" in proxy.seen and proxy.refused == 1  # only the refused bench's check
    document = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    assert document["variants"][0]["total"]["n"] == 1
    assert _files_holding(out, API_KEY) == [] and API_KEY not in said.out + said.err
    print(f"bench through the proxy: {time.monotonic() - began:.1f} s")
