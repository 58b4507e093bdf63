"""Extra benchmark modes: consistency, quality delta (PSNR/SSIM), soak drift, load (latency percentiles).

- consistency: every measured run of a variant uses the same seed; their *decoded* frames must hash the
  same (MP4 bytes are not deterministic), or at least reach ``CONSISTENCY_PSNR_DB``;
- quality: each variant's first measured video against the reference variant's, PSNR and SSIM per
  frame (SSIM on luma with 8×8 windows, the usual constants), reported as the mean over frames.
  Both compare the frames themselves where the server has the pack's Save Video (lossless): the bench
  adds one beside the workflow's first Save Video (:func:`add_lossless_capture`). Save Video's H.264
  (yuv420p) would otherwise be compared, and its codec noise counted as a difference (INT8 frames at
  45 dB from the float ones decode at 28 dB on the tiny models); such figures say ``decoded video``;
- soak: N rounds of one variant; per-round peak VRAM, peak RSS, start memory and time; a drift verdict
  per series (:func:`benchmarks.stats.drift_verdict`);
- load: J jobs (each with its own seed) over C concurrent clients against one or several servers, each
  job sent to the server with the fewest jobs in flight: throughput, queue wait against execution
  time, P50/P95/P99 of the end-to-end latency, jobs per server, and a verdict (``saturated`` when the
  median queue wait is at least the median execution time, else ``keeping up``).

Example::

    print(compare_videos(Path("a.mp4"), Path("b.mp4")))   # {"psnr_db": 41.2, "ssim": 0.98, "frames": 9}
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.matrix import Matrix
from benchmarks.protocol import LOSSLESS_ID, SERVER_LOST, RunMeasure, VariantRun, one_line, run_variant
from benchmarks.stats import drift_verdict, percentile, summarize
from runner.errors import LeanVideoError, PromptCancelledError
from runner.graph.workflow import Override, find_seeds, load_workflow
from runner.jobs.frames import psnr_db
from runner.jobs.run import RunOptions, run_workflow

CONSISTENCY_PSNR_DB = 40.0
LOSSLESS_CLASS = "LeanVideoSaveVideoLossless"
LOSSLESS_FRAMES = "lossless frames"
DECODED_VIDEO = "decoded video (H.264: its codec noise counts as a difference)"
_C1 = (0.01 * 255) ** 2
_C2 = (0.03 * 255) ** 2


def decode_frames(path: Path) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """All frames of a video as ``(T, H, W, 3)`` uint8 RGB (PyAV)."""
    import av

    with av.open(str(path)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path} has no video frames")
    return np.stack(frames)


def frames_digest(path: Path) -> str:
    """sha256 of the decoded frames (shape included): equal for equal pictures, whatever the encoder."""
    frames = decode_frames(path)
    digest = hashlib.sha256(str(frames.shape).encode())
    digest.update(frames.tobytes())
    return digest.hexdigest()


def ssim(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], window: int = 8) -> float:
    """Mean SSIM over non-overlapping ``window``² blocks of the luma of two ``(H, W, 3)`` uint8 images."""
    weights = np.array([0.299, 0.587, 0.114])
    ya, yb = (np.asarray(img, dtype=np.float64) @ weights for img in (a, b))
    h, w = (ya.shape[0] // window) * window, (ya.shape[1] // window) * window
    if h == 0 or w == 0:
        raise ValueError(f"images of {ya.shape} are smaller than the {window}×{window} window")

    def blocks(y: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return y[:h, :w].reshape(h // window, window, w // window, window).swapaxes(1, 2)

    xa, xb = blocks(ya), blocks(yb)
    mu_a, mu_b = xa.mean(axis=(2, 3)), xb.mean(axis=(2, 3))
    var_a, var_b = xa.var(axis=(2, 3)), xb.var(axis=(2, 3))
    cov = ((xa - mu_a[..., None, None]) * (xb - mu_b[..., None, None])).mean(axis=(2, 3))
    numerator = (2 * mu_a * mu_b + _C1) * (2 * cov + _C2)
    denominator = (mu_a**2 + mu_b**2 + _C1) * (var_a + var_b + _C2)
    return float(np.mean(numerator / denominator))


def compare_videos(path: Path, reference: Path) -> dict[str, float]:
    """Mean per-frame PSNR (dB, capped at 100 for identical frames) and SSIM of two videos."""
    frames, ref = decode_frames(path), decode_frames(reference)
    if frames.shape != ref.shape:
        raise ValueError(f"{path} has frames {frames.shape}, reference {reference} has {ref.shape}")
    psnrs = [min(psnr_db(f, r), 100.0) for f, r in zip(frames, ref, strict=True)]
    ssims = [ssim(f, r) for f, r in zip(frames, ref, strict=True)]
    return {"psnr_db": float(np.mean(psnrs)), "ssim": float(np.mean(ssims)), "frames": float(len(frames))}


def add_lossless_capture(workflow: dict[str, Any], object_info: Mapping[str, Any]) -> None:
    """Add Save Video (lossless) as node :data:`LOSSLESS_ID`, on the video of the workflow's first Save
    Video; nothing on a server without that node or to a workflow without Save Video."""
    if LOSSLESS_CLASS not in object_info:
        return
    saves = [
        node
        for _, node in sorted(workflow.items(), key=lambda item: (not item[0].isdigit(), item[0].zfill(12)))
        if isinstance(node, dict) and node.get("class_type") == "SaveVideo"
        and isinstance(node.get("inputs", {}).get("video"), list)
    ]  # fmt: skip
    if not saves:
        return
    prefix = saves[0]["inputs"].get("filename_prefix")
    workflow[LOSSLESS_ID] = {
        "class_type": LOSSLESS_CLASS,
        "inputs": {
            "video": list(saves[0]["inputs"]["video"]),
            "filename_prefix": f"{prefix if isinstance(prefix, str) else 'bench'}-lossless",
        },
        "_meta": {"title": "Save Video (lossless), added by the bench for the quality checks"},
    }


def frames_to_compare(runs: Sequence[RunMeasure]) -> tuple[list[Path], str]:
    """The measured runs' lossless copies when each has one (:data:`LOSSLESS_FRAMES`), else their
    videos (:data:`DECODED_VIDEO`)."""
    measured = [r for r in runs if not r.warmup]
    if measured and all(r.frames_path for r in measured):
        return [Path(str(r.frames_path)) for r in measured], LOSSLESS_FRAMES
    return [Path(r.output_path) for r in measured if r.output_path], DECODED_VIDEO


def compare_runs(run: RunMeasure, reference: RunMeasure) -> dict[str, Any] | None:
    """:func:`compare_videos` of two runs' outputs (lossless copies when both have one), and ``on``:
    what was compared; None when either has no video."""
    (paths, on) = frames_to_compare([run, reference])
    if len(paths) < 2:
        return None
    return {**compare_videos(paths[0], paths[1]), "on": on}


def check_consistency(runs: Sequence[RunMeasure]) -> dict[str, Any]:
    """Same seed, same output? Decoded-frame hashes of the measured runs, PSNR as the fallback verdict."""
    paths, on = frames_to_compare(runs)
    if len(paths) < 2:
        return {"verdict": "not enough runs", "runs": len(paths)}
    digests = [frames_digest(p) for p in paths]
    if len(set(digests)) == 1:
        return {"verdict": "identical", "runs": len(paths), "digest": digests[0], "on": on}
    worst = min(compare_videos(p, paths[0])["psnr_db"] for p in paths[1:])
    verdict = "close" if worst >= CONSISTENCY_PSNR_DB else "different"
    return {"verdict": verdict, "runs": len(paths), "min_psnr_db": worst, "digests": digests, "on": on}


def soak_verdict(
    runs: Sequence[RunMeasure], *, tolerance: float = 0.05, planned: int | None = None
) -> dict[str, Any]:
    """Per-round series and a drift verdict for each (warmups excluded); fewer than two rounds (the
    time budget ran out) give no verdict."""
    measured = [r for r in runs if not r.warmup]
    if len(measured) < 2:
        return {
            "verdict": f"not enough rounds: {len(measured)} of {planned or '?'} ran within --budget-s",
            "rounds": len(measured),
            "series": {},
        }
    series: dict[str, list[float]] = {
        "total_s": [r.total_s for r in measured],
        "memory_start_bytes": [float(r.memory_start_bytes or 0) for r in measured],
        "peak_rss_bytes": [float(r.peak_rss_bytes or 0) for r in measured],
    }
    if all(r.peak_vram_bytes is not None for r in measured):
        series["peak_vram_bytes"] = [float(r.peak_vram_bytes or 0) for r in measured]
    verdicts = {}
    for name, values in series.items():  # memory drifts when it grows; time either way
        verdict, change = drift_verdict(values, tolerance=tolerance, grows_only=name != "total_s")
        verdicts[name] = {"verdict": verdict, "relative_change": change, "rounds": values}
    # Time is noisy; memory growth is what a soak is for.
    memory = [v["verdict"] for k, v in verdicts.items() if k != "total_s"]
    overall = "drifting" if "drifting" in memory else "stable"
    cut = {"planned_rounds": planned} if planned is not None and planned != len(measured) else {}
    return {"verdict": overall, "rounds": len(measured), **cut, "series": verdicts}


class _LeastBusy:
    """Hands each job the server with the fewest jobs in flight (ties: fewest so far, then listed
    first). Plain round-robin by job number would queue a job on a busy server while another idles
    whenever jobs take unequal times."""

    def __init__(self, servers: Sequence[str]) -> None:
        if not servers:
            raise ValueError("load mode needs at least one server")
        self._lock = threading.Lock()
        self._in_flight = dict.fromkeys(servers, 0)
        self._assigned = dict.fromkeys(servers, 0)

    @contextmanager
    def server(self) -> Iterator[str]:
        with self._lock:
            chosen = min(self._in_flight, key=lambda s: (self._in_flight[s], self._assigned[s]))
            self._in_flight[chosen] += 1
            self._assigned[chosen] += 1
        try:
            yield chosen
        finally:
            with self._lock:
                self._in_flight[chosen] -= 1


def load_verdict(queue_wait_s: float, execution_s: float) -> str:
    """``saturated`` when jobs wait in the queue at least as long as they run (median against median):
    the servers cannot keep up with this concurrency; else ``keeping up``."""
    return "saturated" if queue_wait_s >= execution_s else "keeping up"


def run_load(
    workflow_path: Path,
    prior: tuple[Override, ...],
    servers: Sequence[str],
    out_dir: Path,
    *,
    concurrency: int,
    jobs: int,
    timeout: float = 1800.0,
    deadline: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Submit ``jobs`` runs from ``concurrency`` threads, each to the least busy of ``servers``; a job
    not started by ``deadline`` (``time.monotonic()``, ``--budget-s``) is not run. ``prior``: the
    overrides the file holds (each run's record lists them); ``headers`` go with every request."""
    if concurrency < 1 or jobs < 1:
        raise ValueError(f"concurrency and jobs must be ≥ 1, got {concurrency} and {jobs}")

    # Each job gets its own seed, as distinct requests would: identical prompts would be served from
    # ComfyUI's cache and measure nothing.
    seeds = find_seeds(load_workflow(workflow_path))
    dispatcher = _LeastBusy(servers)
    stop = threading.Event()  # Ctrl-C: no job starts, each running prompt is cancelled within a second
    started = time.perf_counter()

    def cancel_when_stopped(event: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # run_workflow cancels its prompt on the server

    def one(index: int) -> dict[str, Any] | None:
        if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
            return None
        reseed = tuple(f"{key}={int(value) + index + 1}" for key, value in seeds.items())
        with dispatcher.server() as server:
            sent = time.perf_counter() - started
            options = RunOptions(
                server=server, out_dir=out_dir, overrides=reseed, prior_overrides=prior, timeout=timeout,
                headers=tuple((headers or {}).items()),
            )  # fmt: skip
            try:
                timing = run_workflow(workflow_path, options, cancel_when_stopped).record["timing"]
            except PromptCancelledError:
                return None
            except LeanVideoError as error:  # one failed job must not lose the others' figures
                return {"job": index, "server": server, "error": one_line(error)}
            done = time.perf_counter() - started
        figures = {k: timing[k] for k in ("wall_s", "queue_s", "server_execution_s")}
        return {"job": index, "server": server, "sent_s": sent, "done_s": done, **figures}

    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        made = [row for row in pool.map(one, range(jobs)) if row is not None]
    except BaseException:  # Ctrl-C, or a job that raised what it should not: no other job starts
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    elapsed = time.perf_counter() - started
    rows = [row for row in made if "error" not in row]
    failed = {"failed_jobs": [row for row in made if "error" in row]} if len(rows) < len(made) else {}
    if not rows:
        why = f"every job failed: {made[0]['error']}" if made else "--budget-s ran out before its first job"
        verdict = f"not run: {why}" if not made else f"not finished: {why}"
        return {"servers": list(servers), "concurrency": concurrency, "jobs": 0, "planned_jobs": jobs,
                **failed, "verdict": verdict, "runs": []}  # fmt: skip
    latency = [float(r["wall_s"]) for r in rows]
    queue_wait = summarize([float(r["queue_s"] or 0) for r in rows]).median
    execution = summarize([float(r["server_execution_s"] or 0) for r in rows]).median
    return {
        "servers": list(servers),
        "concurrency": concurrency,
        "jobs": len(rows),
        **({"planned_jobs": jobs} if len(rows) < jobs else {}),
        "elapsed_s": elapsed,
        "throughput_jobs_per_min": len(rows) / elapsed * 60,
        "latency_s": {f"p{q}": percentile(latency, q) for q in (50, 95, 99)},
        "queue_wait_s": queue_wait,
        "execution_s": execution,
        "jobs_per_server": {server: sum(r["server"] == server for r in rows) for server in servers},
        "verdict": load_verdict(queue_wait, execution)
        + (f"; {len(made) - len(rows)} job(s) failed" if failed else ""),
        **failed,
        "runs": rows,
    }


def run_launch_checks(
    matrix: Matrix,
    job: VariantRun,
    url: str,
    out: Path,
    *,
    soak: int,
    load: bool,
    servers: Sequence[str],
    concurrency: int,
    jobs: int,
    deadline: float | None,
    say: Callable[[str], None],
    on_server_lost: Callable[[str], None],
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``--soak`` and ``--load`` on the baseline variant's server ``url``, after the measured runs of its
    group; no round or job of theirs starts after ``deadline`` (``--budget-s``). A check that cannot
    finish says so in its verdict; a server that stops answering in the soak is told to
    ``on_server_lost`` and the load test is not started on it."""
    found: dict[str, Any] = {}
    variant = job.variant
    if soak:
        say(f"soak: {soak} rounds of {variant.name}")
        failures: dict[str, str] = {}
        lost: list[str] = []
        rounds = run_variant(
            matrix, replace(job, out_dir=out / "soak"), url, warmups=1, repeats=soak, deadline=deadline,
            failures=failures, on_server_lost=lost.append, headers=headers,
        )  # fmt: skip
        found["soak"] = {"variant": variant.name, **soak_verdict(rounds, planned=soak)}
        if problems := [*failures.values(), *lost]:
            found["soak"]["verdict"] = f"not finished: {problems[0]}"
        for message in lost:
            on_server_lost(f"{message} (soak)")
        if lost and load:
            found["load"] = {"variant": variant.name, "verdict": f"not run: {SERVER_LOST} in the soak"}
            load = False
    if load:
        say(f"load: {jobs} jobs, concurrency {concurrency}")
        found["load"] = {
            "variant": variant.name,
            **run_load(
                job.workflow_path,
                job.applied,
                servers,
                out / "load",
                concurrency=concurrency,
                jobs=jobs,
                timeout=matrix.timeout_s,
                deadline=deadline,
                headers=headers,
            ),
        }
    return found


# What a launch check reads in a server's log (the seed's "logs clean": no operator fallback, no precision
# warning, no offload anomaly), by finding, in this order: a line counts once, for the first that matches.
# ComfyUI logs without levels, so these are its messages' words; its routine lines (a manual cast of fp8 or
# bf16 weights, "mixed precision" operations, the load and offload devices) are no findings.
LOG_FINDINGS: dict[str, re.Pattern[str]] = {
    "error": re.compile(r"^Traceback \(most recent call last\)"),  # one per exception
    "memory": re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE),
    "fallback": re.compile(r"\bfall(?:ing|s)? back\b|\bfallback\b|attention left unchanged", re.IGNORECASE),
    "offload": re.compile(
        r"loaded partially|unloaded partially|vram state to: (?:LOW|NO)_VRAM", re.IGNORECASE
    ),
    "precision": re.compile(
        r"\bNaN\b|\binf(?:inite)? values\b|overflow|precision (?:loss|warning)", re.IGNORECASE
    ),
    "warning": re.compile(r"\bWARNING\b|\bWarning:"),
}
LOG_EXAMPLES = 8


def scan_server_log(path: Path) -> dict[str, Any]:
    """The log launch check of one server: ``verdict`` ``clean`` or ``N finding(s)``, the count per
    finding (:data:`LOG_FINDINGS`) and the first distinct lines that matched."""
    counts = dict.fromkeys(LOG_FINDINGS, 0)
    examples: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        kind = next((kind for kind, pattern in LOG_FINDINGS.items() if pattern.search(line)), None)
        if kind is None:
            continue
        counts[kind] += 1
        if len(examples) < LOG_EXAMPLES and line.strip() not in examples:
            examples.append(line.strip())
    total = sum(counts.values())
    verdict = (
        "clean"
        if total == 0
        else f"{total} finding(s): " + ", ".join(f"{kind} {n}" for kind, n in counts.items() if n)
    )
    return {"verdict": verdict, "log": str(path), "counts": counts, "examples": examples}
