"""What the CLI writes for programs and logs: --json is plain JSON on any terminal, and the live
progress off a terminal is plain lines as the prompt goes (bars would show only once it ended)."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from runner.cli import render
from runner.cli.render import PlainRunProgress, RunProgress, print_json, run_progress
from runner.tracking.events import ClientEvent


def test_json_is_plain_on_a_forced_colour_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, color_system="truecolor")
    print_json(console, {"a": [1, "é"], "b": None})
    print_json(console, '{"c": true}')
    text = buffer.getvalue()
    assert "\x1b" not in text
    first, second = text.split("}\n{")
    assert json.loads(first + "}") == {"a": [1, "é"], "b": None} and json.loads("{" + second) == {"c": True}


def test_progress_off_a_terminal_is_plain_lines_with_steps_at_most_every_ten_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    buffer = io.StringIO()
    clock = iter([100.0, 101.0, 111.5, 112.0])  # the steps' times
    monkeypatch.setattr(render.time, "monotonic", lambda: next(clock))
    assert isinstance(run_progress(Console(file=io.StringIO(), force_terminal=True)), RunProgress)
    with run_progress(Console(file=buffer, width=200)) as progress:
        assert isinstance(progress, PlainRunProgress)
        for event in (
            ClientEvent("started", value=3),
            ClientEvent("cached", "1", "CheckpointLoaderSimple"),
            ClientEvent("node", "2", "KSampler"),
            ClientEvent("step", "2", "KSampler", value=1, max=20),
            ClientEvent("step", "2", "KSampler", value=2, max=20),  # 1 s later: not shown
            ClientEvent("step", "2", "KSampler", value=15, max=20),  # 11.5 s after the first shown
            ClientEvent("step", "2", "KSampler", value=20, max=20),  # the last step always
            ClientEvent("node", "3", "SaveVideo"),
            ClientEvent("done"),
        ):
            progress.update(event)
    assert buffer.getvalue().splitlines() == [
        "prompt started (3 nodes)",
        "node 2 KSampler (2/3)",
        "  steps of node 2: 1/20",
        "  steps of node 2: 15/20",
        "  steps of node 2: 20/20",
        "node 3 SaveVideo (3/3)",
        "nodes: done (3/3)",
    ]


def test_stop_signals_raise_once_then_let_the_cleanup_finish_and_respect_nohup() -> None:
    import os
    import signal

    from runner.cli.signals import stop_signals

    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with stop_signals():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # left as nohup set it
            assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        assert {n: signal.getsignal(n) for n in before} == before  # no signal came: all restored
        with pytest.raises(KeyboardInterrupt), stop_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        with stop_signals():  # a repeat within the grace is swallowed while the first is handled
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            except KeyboardInterrupt:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # stopped by a signal: ignored while exiting
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_version_names_the_package_version_and_the_commit(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata
    import subprocess

    from runner.cli.main import main
    from runner.local.workspace import REPO_ROOT

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    printed = capsys.readouterr().out.strip()
    assert printed.startswith(f"leanvideo {importlib.metadata.version('leanvideo')}")
    assert not commit or printed.endswith(f"(commit {commit})")


def test_a_usage_error_with_json_is_a_json_error_object_too(capsys: pytest.CaptureFixture[str]) -> None:
    from runner.cli.main import main

    for argv in (
        ["run", "x.json", "--set", "foo", "--json"],
        ["run", "x.json", "--header", "x", "--json"],
        ["run", "x.json", "--set", "foo", "--js"],  # abbreviated, as argparse takes it
    ):
        with pytest.raises(SystemExit) as refused:
            main(argv)
        assert refused.value.code == 2
        error = json.loads(capsys.readouterr().out)["error"]
        assert error["type"] == "UsageError" and error["exit_code"] == 2 and "expected" in error["message"]


def test_a_reader_that_goes_away_is_sigpipes_exit_not_a_traceback() -> None:
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "runner.cli.main", "kernels", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.close()  # like `| head` that has read all it wanted before anything came
    process.stdout = None
    _, err = process.communicate(timeout=120)
    assert process.returncode == 141 and "Traceback" not in err, err


def test_a_reader_that_goes_away_from_a_table_is_sigpipes_exit_too(tmp_path: Path) -> None:
    """rich's console exits 1 on a broken pipe (a failure, to a script); the CLI's says 141 as for JSON."""
    import subprocess
    import sys

    from leanvideo.int8.kernel_table import current_fingerprint

    rows = {
        f"cpu:x|float32|{out}x32|rows<=64|row": {"kernel": "w8a16", "source": "measured"}
        for out in range(400)
    }
    table = tmp_path / "int8_kernels.json"  # a table of 400 rows: more than a pipe's buffer holds
    table.write_text(json.dumps({"fingerprint": current_fingerprint(), "entries": rows}), encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "runner.cli.main", "kernels", str(table)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.close()
    process.stdout = None
    _, err = process.communicate(timeout=120)
    assert process.returncode == 141 and "Traceback" not in err, err


def test_a_terminal_that_is_not_utf8_gets_escapes_not_a_crash(tmp_path: object) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    missing = Path(str(tmp_path)) / "ünï" / "wf.json"
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "runner.cli.main", "workflow", "validate", str(missing), *extra],
            capture_output=True, text=True, env=env, timeout=120, encoding="ascii", errors="strict",
        )  # fmt: skip
        assert done.returncode == 5 and "Traceback" not in done.stderr, done.stderr
        if extra:
            assert str(missing) in json.loads(done.stdout)["error"]["message"]  # \u escapes: still JSON


@pytest.mark.parametrize(("code", "exit_code"), [(30, 2), (28, 1)], ids=["read-only", "disk-full"])
def test_a_file_the_command_cannot_write_is_named_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int, exit_code: int
) -> None:
    import os

    from runner.cli import main as cli

    def writes(*args: object) -> int:
        raise OSError(code, os.strerror(code), "/data/models/.leanvideo-fixtures.lock")

    monkeypatch.setattr(cli, "cmd_fixtures", writes)
    assert cli.main(["fixtures"]) == exit_code
    assert f"/data/models/.leanvideo-fixtures.lock: {os.strerror(code)}" in capsys.readouterr().err


def test_names_and_values_are_printed_as_they_are_never_read_as_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file named ``ok[red].json`` was printed as ``ok.json``; ``o[/x]`` ended a command in rich's
    MarkupError. Paths, titles and values are text."""
    from runner.cli.main import _console, main
    from runner.graph.validate import Problem

    workflow = {"1": {"class_type": "SaveImage [/b]", "inputs": {"filename_prefix": "o[/x]"}}}
    a, b = tmp_path / "ok[red].json", tmp_path / "o[bold]x.json"
    for path in (a, b):
        path.write_text(json.dumps(workflow), encoding="utf-8")
    assert main(["workflow", "diff", str(a), str(b)]) == 0
    assert capsys.readouterr().out.strip() == f"{a} and {b} are the same workflow"

    console = _console(stderr=False)
    problem = Problem("1", "SaveImage [/b]", "filename_prefix", "model file 'ltxv [fp8].safetensors' [/]")
    console.print(render.problems_table([problem], f"{a} against ComfyUI"))
    console.print(f"record: {b}")
    out = capsys.readouterr().out
    assert "'ltxv [fp8].safetensors' [/]" in out and "SaveImage [/b]" in out
    assert f"{a} against ComfyUI" in out and f"record: {b}" in out


def test_a_workflow_after_a_double_dash_or_from_a_pipe_is_read_as_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run -- -wf.json``: "--" ends the options (only serve and demo pass what follows to ComfyUI);
    ``run <(…)`` and ``/dev/stdin``: the pipe is read where it is (it was resolved to a name that does
    not exist). A file that is no workflow tells, before any server is asked, that it was read."""
    import os

    from runner.cli.main import main

    nobody = ["--server", "http://127.0.0.1:9", "--retries", "0"]
    dashed = tmp_path / "-wf.json"
    dashed.write_text('{"1": {"inputs": {}}}', encoding="utf-8")
    assert main(["run", *nobody, "--out", str(tmp_path / "out"), "--", str(dashed)]) == 5
    assert "node 1 has no class_type" in capsys.readouterr().err
    read, write = os.pipe()
    os.write(write, b'{"7": {"inputs": {}}}')
    os.close(write)
    try:
        assert main(["run", f"/dev/fd/{read}", *nobody, "--out", str(tmp_path / "out")]) == 5
    finally:
        os.close(read)
    assert "node 7 has no class_type" in capsys.readouterr().err
    stdin = io.TextIOWrapper(io.BytesIO(b'{"8": {"inputs": {}}}'))  # "-": standard input, as diff reads it
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["run", "-", *nobody, "--out", str(tmp_path / "out")]) == 5
    assert "workflow file -: node 8 has no class_type" in capsys.readouterr().err
    assert main(["workflow", "diff", "-", "-"]) == 2
    assert "A and B are both - (standard input)" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["leanvideo", "bench's own"])
def test_bench_json_interrupted_mid_prompt_ends_with_the_json_error(
    entry: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C while a bench's prompt runs is a cancelled prompt with a partial record: bench printed
    no JSON (only `run` prints its record instead)."""
    from runner.cli import bench as bench_cli
    from runner.cli import main as main_cli
    from runner.errors import PromptCancelledError

    def cancelled(args: object, console: object) -> int:
        error = PromptCancelledError("prompt p1 cancelled (Ctrl-C)")
        error.record_path = "/tmp/out/runs/8-step/run.json"
        raise error

    monkeypatch.setattr(main_cli, "run_bench", cancelled)
    monkeypatch.setattr(bench_cli, "run_bench", cancelled)
    argv = ["bench", "m.toml", "--json"]
    code = main_cli.main(argv) if entry == "leanvideo" else bench_cli.main(argv[1:])
    assert code == 130
    assert json.loads(capsys.readouterr().out) == {
        "error": {"type": "KeyboardInterrupt", "message": "prompt p1 cancelled (Ctrl-C)", "exit_code": 130}
    }


@pytest.mark.parametrize("command", [["serve", "--port", "8399"], ["demo"], ["bench", "m.toml"]])
def test_a_kernel_variable_that_names_no_kernel_is_refused_before_a_server_starts(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every prompt with an INT8 loader would fail, blamed on a node whose inputs are fine."""
    from runner.cli.main import main

    monkeypatch.setenv("LEANVIDEO_INT8_KERNEL", "turbo")
    assert main(command) == 2
    assert "LEANVIDEO_INT8_KERNEL='turbo' is not one of auto, w8a16, " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["serve", "--host", ""], "argument --host: an empty address"),
        (["fixtures", ""], "argument dir: an empty path"),
    ],
)
def test_an_empty_address_or_folder_is_refused(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--host ""`` bound, then ComfyUI listened nowhere for the whole ready-timeout; ``fixtures ""``
    wrote 470 MB of models into the current folder."""
    from runner.cli.main import main

    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2 and said in capsys.readouterr().err
