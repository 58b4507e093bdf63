"""Result folding, the memory/cache flags, significance, report rendering (Markdown, CSV, PNG), PSNR/SSIM."""

from __future__ import annotations

import csv
import io
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from benchmarks import modes
from benchmarks.modes import DECODED_VIDEO, run_load, soak_verdict, ssim
from benchmarks.protocol import RunMeasure, flag_memory_not_returned, measure_from_record
from benchmarks.report import mode_headline, mode_line, render_csv, render_markdown, write_plots
from benchmarks.results import build_variant_result, failed_result, skipped_result
from runner.errors import PromptCancelledError
from runner.jobs.frames import psnr_db
from runner.local.workspace import REPO_ROOT

MB = 1024 * 1024


def _run(
    variant: str, index: int, total: float, *, warmup: bool = False, memory: int = 500 * MB
) -> RunMeasure:
    return RunMeasure(
        variant=variant,
        index=index,
        warmup=warmup,
        total_s=total,
        server_s=total - 0.01,
        phases={"model_load": 0.2 * total, "sampling": 0.7 * total, "vae_decode": 0.1 * total},
        step_s=0.05,
        peak_vram_bytes=None,
        peak_rss_bytes=2 * 10**9,
        energy_wh=None,
        memory_start_bytes=memory,
        memory_kind="rss",
        record_path=f"/runs/{variant}/{index}/run.json",
        output_path=None,
    )


def _results() -> list[Any]:
    base_runs = [
        _run("base", 0, 99.0, warmup=True),
        *(_run("base", i, t) for i, t in enumerate([10, 10.2, 9.8], 1)),
    ]
    fast_runs = [_run("fast", i, t) for i, t in enumerate([5.0, 7.0, 4.0])]
    baseline = [r.total_s for r in base_runs if not r.warmup]
    return [
        build_variant_result("base", base_runs, baseline, is_baseline=True),
        build_variant_result("fast", fast_runs, baseline),
        skipped_result("+ graph compile", "on CPU: too slow"),
    ]


def test_warmups_stay_out_of_the_statistics() -> None:
    base = _results()[0]
    assert base.total.n == 3
    assert base.total.median == 10.0
    assert (base.speedup.ratio, base.speedup.low, base.speedup.high) == (1.0, 1.0, 1.0)  # no self-interval


def test_markdown_has_the_seed_columns_spread_and_skip_reason() -> None:
    text = render_markdown(_results(), title="t", context=["cpu"])
    print(text)
    assert "| Config | Total time | Speed-up | Energy | Peak VRAM |" in text
    assert "| base | 10.00 s [9.84 s–10.16 s] | 1.00× (baseline) |" in text
    fast = next(line for line in text.splitlines() if line.startswith("| fast |"))
    assert "2.00×" in fast and "⚠" in fast  # stdev 1.53 over mean 5.33: flagged
    assert "n/a" in fast  # no energy on CPU, said so rather than 0
    assert "skipped: on CPU: too slow" in text
    assert "| Config | model_load | sampling | vae_decode | s/step |" in text


def test_significance_is_reported_and_the_n3_floor_is_said_plainly() -> None:
    base, fast, skipped = _results()
    assert base.significance is None  # the baseline is not tested against itself
    assert fast.significance is not None and fast.significance.p_value == pytest.approx(0.1)
    text = render_markdown([base, fast, skipped], title="t")
    header = next(line for line in text.splitlines() if line.startswith("| Config |"))
    assert header.endswith("| Spread | p | Notes |")
    fast_line = next(line for line in text.splitlines() if line.startswith("| fast |"))
    assert "2.00× [" in fast_line and "] n.s. |" in fast_line  # twice as fast, yet 3 runs cannot show it
    assert "| 0.100 |" in fast_line
    base_line = next(line for line in text.splitlines() if line.startswith("| base |"))
    assert "n.s." not in base_line
    assert (
        "- with n=3 per variant no difference can reach p < 0.05 (the smallest possible two-sided "
        "Mann-Whitney p is 0.100), however large it is; use --repeats ≥ 4"
    ) in text
    data = fast.to_json()["significance"]
    assert data["test"] == "mann-whitney-u, two-sided" and data["method"] == "exact"
    assert (data["p_value"], data["p_floor"], data["significant"]) == (pytest.approx(0.1), 0.1, False)
    assert data["can_be_significant"] is False


def test_five_repeats_reach_significance_without_the_floor_note() -> None:
    base_runs = [_run("base", i, t) for i, t in enumerate([10.0, 10.2, 9.8, 10.1, 9.9])]
    slow_runs = [_run("slow", i, t) for i, t in enumerate([12.0, 12.5, 11.9, 12.2, 12.1])]
    baseline = [r.total_s for r in base_runs]
    results = [
        build_variant_result("base", base_runs, baseline, is_baseline=True),
        build_variant_result("slow", slow_runs, baseline),
    ]
    assert results[1].significance is not None
    assert results[1].significance.p_value == pytest.approx(2 / 252)  # no overlap, C(10, 5) = 252
    text = render_markdown(results, title="t")
    slow_line = next(line for line in text.splitlines() if line.startswith("| slow |"))
    assert "n.s." not in slow_line and "| 0.008 |" in slow_line
    assert "no difference can reach" not in text


def test_csv_round_trips_raw_numbers() -> None:
    rows = list(csv.DictReader(io.StringIO(render_csv(_results()))))
    assert [r["config"] for r in rows] == ["base", "fast", "+ graph compile"]
    assert float(rows[1]["speedup"]) == pytest.approx(2.0)
    assert float(rows[1]["p_value"]) == pytest.approx(0.1)
    assert (rows[1]["p_method"], float(rows[1]["p_floor"])) == ("exact", pytest.approx(0.1))
    assert rows[0]["p_value"] == ""  # the baseline
    assert rows[1]["spread_warning"] == "True"
    assert rows[2]["skipped"] == "on CPU: too slow" and rows[2]["n"] == "0"


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    paths = write_plots(_results(), tmp_path)
    assert [p.name for p in paths] == ["total_time.png", "phases.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)


def test_memory_that_does_not_return_is_flagged() -> None:
    runs = [
        _run("v", 0, 1.0, warmup=True, memory=100 * MB),
        _run("v", 1, 1.0, memory=500 * MB),
        _run("v", 2, 1.0, memory=600 * MB),
        _run("v", 3, 1.0, memory=900 * MB),
    ]
    flagged = flag_memory_not_returned(runs, tolerance_mb=256)
    assert [r.flags for r in flagged] == [(), (), (), ("memory_not_returned",)]


def test_without_warmups_the_first_measured_run_is_no_memory_reference(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With --warmups 0 the first run may start on a fresh server, before anything is loaded: every
    later run of the first variant was flagged about 290 MB above it."""
    runs = [
        _run("v", 0, 1.0, memory=100 * MB),
        _run("v", 1, 1.0, memory=390 * MB),
        _run("v", 2, 1.0, memory=400 * MB),
    ]
    assert [r.flags for r in flag_memory_not_returned(runs, tolerance_mb=256)] == [(), (), ()]
    runs.append(_run("v", 3, 1.0, memory=700 * MB))
    assert flag_memory_not_returned(runs, tolerance_mb=256)[3].flags == ("memory_not_returned",)
    assert "v run 4: memory 310 MB above baseline" in caplog.text  # counted from 1, as every message
    assert flag_memory_not_returned(runs[:1], tolerance_mb=256)[0].flags == ()


def test_measure_from_record_reads_run_record_v2(tmp_path: Path) -> None:
    record = {
        "timing": {"wall_s": 1.6, "queue_s": 0.1, "server_execution_s": 1.4, "phases": {"sampling": 1.0}},
        "nodes": [
            {"node_id": "1", "cached": True, "step_seconds": None},
            {"node_id": "11", "cached": False, "step_seconds": [0.1, 0.3, 0.2]},
        ],
        "telemetry": {
            "available": True,
            "rss_start_bytes": 7,
            "peak_rss_bytes": 9,
            "cuda_max_reserved_bytes": None,
            "nvml_used_start_bytes": None,
            "energy_wh": None,
        },
        "outputs": [{"path": str(tmp_path / "a.mp4")}],
    }
    run = measure_from_record(record, tmp_path / "run.json", "v", 0, False)
    assert (run.total_s, run.step_s, run.memory_start_bytes, run.memory_kind) == (1.5, 0.2, 7, "rss")
    assert run.flags == ("cache_not_defeated",)
    assert run.output_path == str(tmp_path / "a.mp4")
    # a run in which path=auto timed INT8 kernels (their first use on the server) says so
    record["telemetry"]["events"] = [
        {"kind": "int8_kernel", "source": "table"},
        {"kind": "int8_kernel", "source": "measured"},
    ]
    assert measure_from_record(record, tmp_path / "run.json", "v", 0, False).flags[-1] == "int8_first_use"


def test_soak_verdict_sees_memory_growth() -> None:
    steady = [_run("v", i, 1.0, memory=500 * MB) for i in range(10)]
    leaking = [_run("v", i, 1.0, memory=(500 + 20 * i) * MB) for i in range(10)]
    assert soak_verdict(steady)["verdict"] == "stable"
    verdict = soak_verdict(leaking)
    assert verdict["verdict"] == "drifting"
    assert verdict["series"]["memory_start_bytes"]["verdict"] == "drifting"


def test_a_soak_or_load_cut_by_the_budget_says_so(tmp_path: Path) -> None:
    """--budget-s stops soak rounds and load jobs too: what ran is reported, and the headline says how
    much of the plan that was."""
    cut = soak_verdict([_run("v", 0, 1.0, memory=500 * MB)], planned=10)
    assert cut["verdict"] == "not enough rounds: 1 of 10 ran within --budget-s" and cut["rounds"] == 1
    part = soak_verdict([_run("v", i, 1.0, memory=500 * MB) for i in range(4)], planned=10)
    assert mode_headline("soak", {"variant": "v", **part}) == {
        "variant": "v",
        "verdict": "stable",
        "rounds": 4,
        "planned_rounds": 10,
    }
    load = run_load(
        REPO_ROOT / "workflows" / "ltxv_tiny_t2v.api.json",
        (),
        ["http://127.0.0.1:9"],  # never contacted: the deadline has passed
        tmp_path,
        concurrency=2,
        jobs=4,
        deadline=time.monotonic() - 1,
    )
    assert (load["jobs"], load["planned_jobs"], load["runs"]) == (0, 4, [])
    assert mode_headline("load", load)["verdict"].startswith("not run: --budget-s")
    assert (
        mode_headline("load", {"verdict": "ok", "throughput_jobs_per_min": 337.07230159864})[
            "throughput_jobs_per_min"
        ]
        == 337.072
    )


def test_psnr_and_ssim_on_known_images() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    assert psnr_db(image, image) == float("inf")
    assert ssim(image, image) == pytest.approx(1.0)
    shifted = np.clip(image.astype(int) + 5, 0, 255).astype(np.uint8)
    mse = np.mean((image.astype(float) - shifted.astype(float)) ** 2)
    assert psnr_db(image, shifted) == pytest.approx(10 * np.log10(255**2 / mse))
    noisy = np.clip(image + rng.normal(0, 40, image.shape), 0, 255).astype(np.uint8)
    measured = ssim(image, noisy)
    print(f"SSIM of a noisy copy: {measured:.3f}")
    assert 0.0 < measured < ssim(image, shifted) <= 1.0


def test_markdown_lists_the_launch_checks_verdicts() -> None:
    modes = {
        "consistency": {"base": {"verdict": "identical", "hashes": ["a", "a"]}},
        "soak": {"variant": "base", "verdict": "drifting", "rounds": 20, "series": {}},
    }
    text = render_markdown(_results(), title="t", modes=modes)
    assert "- consistency: base: identical\n" in text  # in words, not as JSON
    on_video = {"consistency": {"base": {"verdict": "different", "on": DECODED_VIDEO}}}
    assert "- consistency: base: different (on decoded video)\n" in render_markdown(
        _results(), title="t", modes=on_video
    )
    assert "- soak: drifting over 20 rounds of base\n" in text
    assert "Launch checks:" not in render_markdown(_results(), title="t")
    logs = {"logs": {"default": {"verdict": "clean"}, "--async-offload": {"verdict": "2 warnings"}}}
    assert "- logs: default: clean; --async-offload: 2 warnings\n" in render_markdown(
        _results(), title="t", modes=logs
    )


def test_a_load_and_a_cut_soak_are_said_in_words() -> None:
    load = {
        "verdict": "keeping up",
        "jobs": 6,
        "planned_jobs": 8,
        "throughput_jobs_per_min": 3.21456,
        "latency_s": {"p50": 1.5, "p95": 2.25, "p99": 2.5},
        "queue_wait_s": 0.125,
        "execution_s": 1.0,
        "jobs_per_server": {"http://127.0.0.1:8188": 6},
        "runs": [],
    }
    assert mode_line("load", load) == (
        "keeping up: 6 jobs of 8 planned, 3.215 jobs/min, latency p50 1.5 s / p95 2.25 s / p99 2.5 s, "
        "median queue wait 0.125 s, median execution 1 s, per server: http://127.0.0.1:8188 6"
    )
    assert mode_line("load", {"verdict": "not run: --budget-s ran out", "jobs": 0}) == (
        "not run: --budget-s ran out"
    )
    soak = {"variant": "v", "verdict": "stable", "rounds": 4, "planned_rounds": 10}
    assert mode_line("soak", soak) == "stable over 4 rounds of v (10 planned)"


def test_bench_exits_6_when_a_variant_failed() -> None:
    from rich.console import Console

    from runner.cli.bench import bench_exit_code

    err = Console(file=io.StringIO(), width=200)
    base, fast, _ = _results()
    outcome = SimpleNamespace(results=[base, fast], server_lost=[])
    assert bench_exit_code(outcome, err) == 0
    outcome.server_lost.append("the server stopped answering in run 3 of base: …")
    assert bench_exit_code(outcome, err) == 4  # the runs made are reported; the matrix is not complete
    assert "the server stopped answering in run 3" in err.file.getvalue()
    outcome.results.append(failed_result("sage", "PromptFailedError in run 1: node 11"))
    assert bench_exit_code(outcome, err) == 6
    assert "1 variant(s) failed: sage" in err.file.getvalue()


def test_the_report_says_when_speed_ups_cannot_be_read_as_usual() -> None:
    from benchmarks.caveats import comparison_caveats

    variants = (
        SimpleNamespace(name="base", server_args=()),
        SimpleNamespace(name="fast", server_args=("--x",)),
    )
    matrix = SimpleNamespace(baseline="base", reference="base", variants=variants)
    base, fast, _ = _results()
    caveat = (
        "fast: timed on another server than the baseline (launch flags need one), so the speed-up "
        "compares two time windows, and a change of the machine's load between them counts as speed-up "
        "(its CI and p do not see it): check in the phase table that the phases its launch flags do not "
        "touch stayed put"
    )
    assert comparison_caveats(matrix, [base, fast]) == [caveat]
    # the baseline with flags, the other variant without: still two servers
    flipped = (
        SimpleNamespace(name="base", server_args=("--x",)),
        SimpleNamespace(name="fast", server_args=()),
    )
    assert comparison_caveats(
        SimpleNamespace(baseline="base", reference="base", variants=flipped), [base, fast]
    ) == [caveat]
    same = (
        SimpleNamespace(name="base", server_args=("--x",)),
        SimpleNamespace(name="fast", server_args=("--x",)),
    )
    assert (
        comparison_caveats(SimpleNamespace(baseline="base", reference="base", variants=same), [base, fast])
        == []
    )
    unmeasured = skipped_result("base", "on CPU: needs CUDA")
    assert comparison_caveats(matrix, [unmeasured, fast]) == [
        "**no speed-up: the baseline “base” was not measured (on CPU: needs CUDA)**"
    ]
    # a quality reference of its own that was not measured: no PSNR/SSIM anywhere, said so
    elsewhere = SimpleNamespace(baseline="base", reference="fast", variants=same)
    assert comparison_caveats(elsewhere, [base, skipped_result("fast", "needs server flags --x")]) == [
        "no PSNR/SSIM: the quality reference “fast” was not measured (needs server flags --x)"
    ]


def test_nothing_measured_is_not_a_success(tmp_path: Path) -> None:
    from rich.console import Console

    from runner.cli.bench import bench_exit_code

    err = Console(file=io.StringIO(), width=300)
    cut = "the time budget (--budget-s 1) ran out before its measured runs"
    outcome = SimpleNamespace(results=[skipped_result("a", cut), skipped_result("b", cut)], server_lost=[])
    assert bench_exit_code(outcome, err) == 7
    assert "nothing was measured (a: the time budget" in err.file.getvalue()
    outcome.results = [skipped_result("a", "on CPU: needs CUDA")]
    assert bench_exit_code(outcome, err) == 1
    assert write_plots(outcome.results, tmp_path) == [] and not list(tmp_path.iterdir())


def test_the_log_check_finds_fallbacks_offloads_errors_and_passes_routine_lines(tmp_path: Path) -> None:
    """The seed's launch check "logs clean": no operator fallback, no precision warning, no offload
    anomaly; ComfyUI's routine lines (manual casts, mixed precision, devices) are not findings, and a line
    or an exception counts once."""
    from benchmarks.modes import scan_server_log

    clean = tmp_path / "clean.log"
    clean.write_text(
        "model weight dtype torch.float32, manual cast: None\n"
        "model weight dtype torch.float8_e4m3fn, manual cast: torch.bfloat16\n"
        "model weight dtype torch.bfloat16, manual cast: torch.float32\n"
        "Using mixed precision operations: 120 quantized layers\n"
        "Set vram state to: NORMAL_VRAM\n"
        "VAE load device: cpu, offload device: cpu, dtype: torch.float32\n"
        "Prompt executed in 0.41 seconds\n",
        encoding="utf-8",
    )
    assert scan_server_log(clean)["verdict"] == "clean"
    dirty = tmp_path / "dirty.log"
    dirty.write_text(
        "Set vram state to: LOW_VRAM\n"
        "Patch Attention: falling back to the original attention: head dim 80 not in [64, 96, 128]\n"
        "Patch Attention on LTXV: attention: sage → original (sageattention is not installed: attention "
        "left unchanged)\n"
        "loaded partially 9000.0 8999.9 0\n"
        "!!! Exception during processing !!! CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "Traceback (most recent call last):\n"
        '  File "execution.py", line 1, in execute\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "WARNING: NaN values in the latent\n",
        encoding="utf-8",
    )
    found = scan_server_log(dirty)
    assert found["counts"] == {
        "error": 1, "memory": 2, "fallback": 2, "offload": 2, "precision": 1, "warning": 0
    }  # fmt: skip
    assert found["verdict"] == "8 finding(s): error 1, memory 2, fallback 2, offload 2, precision 1"
    assert found["examples"][0] == "Set vram state to: LOW_VRAM"


def test_ctrl_c_in_a_load_test_cancels_the_running_prompts_and_starts_no_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C reaches the main thread only: the jobs' threads must be told, or the bench would wait for
    every planned job. Each running prompt is cancelled at its next event (as run_workflow does on
    Ctrl-C); no queued job starts."""
    started: list[int] = []
    cancelled: list[int] = []
    lock = threading.Lock()

    def fake_run(path: Path, options: Any, on_event: Any = None) -> Any:
        with lock:
            started.append(len(started))
            second = len(started) == 2
        # A prompt that runs 10 s unless cancelled, with an event every 10 ms. 50 ms into the second, the
        # user presses Ctrl-C (Linux hands a process's SIGINT to its main thread)
        for event in range(1000):
            if second and event == 5:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            try:
                on_event(object())
            except KeyboardInterrupt:
                cancelled.append(len(cancelled))
                raise PromptCancelledError("prompt cancelled") from None
            time.sleep(0.01)
        pytest.fail("a running prompt was not cancelled")

    monkeypatch.setattr(modes, "run_workflow", fake_run)
    # As the CLI has it; pytest started in the background (`pytest &`, nohup) inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            modes.run_load(
                REPO_ROOT / "workflows" / "ltxv_tiny_t2v.api.json",
                (),
                ["http://127.0.0.1:9"],
                tmp_path,
                concurrency=2,
                jobs=20,
            )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(started) == 2 and len(cancelled) == 2


def test_one_run_per_variant_shows_no_spread_and_no_interval() -> None:
    """n=1 read as perfectly precise: spread "0.0 %" and "1.37× [1.37–1.37]" (the first H200 tables)."""
    base = build_variant_result("base", [_run("base", 0, 10.0)], [10.0], is_baseline=True)
    fast = build_variant_result("fast", [_run("fast", 0, 8.0)], [10.0])
    rows = {line.split("|")[1].strip(): line for line in render_markdown_rows([base, fast])}
    assert "10.00 s (n=1)" in rows["base"] and "n/a (n=1)" in rows["base"]
    assert "1.25× (n=1: no interval) n.s." in rows["fast"] and "0.0 %" not in rows["fast"]
    table = list(csv.DictReader(io.StringIO(render_csv([base, fast]))))
    assert [row["total_stdev_s"] for row in table] == ["", ""]
    three = _results()[:2]  # n=3: the interval and spread as before
    assert "[" in render_markdown_rows(three)[1].split("|")[3]


def render_markdown_rows(results: list[Any]) -> list[str]:
    from benchmarks.report import format_row

    return ["| " + " | ".join(format_row(result)) + " |" for result in results]


def test_what_patch_attention_did_is_in_each_runs_flags_and_an_unpatched_one_is_called_out() -> None:
    """A variant whose Patch Attention left the attention unchanged (SageAttention not installed) was
    a measured row with a speed-up and nothing in its notes."""
    from benchmarks.caveats import attention_flags, comparison_caveats

    unchanged = {"kind": "attention", "key": "not patched: sageattention is not installed: attention left "
                 "unchanged", "calls": 1, "outcome": "not patched"}  # fmt: skip
    ran = {"kind": "attention", "key": "sdpa", "calls": 32, "outcome": "ran"}
    other = {"kind": "int8_kernels", "key": "x"}
    assert attention_flags({"events": [other, ran]}) == ["attention ran: sdpa"]
    flags = attention_flags({"events": [unchanged]})
    assert flags == ["attention not patched (sageattention is not installed: attention left unchanged)"]
    record = {"timing": {"wall_s": 2.0}, "telemetry": {"events": [unchanged]}}
    measure = measure_from_record(record, Path("run.json"), "sage", 0, False)
    assert measure.flags == tuple(flags)
    base, fast, _ = _results()
    sage = build_variant_result("sage", [replace(r, flags=tuple(flags)) for r in fast.runs], [10.0, 10.2])
    same = (SimpleNamespace(name="base", server_args=()), SimpleNamespace(name="sage", server_args=()))
    matrix = SimpleNamespace(baseline="base", reference="base", variants=same)
    assert comparison_caveats(matrix, [base, sage]) == [
        f"**sage: {flags[0]}: its speed-up is not the attention's**"
    ]
    from benchmarks.report import format_row

    assert format_row(sage)[-1] == flags[0]  # in all 3 runs: no count (it read "×3", and "×1" at n=1)
    some = replace(sage, flags={flags[0]: 3, "memory_not_returned": 1})
    assert format_row(some)[-1] == f"{flags[0]}; memory_not_returned (1 of 3 runs)"


def test_the_report_says_what_a_server_given_with_server_was_launched_with() -> None:
    """Its launch flags are in every row (an `--async-offload` there made the baseline non-blocking),
    and were only in bench.json's environment."""
    from benchmarks.harness import BenchSettings
    from benchmarks.matrix import load_matrix
    from benchmarks.report import run_context

    matrix = load_matrix(REPO_ROOT / "benchmarks" / "seed_table_tiny.toml")
    given = BenchSettings(out_dir=Path("out"), servers=("http://127.0.0.1:8427",))
    environment = {"comfyui_argv": ["main.py", "--cpu", "--async-offload", "--port", "8427"]}
    lines = run_context(matrix, given, environment)
    assert lines[-1] == (
        "server http://127.0.0.1:8427 (--server) launched with `--cpu --async-offload --port 8427`: every "
        "variant run ran on it as it is, these flags included"
    )
    started = run_context(matrix, BenchSettings(out_dir=Path("out")), environment)
    assert not any("--server" in line for line in started)  # the bench's own servers: flags per variant
    # --server-warmups: right after the start of a server the bench started; a given one may be warm
    warmed = run_context(matrix, replace(given, server_warmups=1), environment)
    assert any("before its measured runs (a --server may have run prompts before)" in line for line in warmed)
    own = run_context(matrix, BenchSettings(out_dir=Path("out"), server_warmups=1), environment)
    assert any("right after the server started" in line for line in own)
