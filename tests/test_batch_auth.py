"""``--token`` and ``--header`` of ``batch`` and ``bench``, for servers behind an authenticating proxy: parsed
and checked as ``run``'s, sent by every request a worker makes to its own servers (probes, attempts,
prompts taken off) and to no other server, and a proxy's 401 said as such by the pool. The servers
here are the scripted fake behind :class:`~tests.auth_proxy.AuthProxy`; the real server's turn is in
``test_batch_auth_e2e.py``."""

from __future__ import annotations

import logging

import pytest

from runner.batch.orphans import cancel_left_prompts
from runner.batch.pool import NO_ANSWER, ServerPool, probe_server
from runner.cli.main import build_parser
from runner.cli.server_options import UsageExit, request_headers
from tests.auth_proxy import AuthProxy
from tests.fake_server import FakeComfy

TOKEN = "t0ken-of-the-proxy"


async def _nothing(fake: FakeComfy, pid: str) -> None:
    return None


@pytest.mark.parametrize(
    "argv",
    [
        ["batch", "submit", "jobs.jsonl", "--server", "http://127.0.0.1:1"],
        ["batch", "worker", "--server", "http://127.0.0.1:1"],
        ["batch", "cancel", "b"],
        ["bench", "m.toml", "--server", "http://127.0.0.1:1"],
    ],
)
def test_batch_and_bench_take_token_and_headers_as_run_does(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEANVIDEO_TOKEN", raising=False)
    args = build_parser().parse_args(
        [*argv, "--token", TOKEN, "--header", "X-Api-Key: k1", "--header", "X-B:2"]
    )
    assert request_headers(args) == {"X-Api-Key": "k1", "X-B": "2", "Authorization": f"Bearer {TOKEN}"}
    monkeypatch.setenv("LEANVIDEO_TOKEN", "from-env")
    assert request_headers(build_parser().parse_args(argv)) == {"Authorization": "Bearer from-env"}


def test_a_header_or_token_that_cannot_be_sent_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    worker = ["batch", "worker", "--server", "http://127.0.0.1:1"]
    with pytest.raises(UsageExit):
        build_parser().parse_args([*worker, "--header", "X-Key: a\nb"])
    assert "a line break" in capsys.readouterr().err
    with pytest.raises(UsageExit) as refused:
        request_headers(build_parser().parse_args([*worker, "--token", "café"]))
    assert "ASCII only" in refused.value.message


def test_the_pool_sends_its_headers_to_its_own_servers_only() -> None:
    pool = ServerPool(["http://localhost:8188"], headers={"Authorization": "Bearer x"})
    assert pool.headers_for("http://127.0.0.1:8188/") == {"Authorization": "Bearer x"}
    assert pool.headers_for("http://127.0.0.1:8189") == {}  # another worker's server: no credential


def test_a_server_refusing_the_token_is_said_as_401_not_as_silent(caplog: pytest.LogCaptureFixture) -> None:
    with FakeComfy(_nothing) as fake, AuthProxy(fake.url, token=TOKEN) as proxy:
        assert probe_server(proxy.url, headers={"Authorization": f"Bearer {TOKEN}"}) is True
        refused = probe_server(proxy.url)
        assert refused == "it answered 401: authentication refused; check --token/--header"
        with caplog.at_level(logging.WARNING, logger="runner.batch.pool"):
            pool = ServerPool([proxy.url], headers={"Authorization": "Bearer wrong"})
            pool._run_probe(pool._states[proxy.url])
        assert probe_server(fake.url.replace(str(fake.port), "1")) == NO_ANSWER  # nothing listens there
    assert f"server {proxy.url} out (it answered 401: authentication refused" in caplog.text
    assert NO_ANSWER not in caplog.text


def test_a_stopping_worker_takes_its_prompts_off_with_its_headers() -> None:
    with FakeComfy(_nothing) as fake, AuthProxy(fake.url, token=TOKEN) as proxy:
        pool = ServerPool([proxy.url], headers={"Authorization": f"Bearer {TOKEN}"})
        fake.running.add("p-1")  # still on the server: asked of /queue first
        cancel_left_prompts({"p-1": proxy.url}, "w-1", pool.headers_for)
        assert proxy.refused == 0
        assert [call[0] for call in fake.calls] == ["POST /queue", "POST /interrupt"]
