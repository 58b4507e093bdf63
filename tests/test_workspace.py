"""Finding the installation: the recorded ComfyUI, or the one ``LEANVIDEO_COMFYUI`` names, said in
words when it cannot be used."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import WorkspaceError
from runner.local.workspace import find_workspace


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("nowhere", "does not exist"),  # it said "is not a ComfyUI folder (no main.py)"
        ("ComfyUI/main.py", "is a file, not a folder"),  # it said ".../main.py … (no main.py)"
        ("empty", "is not a ComfyUI folder (no main.py)"),
    ],
)
def test_a_leanvideo_comfyui_that_cannot_be_used_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, said: str
) -> None:
    (tmp_path / "ComfyUI").mkdir()
    (tmp_path / "ComfyUI" / "main.py").write_text("", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("LEANVIDEO_COMFYUI", str(tmp_path / given))
    with pytest.raises(WorkspaceError) as refused:
        find_workspace(tmp_path / "ws")
    assert str(refused.value).startswith(f"LEANVIDEO_COMFYUI={tmp_path / given}: {tmp_path / given} {said}; ")
    assert "the one holding main.py" in str(refused.value) and refused.value.exit_code == 3
    monkeypatch.setenv("LEANVIDEO_COMFYUI", str(tmp_path / "ComfyUI"))
    assert find_workspace(tmp_path / "ws").comfyui_dir == tmp_path / "ComfyUI"
