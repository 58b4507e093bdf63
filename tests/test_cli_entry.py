"""The console script: a Ctrl-C while the command line is still importing ends as any Ctrl-C does."""

from __future__ import annotations

import importlib.abc
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from runner.cli import entry


class _InterruptedImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, *args: Any) -> None:
        if name == "runner.cli.main":
            raise KeyboardInterrupt
        return None


def test_ctrl_c_during_the_import_is_exit_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "runner.cli.main", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    assert entry.run() == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_otherwise_it_runs_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["leanvideo", "--version"])
    with pytest.raises(SystemExit) as done:
        entry.run()
    assert done.value.code == 0 and capsys.readouterr().out.startswith("leanvideo ")


class _TerminatedImport(importlib.abc.MetaPathFinder):
    """SIGTERM (``timeout``, docker, CI) arriving while rich and httpx are still importing."""

    def find_spec(self, name: str, *args: Any) -> None:
        if name == "runner.cli.main":
            os.kill(os.getpid(), signal.SIGTERM)
        return None


@pytest.fixture(autouse=True)
def _own_stop_handlers() -> Any:
    """entry.run() takes (and, ending, ignores) SIGINT, SIGTERM and SIGHUP in this process: put them back,
    or every child the later tests start inherits them ignored (a server would outlive its parent)."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


def _terminated_while_importing(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    monkeypatch.delitem(sys.modules, "runner.cli.main", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_TerminatedImport(), *sys.meta_path])
    monkeypatch.setattr(sys, "argv", ["leanvideo", *argv])
    return entry.run()


def test_sigterm_during_the_import_is_exit_130_with_the_json_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        _terminated_while_importing(monkeypatch, ["quantize", "in.safetensors", "out.safetensors", "--json"])
        == 130
    )
    captured = capsys.readouterr()
    assert captured.err == "interrupted\n"
    assert json.loads(captured.out) == {
        "error": {"type": "KeyboardInterrupt", "message": "interrupted", "exit_code": 130}
    }
    # the process is ending: a second signal is ignored, not a death by SIGTERM
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_json_after_the_double_dash_is_comfyuis_not_ours(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _terminated_while_importing(monkeypatch, ["serve", "--", "--json"]) == 130
    assert capsys.readouterr().out == ""


def test_a_stop_after_the_command_returned_does_not_change_its_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import runner.cli.main

    monkeypatch.setattr(runner.cli.main, "main", lambda: 0)
    assert entry.run() == 0
    os.kill(os.getpid(), signal.SIGTERM)  # ignored now: the command's work is done
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_threads_a_command_left_running_do_not_keep_the_process_alive() -> None:
    """A batch worker stopped while its database did not answer said "stopped", then hung as long as the
    outage lasted (DBOS's threads still tried to record), and Ctrl-C and SIGTERM did nothing."""
    script = (
        "import sys, threading, time\n"
        "from runner.cli.entry import end\n"
        "threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: Python waits for it\n"
        "print('said', flush=True)\n"
        "sys.exit(end(7, linger_s=0.5))\n"
    )
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (7, "said\n")
    assert time.monotonic() - began < 30
    quick = "import sys; from runner.cli.entry import end; sys.exit(end(3))"  # none left: at once
    assert subprocess.run([sys.executable, "-c", quick], timeout=60).returncode == 3
    # threads there before the command (a test's, in this process) are not the command's to end
    import threading

    waiting = threading.Event()
    theirs = threading.Thread(target=waiting.wait, args=(60,))
    theirs.start()
    try:
        assert entry.end(5, linger_s=0.2, before={theirs}) == 5
    finally:
        waiting.set()
        theirs.join()
