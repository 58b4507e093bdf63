"""The bench when things go wrong around the measured runs: a variant whose own ``set`` the server
refuses, a server that does not start, one lost during the soak. Each ends what it must and no more:
the other variants' runs and the reports survive. Faults are injected into the harness's calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import harness, modes, variant_workflow
from benchmarks.harness import BenchSettings
from benchmarks.matrix import load_matrix
from benchmarks.protocol import SERVER_LOST, VariantRun
from runner.errors import PromptCancelledError, ServerCrashedError, WorkflowError
from runner.local.workspace import REPO_ROOT

TINY = REPO_ROOT / "benchmarks" / "seed_table_tiny.toml"


def test_a_variant_whose_own_set_is_refused_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = load_matrix(TINY)
    group = [matrix.variant("20-step baseline"), matrix.variant("8-step distill")]
    real = variant_workflow.write_variant_workflow

    def write(variant: Any, base: Any, object_info: Any, out: Path) -> Any:
        if variant.name == "8-step distill":
            raise WorkflowError("node 11 (SamplerCustom) has no input 'cfgg'")
        return real(variant, base, object_info, out)

    monkeypatch.setattr(variant_workflow, "write_variant_workflow", write)
    monkeypatch.setattr(variant_workflow, "apply_overrides", lambda workflow, specs, info: [])
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    jobs = variant_workflow.prepare_jobs(group, {}, {}, tmp_path, False, skipped, failed, print)
    assert [job.variant.name for job in jobs] == ["20-step baseline"]
    assert failed == {
        "8-step distill": "WorkflowError before its runs: node 11 (SamplerCustom) has no input 'cfgg'"
    }


def test_a_server_that_does_not_start_ends_its_group_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = load_matrix(TINY)
    group = [matrix.variant("8-step + non-blocking transfer")]

    class NoServer:
        def __enter__(self) -> Any:
            raise ServerCrashedError("ComfyUI exited with code 1 before answering")

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(harness, "open_server", lambda *args: NoServer())
    measured = harness._Measured()
    settings = BenchSettings(out_dir=tmp_path)
    harness._run_group(matrix, settings, {}, ("--async-offload",), group, measured, None, print)
    [lost] = measured.server_lost
    assert lost.startswith(f"{harness.SERVER_NOT_STARTED} (--async-offload): ComfyUI exited with code 1")
    assert lost.endswith(f"its log: {tmp_path / 'servers' / 'async-offload' / 'comfyui.log'}")
    assert measured.skipped == {"8-step + non-blocking transfer": "the server did not start before its runs"}
    assert "logs" not in measured.modes  # a server that never started has no log of this bench


def test_a_server_lost_in_the_soak_says_so_and_no_load_test_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = load_matrix(TINY)
    told: list[str] = []

    def soak(*args: Any, on_server_lost: Any, deadline: Any, **kwargs: Any) -> list[Any]:
        assert deadline == 123.0  # --budget-s reaches the soak rounds
        on_server_lost(f"{SERVER_LOST} in run 3 of 20-step baseline: connection refused")
        return []

    monkeypatch.setattr(modes, "run_variant", soak)
    monkeypatch.setattr(modes, "run_load", lambda *a, **k: pytest.fail("a load test on a dead server"))
    found = modes.run_launch_checks(
        matrix, VariantRun(matrix.variant("20-step baseline"), tmp_path / "w.json", tmp_path / "runs"),
        "http://127.0.0.1:1", tmp_path,
        soak=10, load=True, servers=["http://127.0.0.1:1"], concurrency=2, jobs=8, deadline=123.0,
        say=print, on_server_lost=told.append,
    )  # fmt: skip
    assert found["soak"]["verdict"].startswith(f"not finished: {SERVER_LOST} in run 3")
    assert found["load"]["verdict"] == f"not run: {SERVER_LOST} in the soak"
    assert told == [f"{SERVER_LOST} in run 3 of 20-step baseline: connection refused (soak)"]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, PromptCancelledError])
def test_an_interrupted_bench_reports_the_groups_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: type[BaseException]
) -> None:
    """Ctrl-C or SIGTERM in the second server's group threw the first group's runs away: no report, and
    its --out could not be used again."""
    matrix = load_matrix(TINY)

    def run_group(matrix: Any, settings: Any, base: Any, server_args: Any, group: Any, measured: Any,
                  *rest: Any) -> None:  # fmt: skip
        if server_args:  # the second group: interrupted between runs, or in a prompt (then cancelled)
            raise stop("prompt cancelled")
        for variant in group:
            if variant.skip_on_cpu:
                measured.skipped[variant.name] = "on CPU: too slow"
                continue
            measured.runs[variant.name] = [_measure(variant.name, i) for i in range(2)]

    monkeypatch.setattr(harness, "_run_group", run_group)
    said: list[str] = []
    with pytest.raises(stop):
        harness.run_matrix(matrix, BenchSettings(out_dir=tmp_path, plots=False), said.append)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert f"**{harness.INTERRUPTED}**" in report
    assert "skipped: interrupted before its measured runs" in report  # the flagged group's variants
    assert "| 8-step distill | 2.50 s" in report
    assert said == [f"interrupted: the report of the runs made is in {tmp_path / 'report.md'}"]
    document = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    assert (document["interrupted"], document["server_lost"]) == (True, [])  # no server was lost


def _measure(variant: str, index: int) -> Any:
    from benchmarks.protocol import RunMeasure

    return RunMeasure(
        variant=variant, index=index, warmup=False, total_s=2.0 + index, server_s=None, phases={},
        step_s=None, peak_vram_bytes=None, peak_rss_bytes=None, energy_wh=None, memory_start_bytes=None,
        memory_kind="rss", record_path=f"runs/{index}/run.json", output_path=None,
    )  # fmt: skip
