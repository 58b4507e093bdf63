"""A full disk while a run's outputs or record are written: an error naming the file, and nothing half
written under its name (fault injection: the fake server of ``tests/fake_server.py``)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from runner.errors import OutputWriteError
from runner.jobs.run import RunOptions, run_workflow
from tests.fake_server import WORKFLOW, FakeComfy
from tests.test_client_faults import finish_normally


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device that is always full)")
def test_a_full_disk_while_downloading_names_the_file_and_leaves_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt ran, the download hits a full disk: an error naming the file and where the server
    keeps it, nothing half-written under the output's name (a cut-off MP4 looks like a result), and a
    partial record of what did not arrive."""
    real_open = Path.open

    def full_disk(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if mode == "xb" and self.suffix == ".mp4":
            self.touch()  # the file exists, as an open for writing makes it
            return open("/dev/full", "wb", buffering=0)  # every write: ENOSPC
        return real_open(self, mode, *args, **kwargs)

    path = tmp_path / "wf.json"
    path.write_text(json.dumps(WORKFLOW))
    monkeypatch.setattr(Path, "open", full_disk)
    with FakeComfy(finish_normally) as fake, pytest.raises(OutputWriteError) as raised:
        run_workflow(path, RunOptions(server=fake.url, out_dir=tmp_path / "out", validate=False))
    [run_dir] = (tmp_path / "out").iterdir()
    assert f"cannot write {run_dir / 'clip_00001_.mp4'} (No space left on device)" in str(raised.value)
    assert "still in the server's output folder as video/clip_00001_.mp4" in str(raised.value)
    # nothing of the video; a partial record says what did not arrive (`--json` prints it)
    assert [p.name for p in run_dir.iterdir()] == ["run.json"] and raised.value.exit_code == 1
    record = json.loads((run_dir / "run.json").read_text())
    assert record["partial"] is True and record["outputs"] == []
    assert record["error"]["message"].startswith("outputs not all downloaded (0 were): cannot write ")


def test_a_full_disk_while_writing_the_record_leaves_no_half_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = Path.write_text

    def full_disk(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if self.name.endswith(".partial"):
            real_write(self, data[:100], *args, **kwargs)  # what fitted
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data, *args, **kwargs)

    path = tmp_path / "wf.json"
    path.write_text(json.dumps(WORKFLOW))
    monkeypatch.setattr(Path, "write_text", full_disk)
    with (
        FakeComfy(finish_normally) as fake,
        pytest.raises(OutputWriteError, match=r"cannot write the run record .*run\.json \(No space left"),
    ):
        run_workflow(path, RunOptions(server=fake.url, out_dir=tmp_path / "out", validate=False))
    [run_dir] = (tmp_path / "out").iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["clip_00001_.mp4"]  # no run.json, whole or half
