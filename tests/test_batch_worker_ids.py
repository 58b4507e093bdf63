"""Worker ids: two live workers on one machine never share one (each would take over the other's running
jobs, and those jobs would run twice); a stopped command that starts again gets its id back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.batch.worker_ids import default_worker_id, hold_worker_id
from runner.errors import UsageError


def test_a_held_id_is_refused_to_a_second_worker_and_free_again_after(tmp_path: Path) -> None:
    with hold_worker_id("host-abc", lock_dir=tmp_path) as held:
        assert held == "host-abc"
        with (
            pytest.raises(
                UsageError,
                match=rf"'host-abc' is in use by a live worker on this machine \(pid {os.getpid()}\)",
            ),
            hold_worker_id("host-abc", lock_dir=tmp_path),
        ):
            pass
        with hold_worker_id("host-other", lock_dir=tmp_path):  # another id is free
            pass
    with hold_worker_id("host-abc", lock_dir=tmp_path):  # released with the first holder
        pass


def test_a_dead_holder_leaves_the_id_free(tmp_path: Path) -> None:
    """The lock goes with the process that held it, however it ended (here: killed)."""
    code = (
        "import os, sys, pathlib\n"
        "from runner.batch.worker_ids import hold_worker_id\n"
        f"with hold_worker_id('host-abc', lock_dir=pathlib.Path({str(tmp_path)!r})):\n"
        "    print('held', flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "held" and done.returncode == -9
    with hold_worker_id("host-abc", lock_dir=tmp_path):
        pass


def test_submit_wait_ids_differ_by_batch_and_stay_the_same_across_restarts() -> None:
    servers = ["http://127.0.0.1:8188", "http://127.0.0.1:8189"]
    assert default_worker_id(servers, batch="mon") == default_worker_id(list(reversed(servers)), batch="mon")
    assert default_worker_id(servers, batch="mon") != default_worker_id(servers, batch="tue")
    assert default_worker_id(servers, batch="mon").startswith(default_worker_id(servers) + "-")


def test_an_id_is_a_queues_so_two_databases_may_each_have_one(tmp_path: Path) -> None:
    with (
        hold_worker_id("host-abc", "sqlite:///a.sqlite", lock_dir=tmp_path),
        hold_worker_id("host-abc", "sqlite:///b.sqlite", lock_dir=tmp_path),
        pytest.raises(UsageError),
        hold_worker_id("host-abc", "sqlite:///a.sqlite", lock_dir=tmp_path),
    ):
        pass


def test_the_lock_folder_is_shared_by_every_user(tmp_path: Path) -> None:
    folder = tmp_path / "locks"
    with hold_worker_id("host-abc", lock_dir=folder):
        assert folder.stat().st_mode & 0o7777 == 0o1777
        [lock] = folder.iterdir()
        assert lock.stat().st_mode & 0o666 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_lock_folder_deleted_before_it_was_locked_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A temporary-folder cleaner may delete the (unlocked) folder between our open and our lock: a lock
    on the deleted one would guard nothing, as a second worker would make and lock a new one."""
    from runner.batch import worker_ids

    real_open = worker_ids._open_lock
    deleted: list[Path] = []

    def open_then_delete(folder: Path, path: Path) -> int:
        descriptor = real_open(folder, path)
        if not deleted:
            path.rmdir()
            deleted.append(path)
        return descriptor

    monkeypatch.setattr(worker_ids, "_open_lock", open_then_delete)
    with hold_worker_id("host-abc", lock_dir=tmp_path):
        assert deleted and deleted[0].is_dir()  # made again, and that one is held
        monkeypatch.setattr(worker_ids, "_open_lock", real_open)
        with (
            pytest.raises(UsageError, match="in use by a live worker"),
            hold_worker_id("host-abc", lock_dir=tmp_path),
        ):
            pass


def test_the_lock_is_a_folder_that_systemd_tmpfiles_leaves_alone_while_held(tmp_path: Path) -> None:
    """tmpfiles skips a folder a BSD lock is held on (files only from systemd 254 on): the lock is on
    the folder itself, and the note of who holds it is inside."""
    import fcntl

    with hold_worker_id("host-abc", lock_dir=tmp_path):
        (folder,) = tmp_path.iterdir()
        assert folder.is_dir() and (folder / "holder").read_text() == f"pid {os.getpid()}"
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # what tmpfiles tries before aging
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(descriptor)
