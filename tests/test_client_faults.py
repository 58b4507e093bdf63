"""Fault injection with a fake server: socket drops, a vanishing or restarted server, the history race,
garbage on the socket, timeouts, Ctrl-C and auth headers. Each run is submitted exactly once and each
output file downloaded exactly once."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from runner.errors import (
    OutputWriteError,
    PromptCancelledError,
    PromptFailedError,
    PromptLostError,
    PromptTimeoutError,
    ServerError,
    ServerUnreachableError,
    UsageError,
    WorkflowError,
)
from runner.jobs.run import RunOptions, run_workflow
from runner.local.ports import pick_free_port
from runner.tracking.events import ClientEvent
from runner.tracking.outputs import download_outputs
from runner.tracking.prompt import run_prompt
from runner.tracking.result import PromptResult
from runner.transport.client import ComfyClient
from runner.transport.retry import RetryPolicy
from tests.fake_server import OUTPUTS, VIDEO_BYTES, WORKFLOW, FakeComfy, now_ms
from tests.tcp_proxy import Cut, CuttingProxy


def msg(kind: str, prompt_id: str | None, **data: Any) -> dict[str, Any]:
    return {"type": kind, "data": {"prompt_id": prompt_id, **data} if prompt_id else data}


async def start_and_enter_node_2(fake: FakeComfy, pid: str) -> None:
    await fake.send(msg("execution_start", pid, timestamp=now_ms()))
    await fake.send(msg("execution_cached", pid, nodes=["1"], timestamp=now_ms()))
    await fake.send(msg("executing", pid, node="2", display_node="2"))
    await fake.send(msg("progress", pid, node="2", value=1, max=3))


async def vanish_in_node_2(fake: FakeComfy, pid: str) -> None:
    """The server goes away (killed: the OOM killer) while node 2 samples."""
    await start_and_enter_node_2(fake, pid)
    await fake.vanish()


async def finish_normally(fake: FakeComfy, pid: str) -> None:
    await fake.send(msg("progress", pid, node="2", value=2, max=3))
    await fake.send(msg("progress", pid, node="2", value=3, max=3))
    await fake.send(msg("executing", pid, node="3", display_node="3"))
    await fake.send(msg("executed", pid, node="3", output=OUTPUTS["3"]))
    await fake.send(msg("execution_success", pid, timestamp=now_ms()))
    fake.finish(pid)
    await fake.send(msg("executing", pid, node=None))


def client(fake: FakeComfy, **kwargs: Any) -> ComfyClient:
    return ComfyClient(fake.url, reconnect_timeout=kwargs.pop("reconnect_timeout", 5.0), **kwargs)


def assert_single_submission_and_download(fake: FakeComfy, result: PromptResult, tmp_path: Path) -> None:
    assert [call for call in fake.calls if call[0] == "POST /prompt"] == [("POST /prompt", result.prompt_id)]
    assert result.outputs == OUTPUTS
    with client(fake) as again:
        files = download_outputs(again, result.outputs, tmp_path / "run")
    assert len(files) == 1 and files[0].path.read_bytes() == VIDEO_BYTES
    assert files[0].sha256 == hashlib.sha256(VIDEO_BYTES).hexdigest()
    assert sum(1 for call in fake.calls if call[0] == "GET /view") == 1
    node_ids = [node.node_id for node in result.nodes]
    assert len(node_ids) == len(set(node_ids)), f"duplicated node timings: {node_ids}"


def test_socket_drop_while_the_prompt_finishes_is_reconciled_from_history(tmp_path: Path) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await start_and_enter_node_2(fake, pid)
        await fake.drop_sockets()
        await asyncio.sleep(0.05)
        fake.finish(pid)  # it finishes while the client is away: executing{node: null} is lost

    with FakeComfy(script) as fake, client(fake) as comfy:
        result = run_prompt(comfy, WORKFLOW, timeout=20)
        assert result.status == "success" and result.reconnects == 1
        assert result.server_seconds is not None and result.server_seconds > 0
        assert_single_submission_and_download(fake, result, tmp_path)


def test_socket_drop_mid_run_resumes_following_without_duplicates(tmp_path: Path) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await start_and_enter_node_2(fake, pid)
        await fake.drop_sockets()
        await fake.wait_for_socket()
        await asyncio.sleep(0.2)  # let the client reconcile first: the prompt is still running
        await fake.send({"type": "executing", "data": {"node": "2"}})  # ComfyUI's repeat on reconnect
        await finish_normally(fake, pid)

    with FakeComfy(script) as fake, client(fake) as comfy:
        result = run_prompt(comfy, WORKFLOW, timeout=20)
        assert result.status == "success" and result.reconnects == 1
        sampler = next(node for node in result.nodes if node.node_id == "2")
        assert sampler.steps == 3 and len(sampler.step_seconds) == 3
        assert [n.node_id for n in result.nodes] == ["1", "2", "3"]
        assert_single_submission_and_download(fake, result, tmp_path)


def test_a_vanished_server_raises_unreachable_with_a_partial_result() -> None:
    with (
        FakeComfy(vanish_in_node_2) as fake,
        client(fake, reconnect_timeout=0.8) as comfy,
        pytest.raises(ServerUnreachableError, match="could not reconnect") as caught,
    ):
        run_prompt(comfy, WORKFLOW, timeout=20)
    result = caught.value.result
    assert isinstance(result, PromptResult) and result.partial and result.status == "unreachable"
    assert caught.value.exit_code == 4
    assert result.error is not None and result.error["node_id"] == "2"  # it was running: the record says so
    assert result.error["class_type"] == WORKFLOW["2"]["class_type"]
    assert result.error["exception_type"] == "ServerUnreachableError"


def test_a_server_gone_when_the_timeout_runs_out_is_unreachable_not_a_timeout() -> None:
    """Killed mid-prompt (the OOM killer) with --timeout shorter than the reconnect window: it was said as
    a timeout whose cancel requests went unanswered (exit 7); it is a lost server (exit 4)."""
    with (
        FakeComfy(vanish_in_node_2) as fake,
        client(fake, reconnect_timeout=30) as comfy,
        pytest.raises(
            ServerUnreachableError, match=r"had not come back when the 1\.5 s timeout ran out"
        ) as caught,
    ):
        began = time.monotonic()
        run_prompt(comfy, WORKFLOW, timeout=1.5)
    assert time.monotonic() - began < 10  # within the timeout, not the reconnect window
    assert caught.value.exit_code == 4
    result = caught.value.result
    assert result.partial and result.status == "unreachable" and result.error["node_id"] == "2"


def test_a_server_restart_is_reported_as_a_lost_prompt() -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await start_and_enter_node_2(fake, pid)
        await fake.vanish()
        await asyncio.sleep(0.3)
        await fake.restart(forget=True)

    with FakeComfy(script) as fake, client(fake) as comfy:
        with pytest.raises(PromptLostError, match="restarted") as caught:
            run_prompt(comfy, WORKFLOW, timeout=20)
        assert sum(1 for call in fake.calls if call[0] == "POST /prompt") == 1
    assert caught.value.result.status == "lost"
    assert caught.value.result.error["node_id"] == "2"


def test_the_history_race_is_waited_out(tmp_path: Path) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await start_and_enter_node_2(fake, pid)
        await finish_normally(fake, pid)

    with FakeComfy(script, history_misses=3) as fake, client(fake) as comfy:
        result = run_prompt(comfy, WORKFLOW, timeout=20)
        assert sum(1 for call in fake.calls if call == ("GET /history", result.prompt_id)) >= 4
        assert_single_submission_and_download(fake, result, tmp_path)


def test_garbage_and_foreign_messages_are_ignored(tmp_path: Path) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        for junk in (
            b"\x00\x00\x00\x01\x89PNG preview bytes",
            "not json at all",
            "[1, 2, 3]",
            '{"type": 5}',
            '{"type": "progress", "data": "nope"}',
            msg("progress", pid, node="2", value="a", max=None),
            msg("crystools.monitor", None, cpu=3),
            msg("executing", "someone-else", node=None),
            msg("execution_error", "someone-else", node_id="9", exception_message="not ours"),
        ):
            await fake.send(junk)
        await start_and_enter_node_2(fake, pid)
        await fake.send(msg("executed", "someone-else", node="3", output={"images": [{"filename": "x"}]}))
        await finish_normally(fake, pid)

    with FakeComfy(script) as fake, client(fake) as comfy:
        result = run_prompt(comfy, WORKFLOW, timeout=20)
        assert result.status == "success" and result.error is None and result.reconnects == 0
        assert_single_submission_and_download(fake, result, tmp_path)


def test_a_timeout_while_queued_says_the_prompt_never_started() -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        return None  # queued behind other work: it never starts

    with FakeComfy(script) as fake, client(fake) as comfy, pytest.raises(PromptTimeoutError) as caught:
        run_prompt(comfy, WORKFLOW, timeout=0.5)
    assert "it was still waiting in the server's queue, and was removed from it" in str(caught.value)
    result = caught.value.result
    assert result.started_at is None and result.queue_seconds == pytest.approx(result.wall_seconds)


def test_timeout_cancels_the_prompt_on_the_server() -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await start_and_enter_node_2(fake, pid)  # then nothing: the node never ends

    with FakeComfy(script) as fake, client(fake) as comfy:
        with pytest.raises(PromptTimeoutError) as caught:
            run_prompt(comfy, WORKFLOW, timeout=0.5)
        pid = caught.value.result.prompt_id
        assert ("POST /queue", {"delete": [pid]}) in fake.calls
        assert ("POST /interrupt", {"prompt_id": pid}) in fake.calls
    assert caught.value.result.partial and caught.value.result.status == "timeout"
    assert caught.value.exit_code == 7
    # the node cut short is in the partial record, timed up to the timeout, with the step it made of 3
    running = caught.value.result.nodes[-1]
    assert (running.node_id, running.steps, len(running.step_seconds)) == ("2", 3, 1)
    assert 0.2 < running.seconds < 10


def test_ctrl_c_interrupts_and_dequeues_and_keeps_a_partial_result() -> None:
    def press_ctrl_c_on_first_step(event: ClientEvent) -> None:
        if event.kind == "step":
            raise KeyboardInterrupt

    with FakeComfy(start_and_enter_node_2) as fake, client(fake) as comfy:
        with pytest.raises(PromptCancelledError) as caught:
            run_prompt(comfy, WORKFLOW, timeout=20, on_event=press_ctrl_c_on_first_step)
        result = caught.value.result
        assert ("POST /interrupt", {"prompt_id": result.prompt_id}) in fake.calls
        assert ("POST /queue", {"delete": [result.prompt_id]}) in fake.calls
    assert caught.value.exit_code == 130
    assert result.partial and result.status == "cancelled"
    assert [n.node_id for n in result.nodes if n.cached] == ["1"]
    assert result.error is not None and result.error["message"] == "cancelled while node 2 was running"


def test_a_handler_that_raises_cancels_the_prompt_and_leaves_no_empty_run_folder(tmp_path: Path) -> None:
    """An embedding application's event handler that fails (or its SIGTERM handler's SystemExit) used
    to leave the prompt running on the server and an empty run folder behind."""

    class AppError(RuntimeError):
        pass

    def fail_on_first_step(event: ClientEvent) -> None:
        if event.kind == "step":
            raise AppError("the app's progress bar broke")

    with FakeComfy(start_and_enter_node_2) as fake, client(fake) as comfy:
        with pytest.raises(AppError):
            run_prompt(comfy, WORKFLOW, timeout=20, on_event=fail_on_first_step)
        [(_, body)] = [call for call in fake.calls if call[0] == "POST /interrupt"]
        assert ("POST /queue", {"delete": [body["prompt_id"]]}) in fake.calls
        workflow = tmp_path / "wf.json"
        workflow.write_text(json.dumps(WORKFLOW), encoding="utf-8")
        options = RunOptions(server=fake.url, out_dir=tmp_path / "out" / "runs", validate=False)
        with pytest.raises(AppError):
            run_workflow(workflow, options, fail_on_first_step)

        def stop_with_our_own_error(event: ClientEvent) -> None:  # a runner error, raised by the handler
            if event.kind == "step":
                raise OutputWriteError("the app's log is full")

        interrupts = sum(call[0] == "POST /interrupt" for call in fake.calls)
        with pytest.raises(OutputWriteError):
            run_prompt(comfy, WORKFLOW, timeout=20, on_event=stop_with_our_own_error)
        assert sum(call[0] == "POST /interrupt" for call in fake.calls) == interrupts + 1
        unsendable = {**WORKFLOW, "9": {"class_type": "X", "inputs": {"seed": float("inf")}}}
        with pytest.raises(ValueError):  # refused by the HTTP client before anything is sent
            run_prompt(comfy, unsendable, timeout=20)
        assert sum(call[0] == "POST /interrupt" for call in fake.calls) == interrupts + 1  # none for it
    assert not (tmp_path / "out").exists()


def test_a_prompt_that_sends_nothing_can_still_be_stopped_by_its_handler() -> None:
    """Queued behind another client's prompts, or in a node that reports no progress, a prompt sends no
    event of its own: ``waiting`` events (one per quiet second) give a stopping handler (bench load
    Ctrl-C, batch cancel) its turn."""

    async def queued_forever(fake: FakeComfy, pid: str) -> None:
        return None  # accepted, then silence

    seen: list[str] = []

    def stop_after_two_quiet_seconds(event: ClientEvent) -> None:
        seen.append(event.kind)
        if seen.count("waiting") == 2:
            raise KeyboardInterrupt

    with FakeComfy(queued_forever) as fake, client(fake) as comfy:
        began = time.monotonic()
        with pytest.raises(PromptCancelledError) as caught:
            run_prompt(comfy, WORKFLOW, timeout=30, on_event=stop_after_two_quiet_seconds)
        assert time.monotonic() - began < 10
        assert ("POST /queue", {"delete": [caught.value.result.prompt_id]}) in fake.calls
    assert set(seen) == {"waiting"}


def test_token_and_headers_reach_http_and_the_websocket() -> None:
    with FakeComfy(lambda fake, pid: finish_normally(fake, pid)) as fake:
        with client(fake, token="s3cret", headers={"X-Trace": "1"}) as comfy:
            run_prompt(comfy, WORKFLOW, timeout=20)
        assert ("auth /ws", "Bearer s3cret") in fake.calls
        assert ("auth /prompt", "Bearer s3cret") in fake.calls


def test_run_workflow_over_a_dropped_socket_keeps_one_file_and_reads_telemetry(tmp_path: Path) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await start_and_enter_node_2(fake, pid)
        await fake.drop_sockets()
        await fake.wait_for_socket()
        await finish_normally(fake, pid)

    path = tmp_path / "wf.json"
    path.write_text(json.dumps(WORKFLOW))
    with FakeComfy(script) as fake:
        run = RunOptions(server=fake.url, out_dir=tmp_path / "out", validate=False, overrides=("2.seed=5",))
        outcome = run_workflow(path, run)
        assert sum(1 for call in fake.calls if call[0] in ("POST /prompt", "GET /view")) == 2
    files = sorted(p.name for p in outcome.record_path.parent.iterdir())
    assert files == ["clip_00001_.mp4", "run.json"]
    record = outcome.record
    assert record["status"] == "success" and record["timing"]["reconnects"] == 1
    assert record["seeds"] == {"2.seed": 5}
    assert record["telemetry"] == {
        "available": True,
        "prompt_id": outcome.result.prompt_id,
        "peak_rss_bytes": 123456,
        "energy_j": None,
    }


def test_an_execution_error_writes_a_record_naming_the_node(tmp_path: Path) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        await start_and_enter_node_2(fake, pid)
        error = {"node_id": "2", "node_type": "KSampler", "exception_type": "RuntimeError"}
        await fake.send(msg("execution_error", pid, **error, exception_message="boom", timestamp=now_ms()))
        fake.finish(pid, status="error", outputs={})
        await fake.send(msg("executing", pid, node=None))

    path = tmp_path / "wf.json"
    path.write_text(json.dumps(WORKFLOW))
    with FakeComfy(script) as fake, pytest.raises(PromptFailedError, match=r"node 2 \(KSampler\)") as caught:
        run_workflow(path, RunOptions(server=fake.url, out_dir=tmp_path / "out", validate=False))
    assert caught.value.exit_code == 6
    record = json.loads(Path(caught.value.record_path).read_text())
    assert record["status"] == "error" and record["outputs"] == []
    assert record["error"] == {
        "node_id": "2",
        "class_type": "KSampler",
        "exception_type": "RuntimeError",
        "message": "boom",
    }
    assert record["telemetry"]["available"] is True


def test_post_json_and_routes_the_server_lacks() -> None:
    """``post_json`` sends the body and refuses a non-2xx answer; ``missing_ok`` turns a GET 404 into None."""

    async def no_prompt(fake: FakeComfy, pid: str) -> None:
        raise AssertionError("nothing is submitted here")

    with FakeComfy(no_prompt) as fake, client(fake) as comfy:
        comfy.post_json("/interrupt", {"prompt_id": "p-0"})
        assert fake.calls == [("POST /interrupt", {"prompt_id": "p-0"})]
        with pytest.raises(ServerError, match=r"POST .*/free answered 404"):
            comfy.post_json("/free", {"free_memory": True})
        assert comfy.get_json("/leanvideo/queue", missing_ok=True) is None
        with pytest.raises(ServerError, match=r"GET .*/leanvideo/queue answered 404"):
            comfy.get_json("/leanvideo/queue")


@pytest.mark.parametrize(
    ("content_type", "text", "said"),
    [
        ("text/html", "<html><body>400 Bad Request</body></html>", "a web page, not ComfyUI's API"),
        ("application/json", '{"error": "request blocked by WAF"}', "request blocked by WAF"),
        ("application/json", "[1, 2]", "[1, 2]"),
    ],
)
def test_a_400_that_is_not_comfyuis_report_is_a_server_error(content_type: str, text: str, said: str) -> None:
    async def no_prompt(fake: FakeComfy, pid: str) -> None:
        raise AssertionError("the prompt is never queued")

    with FakeComfy(no_prompt) as fake, client(fake) as comfy:
        fake.prompt_answer = (400, content_type, text)
        with pytest.raises(ServerError, match="answered 400 without ComfyUI's report") as caught:
            comfy.submit(WORKFLOW)
        assert said in str(caught.value) and not isinstance(caught.value, WorkflowError)
        fake.prompt_answer = (
            400,
            "application/json",
            json.dumps({"error": {"message": "bad"}, "node_errors": {}}),
        )
        with pytest.raises(WorkflowError, match="server rejected the workflow: bad"):
            comfy.submit(WORKFLOW)


def test_a_cut_prompt_post_that_reached_the_server_is_not_sent_again(tmp_path: Path) -> None:
    """Connection 0 is the websocket, 1 carries POST /prompt: its answer is cut after 10 bytes, once the
    server has queued the prompt. The client asks /queue and /history instead of posting it again."""

    async def script(fake: FakeComfy, pid: str) -> None:
        await asyncio.sleep(0.8)  # still queued when the client asks, after its settle time
        await start_and_enter_node_2(fake, pid)
        await finish_normally(fake, pid)

    schedule = [Cut(), Cut(after_bytes=10), Cut()]
    with (
        FakeComfy(script) as fake,
        CuttingProxy(("127.0.0.1", fake.port), schedule) as proxy,
        ComfyClient(proxy.url, reconnect_timeout=5.0) as comfy,
    ):
        result = run_prompt(comfy, WORKFLOW, timeout=20)
        assert comfy.retries_made >= 1
        assert result.status == "success" and proxy.cuts == 1
        assert [call for call in fake.calls if call[0] == "POST /prompt"] == [
            ("POST /prompt", result.prompt_id)
        ]


def test_a_download_cut_in_the_middle_of_the_body_starts_again_and_keeps_one_file(tmp_path: Path) -> None:
    async def script(fake: FakeComfy, pid: str) -> None:
        fake.finish(pid)

    # the /view answer is cut inside its body on the first connection, whole on the next
    schedule = [Cut(after_bytes=len(VIDEO_BYTES) // 2), Cut()]
    with (
        FakeComfy(script) as fake,
        CuttingProxy(("127.0.0.1", fake.port), schedule) as proxy,
        ComfyClient(proxy.url) as comfy,
    ):
        files = download_outputs(comfy, OUTPUTS, tmp_path / "run")
        assert comfy.retries_made == 1
    assert proxy.cuts == 1 and [f.path.name for f in files] == ["clip_00001_.mp4"]
    assert files[0].path.read_bytes() == VIDEO_BYTES and sorted((tmp_path / "run").iterdir()) == [
        files[0].path
    ]


def test_retries_stop_at_the_count_and_at_the_deadline() -> None:
    url = f"http://127.0.0.1:{pick_free_port()}"  # nothing listens there
    with ComfyClient(url, retry=RetryPolicy(retries=2, base_delay_s=0.01)) as comfy:
        with pytest.raises(ServerError, match=r"/system_stats after 3 attempts"):
            comfy.get_json("/system_stats")
        assert comfy.retries_made == 2
    with ComfyClient(url, retry=RetryPolicy(retries=50), deadline=time.monotonic() + 0.5) as comfy:
        began = time.monotonic()
        with pytest.raises(ServerError, match="cannot reach ComfyUI"):
            comfy.get_json("/queue")
        assert time.monotonic() - began < 3  # not 50 retries of up to 2 s each
    with pytest.raises(ValueError, match="retries must be ≥ 0"):
        RetryPolicy(retries=-1)
    assert [RetryPolicy().ceiling(n) for n in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_a_server_that_takes_connections_and_never_answers_is_bounded_by_the_deadline(
    tmp_path: Path,
) -> None:
    """A hung server (or a proxy holding the connection): each request waited its 30 s, whatever
    ``--timeout`` said. Fault injection a real server cannot give: a socket that accepts, then is
    silent."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        assert ComfyClient(url)._timeout_now() == 30.0
        assert ComfyClient(url, deadline=time.monotonic() + 2)._timeout_now() <= 2.0
        assert ComfyClient(url, deadline=time.monotonic() - 5)._timeout_now() == 1.0  # a last request
        workflow = tmp_path / "wf.json"
        workflow.write_text(json.dumps(WORKFLOW), encoding="utf-8")
        options = RunOptions(server=url, out_dir=tmp_path / "out", timeout=2.0, retries=0)
        began = time.monotonic()
        with pytest.raises(ServerError, match=r"/object_info: it took the connection but did not answer"):
            run_workflow(workflow, options)
        assert time.monotonic() - began < 15  # not the 30 s of one request


def test_a_timed_out_request_is_not_retried_and_says_how_long_it_waited() -> None:
    """With no deadline (`run` without --timeout), a hung server held each request 30 s and retried it 5
    times: 3 minutes, then "timed out". A timeout is no cut, so it ends the request at once, saying what
    was waited for. Fault injection a real server cannot give: a socket that accepts, then is silent."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with ComfyClient(url, http_timeout=0.5, retry=RetryPolicy(retries=5)) as comfy:
            began = time.monotonic()
            with pytest.raises(ServerError) as caught:
                comfy.get_json("/object_info")
            assert time.monotonic() - began < 2.0  # one wait of 0.5 s, not six
            assert str(caught.value) == (
                f"cannot reach ComfyUI at {url}/object_info: it took the connection but did not answer "
                "within 0.5 s (a hung or paused server?)"
            )
            assert comfy.retries_made == 0
            with pytest.raises(ServerError, match=r"answer within 0\.5 s .*may still run prompt p-1$"):
                comfy.submit(dict(WORKFLOW), prompt_id="p-1")
            assert time.monotonic() - began < 4.0


def test_settings_a_library_user_gets_wrong_are_usage_errors_said_at_once() -> None:
    """`ComfyClient("localhost:8188")` retried six times before saying the URL had no scheme, a
    non-ASCII token failed at the first request, and settings raised a plain ValueError outside the
    runner's error tree."""
    began = time.monotonic()
    with pytest.raises(UsageError, match="server must be an http:// or https:// URL, got 'localhost:8188'"):
        ComfyClient("localhost:8188")
    assert time.monotonic() - began < 1
    with pytest.raises(UsageError, match="the token: HTTP headers carry ASCII only"):
        ComfyClient("http://127.0.0.1:9", token="café")
    with pytest.raises(UsageError, match="header 'X-Name': HTTP headers carry ASCII only"):
        ComfyClient("http://127.0.0.1:9", headers={"X-Name": "é"})
    for bad in ({"timeout": 0}, {"retries": -1}, {"server": "ftp://x"}):
        with pytest.raises(UsageError) as caught:
            RunOptions(**bad)  # type: ignore[arg-type]
        assert isinstance(caught.value, ValueError) and caught.value.exit_code == 2


def test_a_download_stopped_or_failed_after_the_prompt_finished_leaves_a_partial_record_and_no_cut_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C or SIGTERM during the download left a cut-off MP4 under its own name and no run.json
    (`--json` printed a bare error); a server gone during it left an empty run folder."""
    import runner.tracking.outputs as outputs

    path = tmp_path / "wf.json"
    path.write_text(json.dumps(WORKFLOW))
    real = outputs._stream_once

    def stopped_midway(client: Any, item: dict[str, Any], target: Path) -> int:
        target.write_bytes(b"\0" * 1024)  # the first megabyte of a large video, say
        raise KeyboardInterrupt

    with FakeComfy(lambda fake, pid: finish_normally(fake, pid)) as fake:
        monkeypatch.setattr(outputs, "_stream_once", stopped_midway)
        with pytest.raises(PromptCancelledError, match="finished on the server; the download") as caught:
            run_workflow(path, RunOptions(server=fake.url, out_dir=tmp_path / "out", validate=False))
        run_dir = Path(caught.value.record_path).parent
        assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]  # no cut-off clip_00001_.mp4
        record = json.loads(Path(caught.value.record_path).read_text())
        assert record["partial"] is True and record["status"] == "success" and record["outputs"] == []
        assert record["error"]["message"].startswith("outputs not all downloaded (0 were): prompt ")

        def gone(client: Any, item: dict[str, Any], target: Path) -> int:
            raise ServerError("GET /view for 'clip_00001_.mp4' answered 500")

        monkeypatch.setattr(outputs, "_stream_once", gone)
        with pytest.raises(ServerError, match="answered 500") as failed:
            run_workflow(path, RunOptions(server=fake.url, out_dir=tmp_path / "again", validate=False))
        assert failed.value.record_path is not None and failed.value.exit_code == 4
        monkeypatch.setattr(outputs, "_stream_once", real)


def test_a_stalled_download_is_tried_again_where_other_timeouts_are_not() -> None:
    """A download whose server paused mid-body (SIGSTOP) timed out once and the finished prompt's run
    failed; other requests still end at their first timeout (a hung server must not hold `run`)."""
    import httpx

    calls: list[int] = []

    def stalls_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ReadTimeout("timed out")
        return "the file"

    with ComfyClient("http://127.0.0.1:9", retry=RetryPolicy(retries=3, base_delay_s=0.01)) as comfy:
        fail = lambda error, attempts: ServerError(str(error))  # noqa: E731
        assert comfy.retrying("GET /view", stalls_once, (httpx.TransportError,), fail, retry_timeouts=True)
        assert len(calls) == 2
        calls.clear()
        with pytest.raises(ServerError, match="timed out"):
            comfy.retrying("GET /queue", stalls_once, (httpx.TransportError,), fail)
        assert len(calls) == 1


def test_the_cancel_requests_of_a_stop_wait_seconds_not_minutes_on_a_paused_server() -> None:
    """SIGTERM to `run` while its server was paused (SIGSTOP): each cancel request waited its 30 s, and
    the command outlived a supervisor's grace (docker stop, timeout -k) by minutes. Fault injection a
    real server cannot give on demand: a socket that accepts, then is silent."""
    import socket

    from runner.tracking.events import PromptTracker
    from runner.tracking.prompt import _abandon

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        tracker = PromptTracker("p-1", dict(WORKFLOW))
        with ComfyClient(url) as comfy:  # its own requests wait 30 s
            began = time.monotonic()
            result, stopped = _abandon(comfy, tracker, time.time(), began, 0, "cancelled")
    assert time.monotonic() - began < 10  # two cancel requests and a last look, 2 s each at most
    assert not stopped and result.partial and result.status == "cancelled"
