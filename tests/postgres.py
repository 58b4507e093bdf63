"""A throwaway PostgreSQL cluster for the tests: ``initdb`` in a temporary folder, ``pg_ctl`` on a free
loopback port, stopped and removed afterwards.

The binaries come from Debian's ``postgresql`` package, which keeps them off PATH (they are looked up
under ``/usr/lib/postgresql/*/bin``); when missing and running as root it is installed with
``apt-get``. ``initdb`` refuses to run as root, so as root the cluster belongs to ``nobody`` (its
folder is made under ``/tmp``, which ``nobody`` can reach, and handed over) and every command runs
through ``runuser``. When PostgreSQL cannot be had, CI fails with the reason; elsewhere the test is
skipped with it.

Example::

    with throwaway_postgres() as url:   # postgresql://postgres@127.0.0.1:PORT/postgres
        ...
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

from runner.local.ports import pick_free_port

INSTALL_TIMEOUT_S = 900
CLUSTER_USER = "nobody"  # who owns the cluster when the tests run as root


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"postgres test set-up: {reason}", pytrace=False)
    pytest.skip(f"no PostgreSQL: {reason}")


def _find_bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(candidates[-1]).parent if candidates else None


def ensure_postgres() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl``; Debian's package is installed when missing (root)."""
    found = _find_bin_dir()
    if found:
        return found
    if os.geteuid() != 0:
        _unavailable("PostgreSQL is not installed and this is not root; run `apt-get install -y postgresql`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False, env=env
        )
        if done.returncode != 0:
            _unavailable(
                f"{' '.join(command)} exited {done.returncode}: {(done.stdout + done.stderr)[-600:]}"
            )
    found = _find_bin_dir()
    if not found:
        _unavailable("apt-get installed postgresql but no initdb was found under /usr/lib/postgresql")
    return found


def _as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", CLUSTER_USER, "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(_as_owner(command), capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        _unavailable(f"{what} exited {done.returncode}: {(done.stdout + done.stderr)[-800:]}")


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Start a fresh cluster on a free loopback port; yields its URL; stops and removes it after."""
    bin_dir = ensure_postgres()
    root = Path(tempfile.mkdtemp(prefix="leanvideo-pg-", dir="/tmp"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam(CLUSTER_USER)
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data, port = root / "data", pick_free_port()
    try:
        _run(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            "initdb",
        )
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        _run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"],
            "pg_ctl start",
        )
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(
                _as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                capture_output=True,
                timeout=120,
                check=False,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
