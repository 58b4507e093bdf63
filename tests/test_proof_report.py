"""What a GPU job hands back: the summary, report and log always, then CSVs and plots while the
8-file limit allows; a bench cut off at the budget still yields the runs it made."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.proof_report import MAX_FILE_BYTES, MAX_FILES, collect


def _bench_json(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True)
    variants = [
        {
            "name": name,
            "total": {"median": 10.0 + i},
            "speedup": {"ratio": 1.0 / (1 + i)},
            "runs": [{"total_s": 9.0, "warmup": True}, {"total_s": 10.0 + i, "warmup": False}],
            "phases": {},
        }
        for i, name in enumerate(names)
    ]
    document = {
        "matrix": {"workflow": "w.json"},
        "environment": {"device": {"type": "cuda"}},
        "variants": variants,
    }
    (folder / "bench.json").write_text(json.dumps(document), encoding="utf-8")
    (folder / "report.md").write_text("| Config |\n|---|\n| base |\n", encoding="utf-8")
    (folder / "report.csv").write_text("config,total\n", encoding="utf-8")
    for plot in ("total_time.png", "phases.png"):
        (folder / plot).write_bytes(b"\x89PNG")


def test_finished_families_hand_back_their_figures_and_files_up_to_the_limit(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _bench_json(results / "ltxv-13b", ["base", "fast"])
    _bench_json(results / "wan-14b", ["base"])
    (results / "gpu.csv").write_text("name, driver_version\nNVIDIA H200, 580\n", encoding="utf-8")
    (results / "int8_linear.txt").write_text("linear on cuda\n", encoding="utf-8")
    log = results / "log.txt"
    log.write_bytes(b"x" * (MAX_FILE_BYTES + 10) + b"END")
    files = collect(results, tmp_path / "out", ["ltxv-13b", "wan-14b"], log)
    names = [p.name for p in files]
    assert len(names) == MAX_FILES
    assert names[:5] == ["summary.json", "report.md", "log.txt", "ltxv-13b.csv", "wan-14b.csv"]
    assert names[5:] == ["ltxv-13b-total_time.png", "ltxv-13b-phases.png", "wan-14b-total_time.png"]
    handed_log = (tmp_path / "out" / "log.txt").read_bytes()
    assert len(handed_log) == MAX_FILE_BYTES and handed_log.endswith(b"END")  # the tail is kept
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["gpu"] == {"name": "NVIDIA H200", "driver_version": "580"}
    fast = summary["families"]["ltxv-13b"]["variants"][1]
    assert fast["name"] == "fast" and fast["run_totals_s"] == [11.0] and fast["speedup"] == {"ratio": 0.5}
    assert summary["failed_steps"] == [] and summary["gpu_tests"] is None  # neither file: none named
    report = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "GPU: name NVIDIA H200" in report and "linear on cuda" in report and "## wan-14b" in report
    left = results / "wan-14b" / "phases.png"
    assert report.endswith(f"Left on the machine ({MAX_FILES} files come back at most): {left}\n")


def test_a_bench_cut_off_at_the_budget_still_reports_its_runs(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = results / "ltxv-13b" / "runs" / "20-step-baseline" / "20261130-1"
    run.mkdir(parents=True)
    record = {"status": "success", "timing": {"wall_s": 61.4, "server_execution_s": 60.0}, "error": None}
    (run / "run.json").write_text(json.dumps(record), encoding="utf-8")
    collect(results, tmp_path / "out", ["ltxv-13b", "wan-14b"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    ltxv = summary["families"]["ltxv-13b"]
    assert ltxv["status"] == "unfinished"
    assert ltxv["runs"] == [
        {
            "variant": "20-step-baseline",
            "status": "success",
            "wall_s": 61.4,
            "server_execution_s": 60.0,
            "phases": None,
            "error": None,
        }
    ]
    assert summary["families"]["wan-14b"] == {"status": "not run", "runs": []}
    report = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "No report (unfinished)" in report and "- 20-step-baseline: success, 61.4 s" in report


def test_the_failed_steps_and_the_gpu_tests_come_back_in_the_summary(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "failed.txt").write_text(
        "GPU tests (pytest exit 1)\nwan-14b (no time left)\n", encoding="utf-8"
    )
    (results / "gpu_tests.txt").write_text(
        "..F.\nFAILED tests/test_int8_core.py::test_x - assert 1 == 2\n"
        "==== 1 failed, 3 passed in 9.1s ====\n",
        encoding="utf-8",
    )
    collect(results, tmp_path / "out", ["ltxv-13b"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["failed_steps"] == ["GPU tests (pytest exit 1)", "wan-14b (no time left)"]
    assert summary["gpu_tests"] == {
        "summary": "1 failed, 3 passed in 9.1s",
        "failed": ["FAILED tests/test_int8_core.py::test_x - assert 1 == 2"],
    }
    report = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "Steps that failed or were left out: GPU tests (pytest exit 1); wan-14b" in report
    assert (
        "## GPU tests (pytest -m gpu)\n\n1 failed, 3 passed in 9.1s\n- FAILED tests/test_int8_core" in report
    )
