"""Matrix files: the shipped ones parse, inheritance and insertion work, errors name file/variant/key;
the run order (interleaved or sequential) and the cache defeat before every run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import protocol
from benchmarks.bench_servers import comfy_flags, place_groups
from benchmarks.matrix import Matrix, MatrixError, load_matrix, select_variants, variant_slug
from benchmarks.protocol import PlannedRun, VariantRun, plan_runs, run_variants
from benchmarks.report import format_row
from benchmarks.results import failed_result
from runner.errors import PromptFailedError, ServerUnreachableError, WorkflowError
from runner.graph.workflow import apply_overrides, load_workflow
from runner.jobs.run import RunOptions
from runner.local.workspace import REPO_ROOT, WORKFLOWS_DIR
from runner.transport.client import ComfyClient

TINY = REPO_ROOT / "benchmarks" / "seed_table_tiny.toml"
FULL = REPO_ROOT / "benchmarks" / "seed_table.toml"
HEADER = f'[bench]\nworkflow = "{WORKFLOWS_DIR / "ltxv_tiny_t2v.api.json"}"\n'


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(HEADER + body, encoding="utf-8")
    return path


def test_tiny_matrix_has_the_seed_rows_in_order() -> None:
    matrix = load_matrix(TINY)
    names = [v.name for v in matrix.variants]
    assert names == [
        "20-step baseline",
        "8-step distill",
        "8-step + non-blocking transfer",
        "8-step + graph compile",
        "8-step + attention acceleration",
    ]
    assert matrix.baseline == matrix.reference == "20-step baseline"
    transfer = matrix.variant("8-step + non-blocking transfer")
    assert transfer.overrides == ("9.steps=20", "9.steps=8", "11.cfg=1.0")  # inherited, the later one wins
    assert transfer.server_args == ("--async-offload",)
    assert [i.class_type for i in transfer.inserts] == ["LoraLoaderModelOnly"]
    assert matrix.variant("8-step + graph compile").skip_on_cpu
    assert matrix.mode == "cold"  # the seed unloads models before every run


@pytest.mark.parametrize("name", ["seed_table.toml", "seed_table_wan.toml", "seed_table_wan22.toml"])
def test_the_gpu_matrices_time_non_blocking_transfer_against_a_baseline_without_it(name: str) -> None:
    """ComfyUI 0.3.75 offloads asynchronously by default on NVIDIA: the "plain" baseline was already
    non-blocking, and the --async-offload row compared nothing (1.10× on the H200 of 2026-11-30 was two
    time windows). Every other row keeps it off, as the baseline, by inheritance."""
    matrix = load_matrix(REPO_ROOT / "benchmarks" / name)
    assert len(matrix.variants) == 5 and not matrix.fixtures
    flags = {v.name: v.server_args for v in matrix.variants}
    transfer = next(n for n in flags if "non-blocking" in n)
    assert flags.pop(transfer) == ("--async-offload",)  # its own flags replace the inherited ones
    assert set(flags.values()) == {("--disable-async-offload",)}


def test_the_async_offload_caveat_is_said_on_cuda_only_against_a_baseline_that_offloads_too() -> None:
    from benchmarks.caveats import comparison_caveats

    tiny, full = load_matrix(TINY), load_matrix(FULL)
    transfer = "8-step + non-blocking transfer"
    results = [SimpleNamespace(name=v.name, total=1.0, flags={}) for v in tiny.variants]
    h200 = {"type": "cuda", "name": "cuda:0 NVIDIA H200 : cudaMallocAsync"}
    rocm = {"type": "cuda", "name": "cuda:0 AMD Instinct MI300X : native"}  # not offloaded by default
    assert not [line for line in comparison_caveats(tiny, results, rocm) if "compared nothing" in line]
    said = [line for line in comparison_caveats(tiny, results, h200) if "compared nothing" in line]
    assert said == [
        f"**{transfer}: ComfyUI 0.3.75 offloads weights asynchronously by default on NVIDIA, so the baseline "
        "did too: --async-offload compared nothing (launch the baseline with --disable-async-offload)**"
    ]
    assert not [
        line
        for line in comparison_caveats(tiny, results, {"type": "cpu", "name": "cpu"})
        if "compared nothing" in line
    ]
    assert not [line for line in comparison_caveats(full, results, h200) if "compared nothing" in line]


def test_inserted_nodes_chain_onto_the_target_input() -> None:
    matrix = load_matrix(TINY)
    base = load_workflow(matrix.workflow)
    workflow = matrix.variant("8-step + attention acceleration").build_workflow(base)
    assert workflow["11"]["inputs"]["model"] == ["bench_attention", 0]
    assert workflow["bench_attention"]["inputs"]["model"] == ["bench_lora", 0]
    assert workflow["bench_lora"]["inputs"]["model"] == ["1", 0]
    assert "bench_compile" not in workflow  # one optimisation on top of the distill, not a stack
    assert "bench_lora" not in base  # the base workflow is left alone


def test_the_wan22_matrix_splits_the_steps_and_patches_both_experts() -> None:
    """Each expert gets its own 4-step LoRA and, in the optimisation rows, its own patch; the step split
    moves with the step count (high noise 0→10 of 20, then 0→2 of 4; low noise on to the end)."""
    matrix = load_matrix(REPO_ROOT / "benchmarks" / "seed_table_wan22.toml")
    base = load_workflow(matrix.workflow)
    variant = matrix.variant("4-step + attention acceleration")
    workflow = variant.build_workflow(base)
    apply_overrides(workflow, list(variant.overrides), None)
    for sampler, sampling, lora, patch in (
        ("10", "4", "bench_lora_high", "bench_attention_high"),
        ("12", "5", "bench_lora_low", "bench_attention_low"),
    ):
        assert workflow[sampler]["inputs"]["model"] == [patch, 0]
        assert workflow[patch]["inputs"]["model"] == [sampling, 0]
        assert workflow[sampling]["inputs"]["model"] == [lora, 0]
        assert workflow[sampling]["inputs"]["shift"] == 5.0
        assert workflow[sampler]["inputs"]["steps"] == 4 and workflow[sampler]["inputs"]["cfg"] == 1.0
    assert "high_noise" in workflow["bench_lora_high"]["inputs"]["lora_name"]
    assert "low_noise" in workflow["bench_lora_low"]["inputs"]["lora_name"]
    assert [workflow["10"]["inputs"][k] for k in ("start_at_step", "end_at_step")] == [0, 2]
    assert [workflow["12"]["inputs"][k] for k in ("start_at_step", "end_at_step")] == [2, 10000]
    baseline = matrix.variant("20-step baseline")
    workflow = baseline.build_workflow(base)
    apply_overrides(workflow, list(baseline.overrides), None)
    assert "bench_lora_high" not in workflow
    assert [workflow["10"]["inputs"][k] for k in ("steps", "start_at_step", "end_at_step")] == [20, 0, 10]
    assert [workflow["12"]["inputs"][k] for k in ("steps", "start_at_step", "end_at_step")] == [20, 10, 10000]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[variant]]\nname = "a"\nsteps = 3\n', "variant 'a': unknown key(s) ['steps']"),
        ('[[variant]]\nname = "a"\nextends = "b"\n', "variant 'a': key 'extends': 'b' is not an earlier"),
        ('[[variant]]\nname = "a"\nset = ["steps=3"]\n', "variant 'a': key 'set': 'steps=3'"),
        ('[[variant]]\nname = "a"\n[[variant]]\nname = "a"\n', "variant 'a': duplicate name"),
        (
            '[[variant]]\nname = "a"\nserver_args = ["--port=9000"]\n',
            "variant 'a': key 'server_args': ComfyUI flag '--port=9000' after `--`: leanvideo passes --port",
        ),
        ('repeats = 0\n[[variant]]\nname = "a"\n', "repeats must be 1 to 1000, got 0"),
        # the run plan is made up front: ten million runs filled the memory before the first one
        ('repeats = 10000000\n[[variant]]\nname = "a"\n', "repeats must be 1 to 1000, got 10000000"),
        ('warmups = 5000\n[[variant]]\nname = "a"\n', "warmups must be at most 1000, got 5000"),
        (
            f'[[variant]]\nname = "{"a" * 300}"\n',
            "key 'name': too long for the file names its runs are stored under (300 bytes",
        ),
        ('[[variant]]\nname = "a"\nserver_args = [""]\n', "variant 'a': key 'server_args': an empty flag"),
        ('mode = "hot"\n[[variant]]\nname = "a"\n', "mode must be one of"),
        ('order = "random"\n[[variant]]\nname = "a"\n', "order must be one of ('interleaved', 'sequential')"),
        ('baseline = "zz"\n[[variant]]\nname = "a"\n', "baseline 'zz' is not a variant"),
        ('warmups = true\n[[variant]]\nname = "a"\n', "key 'warmups' has the wrong type"),
        ('timeout_s = -1\n[[variant]]\nname = "a"\n', "key 'timeout_s' must be > 0 seconds, got -1"),
        ('timeout_s = 0\n[[variant]]\nname = "a"\n', "key 'timeout_s' must be > 0 seconds, got 0"),
        ('timeout_s = inf\n[[variant]]\nname = "a"\n', "key 'timeout_s' must be a finite number"),
        ('memory_tolerance_mb = -1\n[[variant]]\nname = "a"\n', "key 'memory_tolerance_mb' must be ≥ 0"),
        (
            '[[variant]]\nname = "8 steps"\n[[variant]]\nname = "8-steps"\n',
            "variant '8-steps': its file name '8-steps' is also variant '8 steps''s",
        ),
        (
            '[[variant]]\nname = "a"\n[[variant.insert]]\nid = "x"\nclass_type = "X"\n'
            'link_input = "model"\ntarget = "11"\n',
            "variant 'a': insert #1 key 'target': '11' is not NODE.input",
        ),
        ("", "no [[variant]] tables"),
    ],
)
def test_errors_name_file_variant_and_key(tmp_path: Path, body: str, message: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(MatrixError) as caught:
        load_matrix(path)
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


def test_a_zero_memory_tolerance_is_kept(tmp_path: Path) -> None:
    matrix = load_matrix(_write(tmp_path, 'memory_tolerance_mb = 0\n[[variant]]\nname = "a"\n'))
    assert matrix.memory_tolerance_mb == 0.0
    assert matrix.timeout_s == 1800.0


def test_missing_workflow_and_bad_toml_are_named(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[bench]\nworkflow = "nope.json"\n[[variant]]\nname = "a"\n', encoding="utf-8")
    with pytest.raises(MatrixError, match=r"workflow 'nope\.json': no such file"):
        load_matrix(path)
    (tmp_path / "flows").mkdir()
    path.write_text('[bench]\nworkflow = "flows"\n[[variant]]\nname = "a"\n', encoding="utf-8")
    with pytest.raises(MatrixError, match=r"workflow 'flows': a folder, not a workflow file"):
        load_matrix(path)
    path.write_text("[bench\n", encoding="utf-8")
    with pytest.raises(MatrixError, match="cannot read matrix"):
        load_matrix(path)
    path.write_bytes(b"\xff\xfe[bench]\n")
    with pytest.raises(MatrixError, match=r"m\.toml is not UTF-8 text \(byte 0\): save it as UTF-8"):
        load_matrix(path)


def test_order_defaults_to_interleaved_and_can_be_sequential(tmp_path: Path) -> None:
    assert load_matrix(_write(tmp_path, '[[variant]]\nname = "a"\n')).order == "interleaved"
    path = _write(tmp_path, 'order = "sequential"\n[[variant]]\nname = "a"\n')
    assert load_matrix(path).order == "sequential"


def _names(plan: list[PlannedRun]) -> list[str]:
    return [f"{run.variant}{run.index}{'w' if run.warmup else ''}" for run in plan]


def test_interleaved_plan_runs_warmups_then_repeats_round_robin() -> None:
    plan = plan_runs(["A", "B", "C"], warmups=1, repeats=2, order="interleaved")
    assert _names(plan) == ["A0w", "B0w", "C0w", "A1", "B1", "C1", "A2", "B2", "C2"]
    assert _names(plan_runs(["A", "B"], 0, 3, "interleaved")) == ["A0", "B0", "A1", "B1", "A2", "B2"]
    assert _names(plan_runs(["A"], 2, 2, "interleaved")) == ["A0w", "A1w", "A2", "A3"]


def test_sequential_plan_runs_each_variant_back_to_back() -> None:
    plan = plan_runs(["A", "B"], warmups=1, repeats=2, order="sequential")
    assert _names(plan) == ["A0w", "A1", "A2", "B0w", "B1", "B2"]


def test_plan_runs_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="run order must be one of"):
        plan_runs(["A"], 1, 1, "shuffled")
    with pytest.raises(ValueError, match="repeats ≥ 1"):
        plan_runs(["A"], 0, 0, "interleaved")
    with pytest.raises(ValueError, match="unique"):
        plan_runs(["A", "A"], 0, 1, "interleaved")


def _fake_record(options: RunOptions) -> Any:
    """What ``run_workflow`` returns, reduced to what the protocol reads."""
    timing = {"wall_s": 1.0, "queue_s": 0.0, "server_execution_s": 0.9, "phases": {}}
    record = {"timing": timing, "nodes": [], "telemetry": {"available": False}, "outputs": []}
    return SimpleNamespace(record=record, record_path=options.out_dir / "run.json")


def _two_jobs(tmp_path: Path) -> tuple[Matrix, list[VariantRun]]:
    """The tiny matrix and jobs for its baseline (workflow ``a``) and distill (``b``) variants."""
    matrix = load_matrix(TINY)
    jobs = [
        VariantRun(matrix.variant(name), tmp_path / f"{key}.api", tmp_path / key)
        for key, name in (("a", "20-step baseline"), ("b", "8-step distill"))
    ]
    return matrix, jobs


def test_run_variants_defeats_the_cache_before_every_run_in_plan_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No server: the /free call and the runner are replaced by fakes that log what was called."""
    matrix, jobs = _two_jobs(tmp_path)
    calls: list[str] = []

    def fake_defeat(client: ComfyClient, mode: str, **_: Any) -> None:
        calls.append(f"free:{mode}")

    def fake_run(path: Path, options: RunOptions) -> Any:
        calls.append(f"run:{path.stem}")
        return _fake_record(options)

    monkeypatch.setattr(protocol, "defeat_cache", fake_defeat)
    monkeypatch.setattr(protocol, "run_workflow", fake_run)
    runs = run_variants(
        matrix, jobs, "http://127.0.0.1:1", order="interleaved", warmups=1, repeats=2, first_sequence=10
    )
    assert calls == [item for stem in "ababab" for item in ("free:cold", f"run:{stem}")]
    baseline = runs["20-step baseline"]
    assert [(r.index, r.warmup, r.sequence) for r in baseline] == [
        (0, True, 10),
        (1, False, 12),
        (2, False, 14),
    ]
    assert [r.sequence for r in runs["8-step distill"]] == [11, 13, 15]


def test_a_failing_variant_is_reported_and_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An optimisation that fails on this machine (here: the distill's second run) loses its runs and
    keeps its error; the baseline's runs go on. Without ``failures`` the error propagates."""
    matrix, jobs = _two_jobs(tmp_path)
    ran: list[str] = []

    def fake_run(path: Path, options: RunOptions) -> Any:
        ran.append(path.stem)
        if path.stem == "b" and ran.count("b") == 2:
            raise PromptFailedError("node 11 (SamplerCustom): CUDA out of memory.\nTried to allocate 2 GiB")
        return _fake_record(options)

    monkeypatch.setattr(protocol, "defeat_cache", lambda client, mode, **_: None)
    monkeypatch.setattr(protocol, "run_workflow", fake_run)
    failures: dict[str, str] = {}
    runs = run_variants(
        matrix, jobs, "http://127.0.0.1:1", order="interleaved", warmups=1, repeats=3, failures=failures
    )
    assert ran == ["a", "b", "a", "b", "a", "a"]  # b's remaining runs are cancelled
    assert list(runs) == ["20-step baseline"] and len(runs["20-step baseline"]) == 4
    assert failures == {
        "8-step distill": "PromptFailedError in run 2: node 11 (SamplerCustom): CUDA out of memory. "
        "Tried to allocate 2 GiB"
    }
    row = format_row(failed_result("8-step distill", failures["8-step distill"]))
    assert row[1] == "failed" and row[-1].startswith("failed: PromptFailedError in run 2: node 11")

    ran.clear()
    with pytest.raises(PromptFailedError, match="out of memory"):
        run_variants(matrix, jobs, "http://127.0.0.1:1", order="interleaved", warmups=1, repeats=3)


def test_a_server_that_goes_away_ends_its_runs_and_the_made_ones_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed server (OOM killer, a crash): no run follows on it, and the runs made are kept, so the
    report can still be written; without ``on_server_lost`` the error propagates."""
    matrix, jobs = _two_jobs(tmp_path)
    ran: list[str] = []

    def fake_run(path: Path, options: RunOptions) -> Any:
        ran.append(path.stem)
        if len(ran) == 5:
            raise ServerUnreachableError("cannot reach ComfyUI at http://127.0.0.1:1: connection refused")
        return _fake_record(options)

    monkeypatch.setattr(protocol, "defeat_cache", lambda client, mode, **_: None)
    monkeypatch.setattr(protocol, "run_workflow", fake_run)
    lost: list[str] = []
    runs = run_variants(matrix, jobs, "http://127.0.0.1:1", order="interleaved", on_server_lost=lost.append)
    assert ran == ["a", "b", "a", "b", "a"]  # nothing after the server went
    assert {name: len(r) for name, r in runs.items()} == {"20-step baseline": 2, "8-step distill": 2}
    assert lost == [
        f"{protocol.SERVER_LOST} in run 3 of 20-step baseline: cannot reach ComfyUI at "
        "http://127.0.0.1:1: connection refused; 8 planned run(s) not made"
    ]
    with pytest.raises(ServerUnreachableError):
        ran.clear()
        run_variants(matrix, jobs, "http://127.0.0.1:1", order="interleaved")


def _record_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the server calls with fakes; the list returned fills with each run's workflow stem."""
    ran: list[str] = []

    def fake_run(path: Path, options: RunOptions) -> Any:
        ran.append(path.stem)
        return _fake_record(options)

    monkeypatch.setattr(protocol, "defeat_cache", lambda client, mode, **_: None)
    monkeypatch.setattr(protocol, "run_workflow", fake_run)
    return ran


def test_no_run_starts_after_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``--budget-s``: the clock is checked before every run; the runs made so far are kept."""
    matrix, jobs = _two_jobs(tmp_path)
    clock = iter(range(100))  # one tick per check
    ran = _record_runs(monkeypatch)
    runs = run_variants(
        matrix,
        jobs,
        "http://127.0.0.1:1",
        order="interleaved",
        warmups=1,
        repeats=3,
        deadline=3.0,
        clock=lambda: float(next(clock)),
    )
    assert ran == ["a", "b", "a"]  # checks at 0, 1, 2 pass; at 3 the budget is used up
    assert "5 planned run(s) on http://127.0.0.1:1 not made" in caplog.text  # of 2 warmups + 2 × 3
    assert [r.warmup for r in runs["20-step baseline"]] == [True, False]
    assert [r.warmup for r in runs["8-step distill"]] == [True]  # the harness reports it as skipped


def test_variant_names_in_any_script_get_distinct_file_names(tmp_path: Path) -> None:
    """The seed's rows are named "8 步 + …": their file names kept only the "8" and clashed."""
    body = '[[variant]]\nname = "8 步 + 注意力"\n[[variant]]\nname = "8 步 + 非阻塞"\n'
    matrix = load_matrix(_write(tmp_path, body))
    assert [variant_slug(v.name) for v in matrix.variants] == ["8-步-注意力", "8-步-非阻塞"]
    assert variant_slug("8-step + graph compile") == "8-step-graph-compile"  # as before
    assert variant_slug("a_b") == "a-b" and variant_slug("+++") == "variant"


def test_a_group_needing_server_flags_under_server_is_said_so_even_past_the_budget(tmp_path: Path) -> None:
    """Not "the time budget ran out": that variant could never run on a --server, with any budget."""
    from benchmarks import harness

    matrix = load_matrix(TINY)
    group = [v for v in matrix.variants if v.server_args]
    given = {"http://127.0.0.1:9": ("--cpu",)}  # launched without them
    placed = place_groups([(), group[0].server_args], given)
    measured = harness._Measured(given=given, placed=placed)
    settings = harness.BenchSettings(out_dir=tmp_path, servers=tuple(given), budget_s=1.0)
    harness._run_group(matrix, settings, {}, group[0].server_args, group, measured, 0.0, lambda _: None)
    flags = " ".join(group[0].server_args)
    said = f"needs server flags {flags} (no --server was launched with them)"
    assert measured.skipped == {v.name: said for v in group}


def test_each_flag_set_goes_to_the_given_servers_launched_with_it_and_none_of_the_others_flags() -> None:
    """With --server, every variant needing launch flags was skipped, even with a server that had them."""
    given = {
        "http://a": ("--cpu", "--port", "1"),
        "http://b": ("--cpu", "--async-offload", "--port", "2"),
        "http://c": ("--reserve-vram=2", "--async-offload"),  # two of the matrix's flags: neither set's
        "http://d": ("--cpu", "--port", "4"),
    }
    groups = [(), ("--async-offload",), ("--reserve-vram", "2"), ("--reserve-vram", "4")]
    placed = place_groups(groups, given)
    assert placed[()] == ("http://a", "http://d")  # first given first; both for --load
    assert placed[("--async-offload",)] == ("http://b",)
    assert (
        placed[("--reserve-vram", "2")]
        == "needs server flags --reserve-vram 2 (no --server was launched with them)"
    )
    given["http://e"] = ("--reserve-vram=2",)  # the value written with "=", as argparse takes it too
    assert place_groups(groups, given)[("--reserve-vram", "2")] == ("http://e",)
    assert place_groups(groups, given)[("--reserve-vram", "4")] == (
        "needs server flags --reserve-vram 4 (no --server was launched with them)"
    )
    only_flagged = {"http://b": given["http://b"]}  # the baseline would run non-blocking: refused
    assert place_groups(groups[:2], only_flagged)[()] == (
        "needs a server launched without --async-offload (every --server has one)"
    )
    assert place_groups([()], only_flagged)[()] == ("http://b",)  # no variant has flags: any server fits
    short = {"http://s": ("--async-off",), "http://p": ()}  # as argparse takes it: that flag
    known = comfy_flags()  # the pinned ComfyUI's: --cpu is one, not short for --cpu-vae
    assert {"--async-offload", "--cpu", "--cpu-vae", "--disable-async-offload"} <= known
    assert place_groups(groups[:2], short, known) == {(): ("http://p",), ("--async-offload",): ("http://s",)}
    one = place_groups(groups[:2], {"http://p": (), "http://o": ("--async-offload", "1")}, known)
    assert isinstance(one[("--async-offload",)], str)  # one stream is not the variant's default two
    cpu = place_groups([(), ("--cpu-vae",)], {"http://a": ("--cpu",), "http://b": ()}, known)
    assert cpu == {(): ("http://a", "http://b"), ("--cpu-vae",): cpu[("--cpu-vae",)]}
    assert isinstance(cpu[("--cpu-vae",)], str)  # no server has it


def test_soak_and_load_asked_for_but_not_run_are_said_with_why(tmp_path: Path) -> None:
    from benchmarks import harness
    from benchmarks.report import mode_line

    matrix = load_matrix(TINY)
    measured = harness._Measured(skipped={matrix.baseline: "on CPU: needs CUDA"})
    settings = harness.BenchSettings(out_dir=tmp_path, soak=10, load=True)
    harness._say_unrun_launch_checks(matrix, settings, measured)
    said = (
        f"not run: they run on the baseline {matrix.baseline!r}, which was not measured (on CPU: needs CUDA)"
    )
    assert measured.modes == {"soak": {"verdict": said}, "load": {"verdict": said}}
    assert mode_line("soak", measured.modes["soak"]) == mode_line("load", measured.modes["load"]) == said
    measured = harness._Measured(modes={"soak": {"verdict": "stable"}})  # run: kept; not asked: not said
    harness._say_unrun_launch_checks(matrix, harness.BenchSettings(out_dir=tmp_path, soak=10), measured)
    assert measured.modes == {"soak": {"verdict": "stable"}}


def test_a_baseline_that_would_be_skipped_is_a_problem_before_any_run() -> None:
    """Else every other variant ran, and the report had no speed-up (nor soak or load) at the end."""
    from benchmarks.preflight import baseline_problems

    matrix = load_matrix(TINY)
    compiled = next(v for v in matrix.variants if v.skip_on_cpu)
    flagged = next(v for v in matrix.variants if v.server_args)
    plain = [v for v in matrix.variants if not v.skip_on_cpu and not v.server_args]
    assert baseline_problems(plain[0], plain, on_cpu=True) == []
    assert baseline_problems(compiled, plain, on_cpu=True) == [
        f"the baseline {compiled.name!r} would be skipped (on CPU: {compiled.skip_on_cpu}): choose another "
        "with --baseline"
    ]
    (said,) = baseline_problems(flagged, plain, on_cpu=False)
    assert f"(it needs server flags {' '.join(flagged.server_args)})" in said
    unplaced = {
        flagged.server_args: "needs server flags --async-offload (no --server was launched with them)"
    }
    (said,) = baseline_problems(flagged, plain, on_cpu=False, unplaced=unplaced)
    assert said.endswith(
        f"(it {unplaced[flagged.server_args]}): give a --server launched as it needs, or choose another "
        "with --baseline"
    )
    # the baseline alone runnable of the variants asked for (--variant of flagged ones, with --server):
    # a table of one row, nothing compared, that exited 0
    base = plain[0]
    (said,) = baseline_problems(base, [base], on_cpu=False, variants=[base, flagged], unplaced=unplaced)
    assert said == (
        f"only the baseline {base.name!r} can run here, so nothing would be compared ({flagged.name!r} "
        f"{unplaced[flagged.server_args]}): run the bench without --server (it starts a server with each "
        "variant's flags), give a --server launched with their flags, or choose variants that run here"
    )
    (said,) = baseline_problems(base, [base], on_cpu=True, variants=[base, compiled])
    assert said.endswith(f"is skipped on CPU: {compiled.skip_on_cpu}): choose variants that run here")
    assert baseline_problems(base, plain, on_cpu=False, variants=[*plain, flagged]) == []


def test_a_server_group_the_budget_did_not_reach_is_said_with_its_variants(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from benchmarks import harness

    matrix = load_matrix(TINY)
    group = [v for v in matrix.variants if v.server_args]
    measured = harness._Measured()
    settings = harness.BenchSettings(out_dir=tmp_path, budget_s=1.0)
    harness._run_group(matrix, settings, {}, group[0].server_args, group, measured, 0.0, lambda _: None)
    assert set(measured.skipped) == {v.name for v in group}
    said = f"not run (server flags {' '.join(group[0].server_args)}): {group[0].name}"
    assert said in caplog.text
    assert not (tmp_path / "servers").exists()  # no server was started for it


def test_server_warmups_run_the_first_variant_first_and_stay_out_of_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--server-warmups 2``: two discarded runs of the group's first variant (indices -1, -2) before
    the planned schedule, which is unchanged."""
    matrix, jobs = _two_jobs(tmp_path)
    ran = _record_runs(monkeypatch)
    runs = run_variants(
        matrix, jobs, "http://127.0.0.1:1", order="interleaved", warmups=0, repeats=1, server_warmups=2
    )
    assert ran == ["a", "a", "a", "b"]
    assert [(r.index, r.warmup) for r in runs["20-step baseline"]] == [(-1, True), (-2, True), (0, False)]
    assert [(r.index, r.warmup) for r in runs["8-step distill"]] == [(0, False)]


def test_select_variants_by_name_or_slug_keeps_the_baseline_and_reference() -> None:
    matrix = load_matrix(TINY)
    picked = select_variants(matrix, ["8-step-graph-compile", "8-step distill"])
    assert [v.name for v in picked.variants] == [
        "20-step baseline",
        "8-step distill",
        "8-step + graph compile",
    ]
    assert picked.baseline == picked.reference == "20-step baseline"
    # inherited settings survive the selection (they were folded in when the file was read)
    assert (
        picked.variant("8-step + graph compile").overrides
        == matrix.variant("8-step + graph compile").overrides
    )


def test_select_variants_with_another_baseline_measures_against_it() -> None:
    matrix = load_matrix(TINY)
    picked = select_variants(matrix, ["8-step-attention-acceleration"], baseline="8-step-distill")
    assert [v.name for v in picked.variants] == ["8-step distill", "8-step + attention acceleration"]
    assert picked.baseline == picked.reference == "8-step distill"
    assert select_variants(matrix) == matrix  # nothing asked: the matrix as it is
    everything = select_variants(matrix, baseline="8-step distill")
    assert len(everything.variants) == 5 and everything.baseline == "8-step distill"


def test_select_variants_names_an_unknown_variant_and_the_choices() -> None:
    matrix = load_matrix(TINY)
    with pytest.raises(
        MatrixError, match=r"no variant 'compile'; the variants are 20-step-baseline, 8-step-distill"
    ):
        select_variants(matrix, ["compile"])
    with pytest.raises(MatrixError, match="no variant 'fast'"):
        select_variants(matrix, baseline="fast")


def test_a_failure_cell_keeps_a_list_of_problems_apart_and_cuts_at_a_word() -> None:
    message = protocol.one_line(
        WorkflowError("node 2 (Load): 'clip.safetensors' missing\nnode 5 (Save): bad")
    )
    assert message == "node 2 (Load): 'clip.safetensors' missing; node 5 (Save): bad"
    cut = protocol.one_line(PromptFailedError("allocation " * 60), width=40)
    assert cut == "allocation allocation allocation …" and len(cut) <= 40
    path = protocol.one_line(FileNotFoundError("/srv/" + "x" * 400), width=40)
    assert path == "/srv/" + "x" * 33 + " …"  # a long word is cut, not dropped


def test_a_variant_of_another_server_is_checked_for_its_overrides_only_before_the_runs() -> None:
    from benchmarks.matrix import Insertion, Variant
    from benchmarks.preflight import matrix_problems

    base = {
        "1": {"class_type": "Loader", "inputs": {}},
        "2": {"class_type": "Sampler", "inputs": {"model": ["1", 0], "steps": 4}},
        "3": {"class_type": "Save", "inputs": {"samples": ["2", 0]}},
    }
    info = {
        "Loader": {"input": {}, "output": ["MODEL"]},
        "Sampler": {
            "input": {"required": {"model": ["MODEL", {}], "steps": ["INT", {"min": 1}]}},
            "output": ["LATENT"],
        },
        "Save": {"input": {"required": {"samples": ["LATENT", {}]}}, "output": [], "output_node": True},
    }
    patch = Insertion("p", "OnlyOnItsServer", (), "model", "2.model")
    variants = [
        Variant("here", overrides=("2.steps=0",), inserts=(patch,)),
        Variant("there", overrides=("2.stepz=1",), inserts=(patch,), server_args=("--flag",)),
    ]
    problems = matrix_problems(variants, base, info)
    assert problems[0].startswith("variant 'here': set '2.steps=0'")
    # 'here' is not validated further (its override failed) but its inserted node is checked; 'there'
    # (another server, which may have that node) only for its overrides
    unknown = (
        "variant 'here': node p (OnlyOnItsServer): unknown node type: the server has no node of that name"
    )
    assert problems[1].startswith(unknown)
    assert problems[2].startswith("variant 'there': set '2.stepz=1'")
    assert len(problems) == 3
    both = matrix_problems(variants[:1], base, info, ("2.steps=3", "9.x=1", "2.nosuch=1"))
    assert both[0].startswith("--set '9.x=1': no node '9'") and both[1].startswith("--set '2.nosuch=1'")
    assert both[2].startswith("variant 'here': set '2.steps=0'") and len(both) == 4  # each mistake once
    assert both[3].startswith("variant 'here': node p (OnlyOnItsServer): unknown node type")
    [clean] = matrix_problems([Variant("clean", inserts=(patch,))], base, info, ("2.steps=3",))
    assert clean.startswith("variant 'clean': node p (OnlyOnItsServer): unknown node type: the server has no")


def test_an_inserts_link_input_the_class_lacks_is_said_as_that_key() -> None:
    """It was said as the class's own input being missing ("input 'model': required input is missing")."""
    from benchmarks.matrix import Insertion, Variant
    from benchmarks.preflight import matrix_problems

    base = {
        "1": {"class_type": "Loader", "inputs": {}},
        "2": {"class_type": "Save", "inputs": {"model": ["1", 0]}},
    }
    info = {
        "Loader": {"input": {}, "output": ["MODEL"]},
        "Lora": {
            "input": {"required": {"model": ["MODEL", {}], "strength": ["FLOAT", {}]}},
            "output": ["MODEL"],
        },
        "Save": {"input": {"required": {"model": ["MODEL", {}]}}, "output": [], "output_node": True},
    }
    lora = Insertion("lora", "Lora", (("strength", 1.0),), "clip", "2.model")
    problems = matrix_problems([Variant("v", inserts=(lora,))], base, info)
    said = (
        "variant 'v': insert 'lora': link_input 'clip' is not an input of Lora (its inputs: model, strength)"
    )
    assert problems[0] == said


def test_a_server_that_did_not_start_is_said_with_the_logs_last_line() -> None:
    """ComfyUI says why at the end of its log; cut at 300 characters, the report kept only the start."""
    from runner.errors import ServerCrashedError, ServerError

    tail = "\n".join(f"Adding extra search path checkpoints /srv/models/{n}" for n in range(20))
    crashed = ServerCrashedError(
        f"ComfyUI exited with code 2 while starting on port 8188. Log /x/comfyui.log, last lines:\n{tail}\n"
        "main.py: error: unrecognized arguments: --bogus-flag\n"
    )
    said = protocol.server_failure_line(crashed)
    assert said.startswith("ComfyUI exited with code 2 while starting on port 8188.")
    assert said.endswith("… main.py: error: unrecognized arguments: --bogus-flag")
    assert protocol.server_failure_line(ServerError("gone")) == "gone"


def test_an_empty_server_args_clears_the_inherited_flags(tmp_path: Path) -> None:
    """`server_args = []` kept the parent's --disable-async-offload: an empty list read as not given."""
    body = (
        '[[variant]]\nname = "base"\nserver_args = ["--disable-async-offload"]\n'
        '[[variant]]\nname = "plain"\nextends = "base"\nserver_args = []\n'
        '[[variant]]\nname = "kept"\nextends = "base"\n'
    )
    matrix = load_matrix(_write(tmp_path, body))
    assert [v.server_args for v in matrix.variants] == [
        ("--disable-async-offload",),
        (),
        ("--disable-async-offload",),
    ]
