"""One install.py at a time per checkout: a second run waits for the first, saying which, and a holder
that dies (killed, however) releases the lock. The holder is another process: flock is per open file,
so only a second process shows what a second install.py sees."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.install.lock import install_lock

HOLD = """
import sys, time
from pathlib import Path
from runner.install.lock import install_lock
with install_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""
REPO = Path(__file__).resolve().parent.parent


def _holder(lock: Path, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock), str(seconds)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_second_install_waits_for_the_first_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / ".install.lock"
    with _holder(lock, 1.5) as holder:
        began = time.monotonic()
        with install_lock(lock):
            waited = time.monotonic() - began
    said = capsys.readouterr().out
    assert waited > 1.0  # until the first let go (it held the lock 1.5 s)
    assert f"another install.py is running on this checkout (pid {holder.pid}); waiting for it to end" in said
    assert "the other install.py ended; checking what it put in place" in said


def test_a_killed_install_does_not_block_the_next(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / ".install.lock"
    with _holder(lock, 60) as holder:
        holder.kill()
    began = time.monotonic()
    with install_lock(lock):
        assert time.monotonic() - began < 5
    assert "waiting" not in capsys.readouterr().out


def test_alone_it_says_nothing_and_a_lock_that_cannot_be_made_is_no_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with install_lock(tmp_path / ".install.lock"):
        pass
    with install_lock(tmp_path / "no such folder" / ".install.lock"):  # a read-only checkout, say
        pass
    assert capsys.readouterr().out == ""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a reaper does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_what_the_installer_runs_dies_with_it(tmp_path: Path) -> None:
    """A killed install.py (kill -9) left its pip writing the venv while the next install.py, let
    through by the lock, ran its own: what run_command starts now dies with the installer."""
    marker = tmp_path / "pid"
    script = (
        "from runner.install.comfy import run_command; "
        f"run_command(['sh', '-c', 'echo $$ > {marker}; exec sleep 60'])"
    )
    with subprocess.Popen([sys.executable, "-c", script], cwd=REPO) as installer:
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text().strip():
            assert time.monotonic() < deadline and installer.poll() is None
            time.sleep(0.05)
        child = int(marker.read_text())
        assert _alive(child)
        installer.kill()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, f"the installer's child {child} outlived it"
        time.sleep(0.05)
