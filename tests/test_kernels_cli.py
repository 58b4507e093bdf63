"""``leanvideo kernels``: the INT8 kernel tables the dispatcher wrote, shown per device, stale ones
marked, bad files named, and cleared so that the next load measures again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from leanvideo.int8 import Int8WeightConfig, quantize_weight
from leanvideo.int8.dispatch import KernelDispatcher
from leanvideo.int8.kernel_table import Choice, current_fingerprint, save_table

from runner.cli.main import main

TABLE = Path("leanvideo") / "int8_kernels.json"


def _measured_table(user_dir: Path) -> Path:
    """A table written by a real dispatcher measuring the real kernels on one small layer."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(128, 256, generator=generator) * 0.02
    x = torch.randn(64, 256, generator=generator)
    dispatcher = KernelDispatcher(cache_path=user_dir / TABLE, runs=2)
    dispatcher.linear(x, quantize_weight(weight, Int8WeightConfig()))
    return user_dir / TABLE


def test_tables_under_a_folder_are_shown_as_json_with_their_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = _measured_table(tmp_path / "servers" / "8188" / "user")
    assert main(["kernels", str(tmp_path / "servers"), "--json"]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["path"] == str(table.resolve()) and shown["current"] is True
    (row,) = shown["rows"]
    assert row["device"].startswith("cpu:") and row["shape"] == "128x256" and row["rows"] == "64"
    assert row["kernel"] in row["ratio_to_w8a16"] and row["ratio_to_w8a16"]["w8a16"] == 1.0

    assert main(["kernels", str(table)]) == 0
    printed = capsys.readouterr().out
    assert "128x256 float32" in printed and "in use" in printed and row["kernel"] in printed
    # why a kernel was left out is said below the table (int_mm_fused: not measured on a CPU; on a CPU
    # without AVX-512 VNNI with the other W8A8 kernels, "int_mm, int_mm_fused, kitchen: …")
    assert re.search(r"int_mm_fused(, \w+)*: not measured on a CPU", " ".join(printed.split()))


def test_a_table_of_other_versions_is_marked_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "int8_kernels.json"
    old = current_fingerprint() | {"torch": "2.0.0"}
    save_table(
        path, old, {"cuda:NVIDIA H200|bfloat16|5120x5120|rows<=4096|row": Choice("int_mm", "measured")}
    )
    assert main(["kernels", str(path), "--json"]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["current"] is False and shown["fingerprint"]["torch"] == "2.0.0"
    assert shown["rows"][0]["device"] == "cuda:NVIDIA H200" and shown["rows"][0]["ratio_to_w8a16"] == {}
    assert main(["kernels", str(path)]) == 0
    assert f"stale (torch 2.0.0, now {torch.__version__}): measured again" in capsys.readouterr().out
    entries = {"cuda:NVIDIA H200|bfloat16|5120x5120|rows<=4096|row": Choice("int_mm", "measured")}
    save_table(path, current_fingerprint() | {"version": 99}, entries)  # another table format: said so
    assert main(["kernels", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "stale (table format 99, now" in out and "torch" not in out.partition("stale")[2].partition(")")[0]


def test_a_table_your_own_comfyui_wrote_is_not_called_stale_for_leanvideos_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Your ComfyUI started by you runs its own Python: a table it wrote without comfy-kitchen was
    called stale, "measured again at next use", judged by LeanVideo's Python, which has it."""
    user = tmp_path / "ComfyUI"
    (user / "main.py").parent.mkdir()
    (user / "main.py").write_text("")
    entries = {"cpu:x86|float32|128x256|rows<=64|row": Choice("w8a16", "measured")}
    save_table(user / "user" / TABLE, current_fingerprint() | {"comfy_kitchen": "0.0.1"}, entries)
    workspace = tmp_path / "ws"
    (workspace / "servers").mkdir(parents=True)
    save_table(
        workspace / "servers" / "8188" / "user" / TABLE, current_fingerprint() | {"torch": "2.0.0"}, entries
    )
    monkeypatch.setenv("LEANVIDEO_WORKSPACE", str(workspace))
    monkeypatch.setenv("LEANVIDEO_COMFYUI", str(user))
    assert main(["kernels"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "made under other versions than LeanVideo's Python has (comfy-kitchen 0.0.1, now" in out
    assert "in use by your ComfyUI's own Python if it has them" in out
    assert "stale (torch 2.0.0, now" in out  # a server leanvideo started: LeanVideo's Python
    assert main(["kernels", str(user / "user")]) == 0  # named by its folder: the same
    assert "made under other versions than LeanVideo's Python has" in capsys.readouterr().out


def test_clear_removes_every_table_and_a_bad_file_or_path_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _measured_table(tmp_path / "a")
    second = _measured_table(tmp_path / "b")
    assert main(["kernels", str(tmp_path), "--clear"]) == 0
    assert not first.exists() and not second.exists()
    assert capsys.readouterr().out.count("removed ") == 2
    assert main(["kernels", str(tmp_path)]) == 0
    assert "no INT8 kernel table" in capsys.readouterr().out

    broken = tmp_path / "c" / "int8_kernels.json"
    broken.parent.mkdir()
    broken.write_text("{not json", encoding="utf-8")
    assert main(["kernels", str(tmp_path)]) == 1
    assert str(broken.resolve()) in capsys.readouterr().err.replace("\n", "")
    assert main(["kernels", str(tmp_path / "nowhere")]) == 1
    assert "no such file or folder" in capsys.readouterr().err

    third = _measured_table(tmp_path / "d")  # --json: the removed files, the damaged one too, as JSON
    assert main(["kernels", str(tmp_path), "--clear", "--json"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)) == sorted(str(p.resolve()) for p in (broken, third))
    assert main(["kernels", str(tmp_path), "--clear", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_clear_deletes_nothing_when_a_named_file_is_not_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = _measured_table(tmp_path / "a")
    renamed = table.rename(tmp_path / "kept-table.json")  # a table by its content, under another name
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"weights")
    other = tmp_path / "settings.json"
    other.write_text('{"fingerprint": {"schema": "something.else"}}')
    for victim, message in ((model, "not an INT8 kernel table"), (other, "its schema is 'something.else'")):
        assert main(["kernels", "--clear", str(renamed), str(victim)]) == 1
        err = capsys.readouterr().err.replace("\n", "")
        assert message in err and "nothing was removed" in err
        assert renamed.exists() and victim.exists()
    assert model.read_bytes() == b"weights"
    assert main(["kernels", "--clear", str(renamed)]) == 0
    assert not renamed.exists()


def test_int8_bench_tables_of_the_same_name_are_never_read_or_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``int8_bench.py --json`` writes ``int8_kernels.json`` too (benchmarks/results keeps them): a folder
    search passes them over, and naming one says what it is; ``--clear`` never deletes one."""
    bench = tmp_path / "results" / "int8_kernels.json"
    bench.parent.mkdir()
    bench.write_text(json.dumps([{"shape": "attn", "kernel": "w8a16", "ratio": 1.1}]), encoding="utf-8")
    assert main(["kernels", str(tmp_path)]) == 0
    assert "no INT8 kernel table under" in capsys.readouterr().out
    assert main(["kernels", str(bench)]) == 1
    assert "a result of int8_bench.py" in capsys.readouterr().err
    assert main(["kernels", "--clear", str(bench)]) == 1
    assert "nothing was removed" in capsys.readouterr().err and bench.is_file()
    # its whole report under that name, as benchmarks/results keeps one: `kernels <ComfyUI folder>` of a
    # ComfyUI-Manager clone failed on it ("it has no 'fingerprint'") and showed no table at all
    report = tmp_path / "results" / "2026-12-01-cpu" / "int8_kernels.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"schema": "leanvideo.int8_bench", "version": 8, "linear": {}}), "utf-8")
    table = _measured_table(tmp_path / "user")
    assert main(["kernels", str(tmp_path), "--json"]) == 0
    assert [shown["path"] for shown in json.loads(capsys.readouterr().out)] == [str(table.resolve())]
    assert main(["kernels", str(report)]) == 1
    assert "a result of int8_bench.py" in capsys.readouterr().err


def test_a_reason_names_the_shapes_it_held_for_unless_it_held_for_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Else "int_mm: slower than w8a16" under a table whose rows chose int_mm reads as a contradiction."""
    path = tmp_path / "int8_kernels.json"
    slower, compiles = "slower than w8a16", "not measured on a CPU (it compiles)"
    entries = {
        "cpu:X|float32|64x64|rows<=16|row": Choice(
            "w8a16", "measured", {"w8a16": 1.0, "int_mm": 2.0}, {"int_mm": slower, "int_mm_fused": compiles}
        ),
        "cpu:X|float32|768x3072|rows<=128|row": Choice(
            "int_mm", "measured", {"w8a16": 1.0, "int_mm": 0.2}, {"int_mm_fused": compiles}
        ),
    }
    save_table(path, current_fingerprint(), entries)
    assert main(["kernels", str(path)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "int_mm: slower than w8a16 (on 64x64/≤16)" in printed
    assert "int_mm_fused: not measured on a CPU (it compiles)" in printed and "compiles) (on" not in printed


def test_kernels_ruled_out_for_one_reason_are_named_together_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a CPU without AVX-512 VNNI every W8A8 kernel is ruled out for the same reason, each naming the
    path that forces it: one line, not three per shape."""
    path = tmp_path / "int8_kernels.json"
    scalar = "not measured on a CPU (this CPU has no AVX-512 VNNI, so torch._int_mm runs its scalar loop)"
    rejected = {k: f"{scalar}; path={k} forces it" for k in ("int_mm", "int_mm_fused", "kitchen")}
    entries = {
        f"cpu:X|float32|{shape}|rows<=512|row": Choice("w8a16", "measured", {"w8a16": 1.0}, dict(rejected))
        for shape in ("1024x1024", "4096x1024")
    }
    save_table(path, current_fingerprint(), entries)
    assert main(["kernels", str(path)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert printed.count("scalar loop") == 1
    assert (
        "int_mm, int_mm_fused, kitchen: not measured on a CPU" in printed
        and "path=KERNEL forces it" in printed
    )
    one = entries["cpu:X|float32|1024x1024|rows<=512|row"]
    assert one.grouped_reasons() == [("int_mm, int_mm_fused, kitchen", f"{scalar}; path=KERNEL forces it")]
    alone = Choice("w8a16", "measured", {"w8a16": 1.0}, {"int_mm_fused": rejected["int_mm_fused"]})
    assert alone.grouped_reasons() == [("int_mm_fused", rejected["int_mm_fused"])]  # its own words


def test_rows_that_differ_only_in_dtype_are_told_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reason that held for the bf16 and fp32 rows of one shape held for all: no shape list."""
    path = tmp_path / "int8_kernels.json"
    entries = {
        f"cpu:X|{dtype}|64x64|rows<=16|row": Choice("w8a16", "measured", {}, {"kitchen": "slower than w8a16"})
        for dtype in ("float32", "bfloat16")
    }
    entries["cpu:X|bfloat16|64x64|rows<=256|row"] = Choice("w8a16", "measured", {}, {"int_mm": "slower"})
    save_table(path, current_fingerprint(), entries)
    assert main(["kernels", str(path)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "kitchen: slower than w8a16 (on 64x64/≤16 bfloat16, 64x64/≤16 float32)" in printed
    assert "int_mm: slower (on 64x64/≤256 bfloat16)" in printed


def test_a_workspace_where_no_server_ran_yet_has_no_table_and_no_models_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from runner.local.workspace import find_workspace

    monkeypatch.setenv("LEANVIDEO_COMFYUI", str(find_workspace().comfyui_dir))
    monkeypatch.setenv("LEANVIDEO_WORKSPACE", str(tmp_path))  # as install.py leaves it: no servers/, models/
    assert main(["kernels"]) == 0
    assert "no INT8 kernel table under" in capsys.readouterr().out
    assert main(["kernels", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []
    assert main(["kernels", "--clear"]) == 0
    assert "no INT8 kernel table to remove" in capsys.readouterr().out
    # a ComfyUI of the user's own (LEANVIDEO_COMFYUI, install.py --comfyui) started by the user keeps its
    # table in its user/ folder: listed too
    theirs = tmp_path / "home" / "ComfyUI"
    (theirs / "models").mkdir(parents=True)
    (theirs / "main.py").write_text("", encoding="utf-8")
    table = _measured_table(theirs / "user")
    monkeypatch.setenv("LEANVIDEO_COMFYUI", str(theirs))
    assert main(["kernels", "--json"]) == 0
    assert [shown["path"] for shown in json.loads(capsys.readouterr().out)] == [str(table.resolve())]
    monkeypatch.setenv("LEANVIDEO_COMFYUI", str(find_workspace().comfyui_dir))
    workflow = Path(__file__).resolve().parents[1] / "workflows" / "ltxv_tiny_t2v.api.json"
    assert main(["models", "check", str(workflow), "--json"]) == 1  # missing files, each with its folder
    report = json.loads(capsys.readouterr().out)
    assert report["missing"] >= 1 and all(f["target"] for f in report["files"] if f["status"] == "missing")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "not an INT8 kernel table: not valid JSON (Expecting property name"),
        ("[1, 2]", "not an INT8 kernel table: it is a list ([1, 2]), not an object with 'fingerprint'"),
        ('{"entries": {}}', "not an INT8 kernel table: it has no 'fingerprint'"),
        ('{"fingerprint": 3, "entries": {}}', "its 'fingerprint' is a number (3), not an object"),
        ('{"fingerprint": {}, "entries": []}', "its 'entries' is a list ([]), not an object"),
        ('{"fingerprint": {}, "entries": {"x": {}}}', "entry 'x': shape class key 'x' is not device|"),
        ('{"fingerprint": {}, "entries": {"cpu|float32|8x8|rows<=8|per_channel": 3}}', "is a number (3)"),
        (
            '{"fingerprint": {}, "entries": {"cpu|float32|8x8|rows<=8|per_channel": {"kernel": "w8a16"}}}',
            "entry 'cpu|float32|8x8|rows<=8|per_channel' has no 'source'",
        ),
        (  # edited by hand: servers measure that shape again, which the listing says
            '{"fingerprint": {}, "entries": {"cpu|float32|8x8|rows<=8|per_channel": {"kernel": "bogus", '
            '"source": "measured"}}}',
            "kernel 'bogus' is none of w8a16, int_mm, int_mm_fused, kitchen, onednn; servers measure",
        ),
    ],
)
def test_a_table_of_the_wrong_structure_is_said_in_words(
    content: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "int8_kernels.json"
    table.write_text(content, encoding="utf-8")
    assert main(["kernels", str(table)]) == 1
    err = capsys.readouterr().err
    assert f"{table}: " in err and said in err and "Error:" not in err  # no exception class names


def test_a_table_that_cannot_be_written_leaves_no_temporary_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder in the table's place (or a full disk): the prompt goes on, the warning is logged, and
    the temporary file is removed (one was left for every measured shape)."""
    path = tmp_path / "int8_kernels.json"
    path.mkdir()
    entries = {"cpu:X|float32|64x64|rows<=16|row": Choice("w8a16", "measured", {"w8a16": 1.0}, {})}
    save_table(path, current_fingerprint(), entries)
    assert "Could not write the INT8 kernel table" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int8_kernels.json"]
