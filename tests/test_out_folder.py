"""Every command's --out is checked alike: a file on the way is named, a missing folder is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import UsageError
from runner.local.out_folder import check_out_folder


def test_a_file_on_the_way_is_named_and_kept(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("kept")
    for out in (taken, taken / "run1" / "deeper"):
        with pytest.raises(UsageError, match=f"^--out {out}: {taken} is a file, not a folder; nothing ran$"):
            check_out_folder(out, after="; nothing ran")
    assert taken.read_text() == "kept"


def test_a_missing_folder_is_made_only_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    check_out_folder(out, create=False)
    assert not (tmp_path / "a").exists()
    check_out_folder(out)
    assert out.is_dir()
    check_out_folder(out)  # there already: fine
