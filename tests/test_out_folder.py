"""Every command's --out is checked alike: a file on the way is named, a missing folder is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.cli.main import main
from runner.errors import UsageError
from runner.local.out_folder import check_out_folder, remove_empty_folders


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


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "wf.json", "--out", ""],
        ["demo", "--out", " "],
        ["bench", "m.toml", "--out", ""],
        ["batch", "submit", "jobs.jsonl", "--server", "http://127.0.0.1:9", "--out", ""],
        ["batch", "results", "b", "--out", ""],
        ["workflow", "convert", "ui.json", "--out", ""],
    ],
)
def test_an_empty_out_is_a_usage_error_not_the_current_folder(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert "argument --out: an empty path (a variable that is not set?)" in capsys.readouterr().err


def test_a_demo_port_without_a_next_one_and_a_file_in_the_models_folder_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["demo", "--port", "65535", "--out", str(tmp_path / "demo")])
    assert done.value.code == 2 and "the demo takes two ports, P and P+1" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
    models = tmp_path / "models"
    models.mkdir()
    (models / "checkpoints").write_text("mine")
    assert main(["fixtures", str(models)]) == 2
    said = f"{models / 'checkpoints'} is a file, not a folder: move it away"
    assert said in " ".join(capsys.readouterr().err.split())
    assert (models / "checkpoints").read_text() == "mine"


def test_a_demo_refused_at_start_leaves_no_empty_out_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["demo", "--port", str(port), "--out", str(tmp_path / "new" / "demo")]) == 2
    assert f"port {port}: address already in use" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # both folders it made are gone
    kept = tmp_path / "mine"
    (kept / "demo").mkdir(parents=True)
    (kept / "notes.txt").write_text("kept")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        assert main(["demo", "--port", str(port), "--out", str(kept / "demo")]) == 2
    assert (kept / "demo").is_dir() and (kept / "notes.txt").read_text() == "kept"  # not made: kept


def test_only_the_empty_folders_made_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "c"
    made = check_out_folder(out)
    assert made == [out, out.parent, out.parent.parent]
    (out.parent / "file").write_text("x")
    remove_empty_folders(made)
    assert not out.exists() and (out.parent / "file").exists()
    assert check_out_folder(out.parent) == []
