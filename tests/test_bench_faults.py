"""The bench when things go wrong around the measured runs: a variant whose own ``set`` the server
refuses, a server that does not start, one lost during the soak. Each ends what it must and no more:
the other variants' runs and the reports survive. Faults are injected into the harness's calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import harness, modes
from benchmarks.harness import BenchSettings
from benchmarks.matrix import load_matrix
from benchmarks.protocol import SERVER_LOST, VariantRun
from runner.errors import ServerCrashedError, WorkflowError
from runner.local.workspace import REPO_ROOT

TINY = REPO_ROOT / "benchmarks" / "seed_table_tiny.toml"


def test_a_variant_whose_own_set_is_refused_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = load_matrix(TINY)
    group = [matrix.variant("20-step baseline"), matrix.variant("8-step distill")]
    real = harness._write_variant_workflow

    def write(variant: Any, base: Any, object_info: Any, out: Path) -> Any:
        if variant.name == "8-step distill":
            raise WorkflowError("node 11 (SamplerCustom) has no input 'cfgg'")
        return real(variant, base, object_info, out)

    monkeypatch.setattr(harness, "_write_variant_workflow", write)
    monkeypatch.setattr(harness, "apply_overrides", lambda workflow, specs, info: [])
    measured = harness._Measured()
    jobs = harness._prepare_jobs(group, {}, {}, tmp_path, False, measured, print)
    assert [job.variant.name for job in jobs] == ["20-step baseline"]
    assert measured.failed == {
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
