"""One server at a time in a state folder: the lock is held by the server process, so it lasts as long
as that process (a background one outlives the command that started it), and a second start is
refused naming the holder, before it touches anything in the folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.errors import PortInUseError
from runner.local.state_lock import lock_state_dir, note_holder


def test_the_lock_lives_as_long_as_the_process_it_was_handed_to(tmp_path: Path) -> None:
    fd = lock_state_dir(tmp_path, port=8188)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, pass_fds=(fd,)
    )
    try:
        note_holder(fd, holder.pid)
        os.close(fd)  # the starting command has ended: the server alone holds it
        with pytest.raises(PortInUseError) as refused:
            lock_state_dir(tmp_path, port=8188)
        assert str(refused.value).startswith(
            f"ComfyUI (pid {holder.pid}) is already starting or running in {tmp_path} (port 8188): stop it "
            "first (`leanvideo stop --port 8188`"
        )
        assert refused.value.exit_code == 2
    finally:
        holder.communicate(b"", timeout=30)  # the server stops
    os.close(lock_state_dir(tmp_path, port=8188))  # free again


def test_a_holder_that_wrote_no_pid_yet_is_still_refused(tmp_path: Path) -> None:
    fd = lock_state_dir(tmp_path, port=8188)
    try:
        with pytest.raises(PortInUseError, match=r"^another ComfyUI is already starting or running in"):
            lock_state_dir(tmp_path, port=8188)
    finally:
        os.close(fd)
