"""The console script: a Ctrl-C while the command line is still importing ends as any Ctrl-C does."""

from __future__ import annotations

import importlib.abc
import json
import os
import signal
import sys
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
