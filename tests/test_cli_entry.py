"""The console script: a Ctrl-C while the command line is still importing ends as any Ctrl-C does."""

from __future__ import annotations

import importlib.abc
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
