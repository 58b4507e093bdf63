"""`leanvideo run` exit codes and partial records on faults, against the fake server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cli.main import main
from tests.fake_server import WORKFLOW, FakeComfy, now_ms


async def never_finishes(fake: FakeComfy, pid: str) -> None:
    await fake.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": now_ms()}})
    await fake.send({"type": "executing", "data": {"prompt_id": pid, "node": "2"}})


def test_a_timeout_exits_7_and_prints_the_partial_record_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(WORKFLOW))
    with FakeComfy(never_finishes) as fake:
        command = ["run", str(path), "--server", fake.url, "--no-validate", "--json", "--timeout", "0.5"]
        code = main([*command, "--out", str(tmp_path / "out"), "--header", "X-Trace: 1"])
    captured = capsys.readouterr()
    assert code == 7
    record = json.loads(captured.out)
    assert record["status"] == "timeout" and record["partial"]
    assert record["error"]["node_id"] == "2" and record["error"]["class_type"] == "KSampler"
    assert "did not finish within 0.5 s" in captured.err and "partial run record" in captured.err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad_args = (
        ["--header", "no-colon"],
        ["--header", "X-Name: café"],
        ["--header", "X-Trace: 1\r\nX-Injected: 2"],
        ["--header", "X Trace: 1"],
        ["--header", "Content-Length: 5"],
        ["--server", "ftp://x"],
        ["--server", "notaurl"],
        ["--server", "http://127.0.0.1:99999"],
        ["--server", "http://127.0.0.1:8188?x=1"],
        ["--timeout", "0"],
        ["--timeout", "nan"],
        ["--retries", "-1"],
        ["--server", "http://127.0.0.1:8188", "--server", "http://127.0.0.1:8189"],
    )
    with pytest.raises(SystemExit) as caught:  # both were sent, the proxy reading either one
        main(["run", str(tmp_path / "wf.json"), "--header", "X-Api-Key: A", "--header", "x-api-key: B"])
    assert caught.value.code == 2
    assert "--header 'x-api-key' is given twice: give it once" in capsys.readouterr().err
    for bad in bad_args:
        with pytest.raises(SystemExit) as caught:
            main(["run", str(tmp_path / "wf.json"), *bad])
        assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "expected 'NAME: VALUE'" in err and "header 'X-Name': HTTP headers carry ASCII only" in err
    assert "header 'X-Trace': its value cannot hold a carriage return (\\r)" in err
    assert "header 'X Trace': a header name is letters, digits and" in err
    assert "header 'Content-Length' is set by the HTTP client for each request" in err
    # a header's value is never said (a key or password would go into a CI log)
    assert "no-colon" not in err and "café" not in err and "Injected" not in err
    assert "argument --timeout: nan: must be a positive number of seconds" in err
    assert "argument --retries: -1: must be 0 or more" in err
    said = "--server: given twice (http://127.0.0.1:8188, then http://127.0.0.1:8189): this command talks"
    assert said in err
    # each said as argparse says a bad argument: after the command's usage, naming it
    assert err.count("usage: leanvideo run") == len(bad_args)
    with pytest.raises(SystemExit) as caught:  # read from a file with its line end
        main(["run", str(tmp_path / "wf.json"), "--token", "s3cret\n"])
    assert caught.value.code == 2
    assert "--token holds a line break (\\n): give the token alone" in capsys.readouterr().err
    assert "server must be an http:// or https:// URL, got 'notaurl'" in err
    assert "server URL 'http://127.0.0.1:99999': Port out of range" in err
    assert "server URL 'http://127.0.0.1:8188?x=1' has a query or fragment" in err


def test_workflow_commands_give_up_on_a_silent_server_after_their_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that takes the connection and never answers held `workflow validate` for 3 minutes (30 s
    per request, retried). Fault injection a real server cannot give: a socket that accepts, then is
    silent."""
    import socket
    import time

    api = tmp_path / "wf.json"
    api.write_text(json.dumps(WORKFLOW))
    ui = Path(__file__).parents[1] / "workflows" / "ltxv_tiny_t2v.ui.json"
    commands = (
        ["validate", str(api)],
        ["convert", str(ui), "--out", str(tmp_path / "converted.json")],
        ["diff", str(api), str(ui)],
    )
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        for command in commands:
            began = time.monotonic()
            assert main(["workflow", *command, "--server", url, "--timeout", "1.5"]) == 4
            assert time.monotonic() - began < 10, command  # not 30 s per request
    err = capsys.readouterr().err
    assert err.count(f"cannot reach ComfyUI at {url}/object_info") == len(commands)
    assert not (tmp_path / "converted.json").exists()
    with pytest.raises(SystemExit) as caught:
        main(["workflow", "validate", str(api), "--timeout", "0"])
    assert caught.value.code == 2


def test_batch_submit_gives_up_on_a_silent_server_after_its_health_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checking the jobs file asks the server for ``/object_info``: a silent one held `batch submit` for
    61 s whatever the options; it gets ``--health-timeout`` per request now."""
    import socket
    import time

    api = tmp_path / "wf.json"
    api.write_text(json.dumps(WORKFLOW))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"workflow": str(api)}) + "\n")
    db = f"sqlite:///{tmp_path / 'q.sqlite'}"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        code = main(["batch", "submit", str(jobs), "--server", url, "--db", db, "--health-timeout", "1.5"])
        assert code == 4 and time.monotonic() - began < 10  # not 30 s per request
    assert "no server gave its /object_info, so the jobs cannot be checked" in capsys.readouterr().err


def test_workflow_diff_of_two_editor_files_waits_one_timeout_in_all(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each file's conversion asks the server: both share the command's deadline, not one each."""
    from runner.cli import workflow as workflow_cli

    deadlines: list[float] = []

    def load(path: Path, args: object, deadline: float) -> tuple[dict[str, object], dict[str, object]]:
        deadlines.append(deadline)
        return {}, {}  # the workflow, the editor file's node modes

    monkeypatch.setattr(workflow_cli, "_load_any_workflow", load)
    assert main(["workflow", "diff", "a.ui.json", "b.ui.json", "--timeout", "5"]) == 0
    assert len(deadlines) == 2 and deadlines[0] == deadlines[1]
