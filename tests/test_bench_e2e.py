"""``leanvideo bench`` end to end on real pinned servers it starts itself (CPU): the tiny seed table
(interleaved run order, significance), consistency, soak and load. The shared ``comfy_server`` is
left alone: the bench's /free calls and soak rounds would change the memory history other tests
measure RSS against."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from runner.cli.bench import add_bench_parser, main, run_bench
from runner.fixtures import FixtureSet
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import REPO_ROOT, Workspace

pytestmark = pytest.mark.integration

TINY = REPO_ROOT / "benchmarks" / "seed_table_tiny.toml"


def _bench(*argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="leanvideo")
    add_bench_parser(parser.add_subparsers(dest="command"))
    buffer = io.StringIO()
    # soft_wrap, as the CLI's own console: lines go out whole, at any width
    code = run_bench(parser.parse_args(["bench", *argv]), Console(file=buffer, width=200, soft_wrap=True))
    return code, buffer.getvalue()


def _document(out: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    assert (document["schema"], document["version"]) == ("leanvideo.bench", 2)
    return document


def test_tiny_seed_table_runs_end_to_end(tmp_path: Path, tiny_models: FixtureSet) -> None:
    out = tmp_path / "bench"
    # Kept short: no warmups (their exclusion is unit-tested), two measured runs, the shortest soak.
    code, text = _bench(
        str(TINY),
        *("--out", str(out), "--warmups", "0", "--repeats", "2", "--consistency"),
        *("--soak", "10", "--load", "--concurrency", "2", "--jobs", "2"),
        *("--set", "14.filename_prefix=leanvideo/bench_e2e"),
    )
    print(text)
    assert code == 0
    document = _document(out)
    assert document["matrix"]["overrides"] == ["14.filename_prefix=leanvideo/bench_e2e"]
    variants = {v["name"]: v for v in document["variants"]}
    assert list(variants) == [
        "20-step baseline",
        "8-step distill",
        "8-step + non-blocking transfer",
        "8-step + graph compile",
        "8-step + attention acceleration",
    ]
    skipped = "8-step + graph compile"
    assert variants[skipped]["skipped"].startswith("on CPU: torch.compile")
    for name in (
        "20-step baseline",
        "8-step distill",
        "8-step + non-blocking transfer",
        "8-step + attention acceleration",
    ):
        runs = variants[name]["runs"]
        assert [r["warmup"] for r in runs] == [False, False]
        assert variants[name]["total"]["n"] == 2
        for run in runs:
            record = json.loads(Path(run["record_path"]).read_text(encoding="utf-8"))
            assert (record["schema"], record["version"], record["status"]) == ("leanvideo.run", 2, "success")
            assert "cache_not_defeated" not in run["flags"]  # /free made every node run again

    # Interleaved (the default): the variants sharing the first server took turns; the transfer
    # variant's own server came after. Every run is numbered in the order it ran.
    assert document["matrix"]["order"] == "interleaved"
    assert {
        name: [r["sequence"] for r in variants[name]["runs"]] for name in variants if name != skipped
    } == {
        "20-step baseline": [0, 3],
        "8-step distill": [1, 4],
        "8-step + attention acceleration": [2, 5],
        "8-step + non-blocking transfer": [6, 7],
    }
    # Two runs each: the Mann-Whitney p cannot go below 1/3, and the report says so.
    assert variants["20-step baseline"]["significance"] is None
    distill_test = variants["8-step distill"]["significance"]
    assert distill_test["p_floor"] == pytest.approx(1 / 3) and distill_test["p_value"] >= 1 / 3

    # The transfer variant ran on a restarted server with its flag; the first two did not.
    def argv(name: str) -> list[str]:
        record_path = Path(variants[name]["runs"][0]["record_path"])
        return list(json.loads(record_path.read_text(encoding="utf-8"))["environment"]["comfyui_argv"])

    assert "--async-offload" in argv("8-step + non-blocking transfer")
    assert "--async-offload" not in argv("8-step distill")
    assert "--async-offload" not in argv("8-step + attention acceleration")
    # Fewer steps really ran: the sampler did 20 then 8 steps.
    assert variants["20-step baseline"]["speedup"]["ratio"] == 1.0
    assert variants["8-step distill"]["quality"]["psnr_db"] < 100  # the LoRA + 8 steps change the frames
    assert variants["20-step baseline"]["quality"]["ssim"] == pytest.approx(1.0)
    consistency = document["modes"]["consistency"]
    assert {item["verdict"] for item in consistency.values()} <= {"identical", "close"}
    # Both compare the frames themselves (the bench adds Save Video (lossless)), not H.264 decodes
    assert {v["quality"]["on"] for v in variants.values() if v.get("quality")} == {"lossless frames"}
    assert {item["on"] for item in consistency.values()} == {"lossless frames"}
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "| Config | Total time | Speed-up | Energy | Peak VRAM |" in markdown
    assert "| 8-step + graph compile | skipped |" in markdown
    assert "- run order: interleaved (" in markdown
    assert "- with n=2 per variant no difference can reach p < 0.05" in markdown
    assert markdown in text  # the CLI prints the report as written
    assert "| 20-step baseline |" in text
    assert (out / "report.csv").read_text(encoding="utf-8").count("\n") == 6
    assert (out / "workflows" / "8-step-attention-acceleration.api.json").is_file()
    # each variant's file is what it ran: its own overrides and --set applied, so a diff shows them
    written = {
        name: json.loads((out / "workflows" / f"{name}.api.json").read_text(encoding="utf-8"))
        for name in ("20-step-baseline", "8-step-distill")
    }
    assert [written[n]["9"]["inputs"]["steps"] for n in written] == [20, 8]
    assert [written[n]["11"]["inputs"]["cfg"] for n in written] == [3.0, 1.0]
    assert {written[n]["14"]["inputs"]["filename_prefix"] for n in written} == {"leanvideo/bench_e2e"}
    assert written["8-step-distill"]["bench_lossless"]["inputs"] == {
        "video": written["8-step-distill"]["14"]["inputs"]["video"],
        "filename_prefix": "leanvideo/bench_e2e-lossless",
    }
    base = json.loads((REPO_ROOT / "workflows" / "ltxv_tiny_t2v.api.json").read_text(encoding="utf-8"))
    for variant in variants.values():  # --set reached every variant's runs, after the variant's own
        for run in variant["runs"]:
            record = json.loads(Path(run["record_path"]).read_text(encoding="utf-8"))
            assert record["overrides"][-1]["spec"] == "14.filename_prefix=leanvideo/bench_e2e"
            # what each replaced, from the matrix's workflow on (the file it ran already holds the values)
            inputs = {node_id: dict(node["inputs"]) for node_id, node in base.items()}
            for override in record["overrides"]:
                assert override["previous"] == inputs[override["node_id"]][override["input_name"]]
                inputs[override["node_id"]][override["input_name"]] = override["value"]
            [video] = [o for o in record["outputs"] if o["node_id"] == "14"]
            assert video["server_name"].startswith("bench_e2e_") and video["path"] == run["output_path"]
            [frames] = [o for o in record["outputs"] if o["node_id"] == "bench_lossless"]
            assert frames["path"] == run["frames_path"] and frames["path"].endswith(".mkv")
    assert "- for every variant: `14.filename_prefix=leanvideo/bench_e2e` (--set)" in markdown
    pytest.importorskip("matplotlib")
    assert (out / "total_time.png").is_file() and (out / "phases.png").is_file()

    # the seed's "logs clean" launch check, on each server the bench started
    logs = document["modes"]["logs"]
    assert set(logs) == {"default", "--async-offload"}
    assert all(check["log"].endswith("comfyui.log") and "verdict" in check for check in logs.values())
    assert "- logs: " in markdown
    # each video once, in runs/: the bench's own servers kept a second copy of every output
    assert not [path for path in (out / "servers").rglob("*") if path.suffix in (".mp4", ".mkv")]
    soak = document["modes"]["soak"]
    # Cold mode frees the models and memory before every round: memory must not drift.
    assert soak["rounds"] == 10 and soak["verdict"] == "stable", soak
    assert len(soak["series"]["peak_rss_bytes"]["rounds"]) == 10
    load = document["modes"]["load"]
    print({k: load[k] for k in ("throughput_jobs_per_min", "latency_s", "queue_wait_s", "execution_s")})
    assert load["jobs"] == 2 and load["concurrency"] == 2 and len(load["runs"]) == 2
    assert list(load["jobs_per_server"].values()) == [2]  # the baseline's server, the only one
    # One server, two jobs sent at once: the second waits while the first runs, so the median queue
    # wait (about half the first's execution) stays below the median execution (half of both).
    assert load["verdict"] == "keeping up", load
    assert load["latency_s"]["p50"] <= load["latency_s"]["p95"] <= load["latency_s"]["p99"]
    assert load["throughput_jobs_per_min"] > 0
    assert load["execution_s"] > 0.05  # distinct seeds: the sampler really ran, nothing came from the cache
    assert "soak: " in text and "load: " in text
    report = (out / "report.md").read_text(encoding="utf-8")  # the verdicts are in the report too
    assert "- soak: stable over 10 rounds of " in report and "- load: keeping up: 2 jobs, " in report


def test_a_variant_needing_server_flags_runs_on_a_given_server_launched_with_them(
    tmp_path: Path, workspace: Workspace, tiny_models: FixtureSet
) -> None:
    """With --server, a variant needing launch flags was skipped even beside a server that had them."""
    launched = {"plain": (), "nonblocking": ("--async-offload",)}
    configs = {
        name: ServerConfig.in_workspace(workspace, tmp_path / name, cpu=True, extra_args=args)
        for name, args in launched.items()
    }
    out = tmp_path / "bench"
    with ComfyServer(configs["nonblocking"]) as nonblocking, ComfyServer(configs["plain"]) as plain:
        code, text = _bench(
            str(TINY),
            *("--out", str(out), "--warmups", "0", "--repeats", "1", "--no-plots"),
            *("--variant", "8-step + non-blocking transfer"),
            *("--server", nonblocking.url, "--server", plain.url),  # the baseline still on the plain one
        )
        print(text)
        assert code == 0
        history = {
            name: httpx.get(f"{server.url}/history").json()
            for name, server in (("plain", plain), ("nonblocking", nonblocking))
        }
    document = _document(out)
    measured = {v["name"]: v for v in document["variants"]}
    assert measured["8-step + non-blocking transfer"]["total"]["n"] == 1
    assert measured["20-step baseline"]["total"]["n"] == 1
    assert [len(history["plain"]), len(history["nonblocking"])] == [1, 1]  # one run on each
    given = document["environment"]["given_servers"]
    assert given[nonblocking.url][-1] == "--async-offload"
    assert "--async-offload" not in given[plain.url]
    report = " ".join((out / "report.md").read_text(encoding="utf-8").split())
    assert f"{nonblocking.url} with `" in report
    assert "Each variant ran on the first of them launched with its server flags" in report


def test_a_set_the_workflow_does_not_take_is_refused_before_any_run(
    comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked against the server's /object_info once it answers: no variant runs, no result is written
    (the shared server is only asked, nothing is queued on it)."""
    history = httpx.get(f"{comfy_server.url}/history").json()
    out = tmp_path / "out"
    code = main([str(TINY), "--out", str(out), "--server", comfy_server.url, "--set", "9.bogus=1"])
    err = capsys.readouterr().err.replace("\n", "")
    assert code == 5 and "has no input 'bogus'" in err and "nothing was run" in err
    assert not out.exists()  # nothing was written: the same --out can be used once the --set is mended
    assert httpx.get(f"{comfy_server.url}/history").json() == history


def test_a_matrix_refused_on_a_server_the_bench_started_leaves_nothing_behind(
    tmp_path: Path, tiny_models: FixtureSet, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server's state folder (under OUT/servers) goes with the refusal: a leftover would make the
    next bench with the same --out refuse it as one that did not finish."""
    out = tmp_path / "out"
    code = main([str(TINY), "--out", str(out), "--set", "9.bogus=1"])
    assert code == 5 and "nothing was run" in capsys.readouterr().err
    assert not out.exists()


def test_every_mistake_of_a_matrix_is_listed_before_any_run(
    comfy_server: ComfyServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad ``set`` or ``insert`` in any variant that would run: exit 5, all named with their variant,
    nothing queued, no report (they used to fail their variant after the others ran)."""
    workflow = (REPO_ROOT / "workflows" / "ltxv_tiny_t2v.api.json").as_posix()
    matrix = tmp_path / "bad.toml"
    matrix.write_text(
        f"""[bench]
workflow = "{workflow}"
[[variant]]
name = "base"
set = ["Nope.steps=2", "9.stepz=1"]
[[variant]]
name = "inserted"
[[variant.insert]]
id = "x"
class_type = "NoSuchNode"
link_input = "model"
target = "11.model"
[[variant]]
name = "other server"
server_args = ["--async-offload"]
[[variant.insert]]
id = "y"
class_type = "NoSuchNode"
link_input = "model"
target = "11.model"
""",
        encoding="utf-8",
    )
    history = httpx.get(f"{comfy_server.url}/history").json()
    out = tmp_path / "out"
    code = main([str(matrix), "--out", str(out), "--server", comfy_server.url])
    err = " ".join(capsys.readouterr().err.split())  # as one line: the console wraps long ones
    assert code == 5, err
    assert "3 problem(s); nothing was run" in err
    assert "variant 'base': set 'Nope.steps=2': no node 'Nope' in the workflow" in err
    assert "variant 'base': set '9.stepz=1'" in err and "has no input 'stepz'" in err
    assert "variant 'inserted': node x (NoSuchNode): unknown node type" in err
    assert "other server" not in err  # with --server it would not run: not its mistake to stop the bench
    assert not out.exists()
    assert httpx.get(f"{comfy_server.url}/history").json() == history


def test_ctrl_c_stops_the_bench_at_once_and_exits_130(
    tmp_path: Path, tiny_models: FixtureSet, free_port: int
) -> None:
    """Ctrl-C during a measured run cancels that prompt and ends the bench: the variant is not reported
    as failed and no other variant (or server) starts. A terminal sends it to the bench's process group;
    the ComfyUI servers it starts have groups of their own. It is started with SIGINT ignored, as a
    script's background job (`&`, nohup) inherits it: the bench still takes SIGINT as Ctrl-C."""
    out, port = tmp_path / "bench", free_port
    log = out / "servers" / "default" / "comfyui.log"
    bench = subprocess.Popen(
        [
            *("sh", "-c", 'trap "" INT; exec "$0" "$@"'),  # SIGINT ignored, as a background job has it
            *(sys.executable, "-m", "runner.cli.bench", str(TINY), "--out", str(out), "--port", str(port)),
            *("--warmups", "0", "--repeats", "1", "--set", "9.steps=10000"),  # far longer than the test
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        give_up = time.monotonic() + 240
        while not (log.is_file() and "got prompt" in log.read_text(encoding="utf-8", errors="replace")):
            assert bench.poll() is None and time.monotonic() < give_up, bench.stdout and bench.stdout.read()
            time.sleep(0.5)
        time.sleep(2.0)  # the prompt is sampling
        os.killpg(bench.pid, signal.SIGINT)
        output, _ = bench.communicate(timeout=90)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
    print(output)
    assert bench.returncode == 130, output
    assert "cancelled" in output and "failed" not in output and "error:" not in output
    assert "--async-offload" not in output  # the next group's server never started
    assert f"starting ComfyUI on port {port}" in output  # --port: the port of the servers it starts
    assert not (out / "bench.json").exists()
