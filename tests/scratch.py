"""Scratch folders that go away with the fixture that made them.

The suite writes gigabytes of model files (depth-cut 14B layers, fixture sets, device kits) and CI
machines have little disk to spare: a module's files are removed when its fixture ends, not at the
end of the session (``tmp_path`` folders of passing tests go at once: ``tmp_path_retention_policy``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def scratch_dir(factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A fresh folder under the session's temp root, removed (with everything in it) on exit."""
    path = factory.mktemp(name)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
