"""Render a benchmark result: a Markdown table with the seed's columns, a CSV, and PNG plots.

Markdown columns: Config | Total time | Speed-up | Energy | Peak VRAM (the seed's), then Peak RSS,
Spread, p and Notes. Total time is the median with [p10–p90]; speed-up is the ratio of medians against
the baseline with its 95 % bootstrap interval, marked ``n.s.`` when the two-sided Mann-Whitney U test
(column p) gives p ≥ 0.05. When the number of runs alone keeps every p at or above 0.05 (3 against 3:
p ≥ 0.1), a context line says so. Figures that cannot be measured say why (``n/a``, see the notes line
under the table) instead of showing a zero.

PNG plots need matplotlib; :func:`write_plots` raises :class:`PlotError` naming the package when it is
missing, so the Markdown and CSV are still written.

Example::

    (out / "report.md").write_text(render_markdown(results, title="seed table"))
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.caveats import significance_notes
from benchmarks.matrix import Matrix
from benchmarks.modes import DECODED_VIDEO
from benchmarks.results import VariantResult
from benchmarks.stats import SIGNIFICANCE_LEVEL, SPREAD_WARNING_RATIO, Summary

if TYPE_CHECKING:  # the harness imports this module
    from benchmarks.harness import BenchSettings

IDENTICAL_PSNR_DB = 100.0  # compare_videos caps identical frames here
GB = 1e9
MB = 1e6
CSV_COLUMNS = (
    "config",
    "skipped",
    "failed",
    "n",
    "total_median_s",
    "total_p10_s",
    "total_p90_s",
    "total_stdev_s",
    "spread_warning",
    "speedup",
    "speedup_low",
    "speedup_high",
    "p_value",
    "p_method",
    "p_floor",
    "energy_wh",
    "peak_vram_bytes",
    "peak_rss_bytes",
    "step_s",
    "phases",
    "flags",
    "psnr_db",
    "ssim",
    "quality_on",
)


class PlotError(RuntimeError):
    """The PNG plots could not be made (matplotlib missing)."""


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def _bytes(summary: Summary | None) -> str:
    if summary is None:
        return "n/a"
    value = summary.maximum
    return f"{value / GB:.2f} GB" if value >= GB else f"{value / MB:.0f} MB"


def _p_value(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def format_row(result: VariantResult) -> list[str]:
    """The Markdown cells of one variant."""
    if result.failed is not None:
        return [result.name, "failed", "–", "–", "–", "–", "–", "–", f"failed: {result.failed}"]
    if result.skipped is not None or result.total is None:
        return [result.name, "skipped", "–", "–", "–", "–", "–", "–", f"skipped: {result.skipped}"]
    total = result.total
    alone = total.n < 2  # one run: no spread, no interval (they would read 0 % and [x–x])
    time_cell = f"{_seconds(total.median)} " + (
        "(n=1)" if alone else f"[{_seconds(total.p10)}–{_seconds(total.p90)}]"
    )
    speed = result.speedup
    test = result.significance
    if speed is None:
        speed_cell = "–"
    elif test is None:  # the baseline: speed-up 1 by definition, no interval against itself
        speed_cell = "1.00× (baseline)"
    elif alone or test.n_baseline < 2:
        speed_cell = f"{speed.ratio:.2f}× (n=1: no interval) n.s."
    else:
        speed_cell = f"{speed.ratio:.2f}× [{speed.low:.2f}–{speed.high:.2f}]" + (
            "" if test.significant else " n.s."
        )
    energy = f"{result.energy_wh.median:.2f} Wh" if result.energy_wh else "n/a"
    spread = (
        "n/a (n=1)" if alone else f"{total.spread_ratio * 100:.1f} %" + (" ⚠" if total.spread_warning else "")
    )
    runs = len(result.measured)  # a flag of every run is said alone; of some, in how many
    flags = sorted(result.flags.items())
    notes = [flag if n == runs else f"{flag} ({n} of {runs} runs)" for flag, n in flags]
    decoded = " (on decoded video)" if result.quality and result.quality.get("on") == DECODED_VIDEO else ""
    if result.quality and result.quality["psnr_db"] >= IDENTICAL_PSNR_DB:
        notes.append(f"frames identical to the quality reference{decoded}")
    elif result.quality:
        notes.append(f"PSNR {result.quality['psnr_db']:.1f} dB, SSIM {result.quality['ssim']:.3f}{decoded}")
    return [
        result.name,
        time_cell,
        speed_cell,
        energy,
        _bytes(result.peak_vram_bytes),
        _bytes(result.peak_rss_bytes),
        spread,
        _p_value(test.p_value) if test else "–",
        "; ".join(notes),
    ]


def mode_headline(mode: str, verdict: dict[str, Any]) -> dict[str, Any]:
    """The few figures of a launch check (``--soak``, ``--load``, ``--consistency``) worth a line in the
    report and on the terminal (the rest is in bench.json), rounded to what a reader compares."""
    if mode == "soak":
        keys: tuple[str, ...] = ("variant", "verdict", "rounds", "planned_rounds")
    elif mode == "load":
        keys = (
            "verdict",
            "jobs",
            "planned_jobs",
            "throughput_jobs_per_min",
            "latency_s",
            "queue_wait_s",
            "execution_s",
            "jobs_per_server",
        )
    else:  # per variant or server; a verdict taken on decoded video says so
        return {name: _verdict_of(item) for name, item in verdict.items()}
    return {k: _rounded(verdict[k]) for k in keys if k in verdict}


def mode_line(mode: str, verdict: dict[str, Any]) -> str:
    """:func:`mode_headline` in words, for the report: ``stable over 10 rounds of 8-step distill``,
    ``keeping up: 8 jobs, 3.2 jobs/min, …``, ``default: clean; --async-offload: clean``."""
    head = mode_headline(mode, verdict)
    if mode == "soak":
        rounds, planned = head.get("rounds"), head.get("planned_rounds")
        if rounds is None:  # not run: the verdict says why
            return str(head.get("verdict"))
        line = f"{head.get('verdict')} over {rounds} rounds of {head.get('variant')}"
        return line + (f" ({planned} planned)" if planned not in (None, rounds) else "")
    if mode == "load":
        return _load_line(head)
    return "; ".join(f"{name}: {value}" for name, value in head.items())


def _load_line(head: dict[str, Any]) -> str:
    if not head.get("jobs"):  # not run: the verdict says why
        return str(head.get("verdict"))
    jobs = f"{head['jobs']} jobs"
    if head.get("planned_jobs") not in (None, head["jobs"]):
        jobs += f" of {head['planned_jobs']} planned"
    figures = [jobs]
    if "throughput_jobs_per_min" in head:
        figures.append(f"{head['throughput_jobs_per_min']:g} jobs/min")
    if latency := head.get("latency_s"):
        figures.append("latency " + " / ".join(f"{q} {s:g} s" for q, s in latency.items()))
    for key, what in (("queue_wait_s", "median queue wait"), ("execution_s", "median execution")):
        if head.get(key) is not None:
            figures.append(f"{what} {head[key]:g} s")
    if spread := head.get("jobs_per_server"):
        figures.append("per server: " + ", ".join(f"{url} {count}" for url, count in spread.items()))
    return f"{head.get('verdict')}: {', '.join(figures)}"


def _verdict_of(item: dict[str, Any]) -> Any:
    verdict = item.get("verdict")
    return f"{verdict} (on decoded video)" if item.get("on") == DECODED_VIDEO else verdict


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def render_markdown(
    results: Sequence[VariantResult],
    *,
    title: str,
    context: Sequence[str] = (),
    modes: Mapping[str, Any] | None = None,
) -> str:
    """The report: a title, context lines, the table, the per-phase table, the launch checks' verdicts
    (``modes``) and the footnotes."""
    header = ["Config", "Total time", "Speed-up", "Energy", "Peak VRAM", "Peak RSS", "Spread", "p", "Notes"]
    lines = [f"# {title}", ""]
    lines += [f"- {line}" for line in (*context, *significance_notes(results))]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(format_row(r)) + " |" for r in results]
    phases = sorted({phase for r in results for phase, seconds in r.phases.items() if seconds > 0})
    if phases:
        lines += ["", "Per-phase median seconds:", ""]
        lines += ["| Config | " + " | ".join(phases) + " | s/step |", "|" + "---|" * (len(phases) + 2)]
        for r in results:
            if r.skipped is None and r.failed is None:
                cells = [f"{r.phases.get(p, 0.0):.3f}" for p in phases]
                step = f"{r.step_s:.3f}" if r.step_s is not None else "–"
                lines.append(f"| {r.name} | " + " | ".join(cells) + f" | {step} |")
    if modes:
        lines += ["", "Launch checks:", ""]
        lines += [f"- {name}: {mode_line(name, v)}" for name, v in modes.items()]
    lines += [
        "",
        "Total time: median over the measured runs (client end to end, execution start → history "
        "read: the queue wait is left out), "
        "[p10–p90]. Speed-up: baseline median / variant median, [95 % bootstrap interval]. "
        "p: two-sided Mann-Whitney U test of the variant's times against the baseline's (exact "
        f"permutation p-value, normal approximation beyond 40 runs in all); n.s. when p ≥ "
        f"{SIGNIFICANCE_LEVEL:g}. "
        f"Spread: stdev / mean; ⚠ when ≥ {SPREAD_WARNING_RATIO * 100:.0f} %. Energy and Peak VRAM "
        "need CUDA/NVML (n/a without); Peak RSS is the ComfyUI process's peak resident memory.",
        "",
    ]
    return "\n".join(lines)


def render_csv(results: Sequence[VariantResult]) -> str:
    """One CSV row per variant, raw numbers (seconds, bytes, Wh)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in results:
        t, s, u = r.total, r.speedup, r.significance
        q = r.quality or {}
        writer.writerow(
            [
                r.name,
                r.skipped or "",
                r.failed or "",
                t.n if t else 0,
                *((t.median, t.p10, t.p90, t.stdev if t.n > 1 else "", t.spread_warning) if t else ("",) * 5),
                *((s.ratio, s.low, s.high) if s else ("",) * 3),
                *((u.p_value, u.method, u.p_floor) if u else ("",) * 3),
                r.energy_wh.median if r.energy_wh else "",
                r.peak_vram_bytes.maximum if r.peak_vram_bytes else "",
                r.peak_rss_bytes.maximum if r.peak_rss_bytes else "",
                r.step_s if r.step_s is not None else "",
                ";".join(f"{k}={v:.6f}" for k, v in sorted(r.phases.items())),
                ";".join(f"{k}={v}" for k, v in sorted(r.flags.items())),
                q.get("psnr_db", ""),
                q.get("ssim", ""),
                q.get("on", ""),
            ]
        )
    return buffer.getvalue()


def write_plots(results: Sequence[VariantResult], out_dir: Path) -> list[Path]:
    """``total_time.png`` (median bars, p10–p90 error bars) and ``phases.png`` (stacked per phase);
    none when no variant was measured.

    Raises:
        PlotError: matplotlib is not installed.
    """
    if all(r.total is None for r in results):
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotError(
            "PNG plots need matplotlib: `pip install 'leanvideo[bench]'` or `pip install matplotlib` "
            "(the Markdown and CSV were written)"
        ) from exc
    measured = [r for r in results if r.total is not None]
    names = [r.name for r in measured]
    medians = [r.total.median for r in measured if r.total]
    low = [r.total.median - r.total.p10 for r in measured if r.total]
    high = [r.total.p90 - r.total.median for r in measured if r.total]
    paths = []
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(names)), 4.0))
    ax.bar(names, medians, yerr=[low, high], capsize=4, color="#4c72b0")
    ax.set_ylabel("total time, s (median, p10–p90)")
    ax.set_title("Total time per configuration")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    paths.append(out_dir / "total_time.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    phases = sorted({phase for r in measured for phase, seconds in r.phases.items() if seconds > 0})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(names)), 4.0))
    bottoms = [0.0] * len(measured)
    for phase in phases:
        values = [r.phases.get(phase, 0.0) for r in measured]
        ax.bar(names, values, bottom=bottoms, label=phase)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.set_ylabel("seconds (median per phase)")
    ax.set_title("Where the time goes")
    ax.legend(fontsize="small")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    paths.append(out_dir / "phases.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


ORDER_NOTES = {
    "interleaved": "after their warmups, the measured runs went round-robin over the variants sharing a "
    "server, so machine drift spreads over all of them",
    "sequential": "each variant's runs back to back, in file order: machine drift can bias one variant",
}


def run_context(matrix: Matrix, settings: BenchSettings, environment: dict[str, Any]) -> list[str]:
    """The report's context lines: what ran, in which order, with which settings, on what."""
    device = environment.get("device") or {}
    warmups = matrix.warmups if settings.warmups is None else settings.warmups
    repeats = matrix.repeats if settings.repeats is None else settings.repeats
    order = settings.order or matrix.order
    how = ORDER_NOTES[order]
    return [
        f"workflow `{matrix.workflow.name}`, mode {matrix.mode}, {warmups} warmup + {repeats} measured "
        f"runs per variant, baseline “{matrix.baseline}”, quality reference “{matrix.reference}”",
        f"run order: {order} ({how})",
        *(
            [
                f"{settings.server_warmups} discarded run(s) of each server's first variant before its "
                "measured runs"
                + (
                    " (a --server may have run prompts before)"
                    if settings.servers
                    else ", right after the server started (CUDA and library initialisation, page cache)"
                )
            ]
            if settings.server_warmups
            else []
        ),
        *([f"for every variant: `{'`, `'.join(settings.overrides)}` (--set)"] if settings.overrides else []),
        *(
            [
                f"time budget {settings.budget_s:g} s: no run started after it, so a variant may have fewer "
                "measured runs than asked (see n in report.csv)"
            ]
            if settings.budget_s is not None
            else []
        ),
        f"device {device.get('name')} ({device.get('type')}), torch {environment.get('pytorch_version')}, "
        f"ComfyUI {environment.get('comfyui_version')}, LeanVideo {environment.get('leanvideo_version')}",
        *([_given_server(settings.servers, environment)] if settings.servers else []),
    ]


def _given_server(servers: Sequence[str], environment: dict[str, Any]) -> str:
    """What the servers given with ``--server`` were launched with (``given_servers``, else the first's
    ``comfyui_argv``): a variant ran on one launched with its server flags, as it is (a flag such as
    ``--async-offload`` there is in the rows of the variants that ran on it)."""
    given = environment.get("given_servers")
    if not isinstance(given, dict):
        argv = environment.get("comfyui_argv") or []
        given = {servers[0]: argv[1:] if isinstance(argv, list) else []}
    flags = {url: " ".join(str(arg) for arg in args) or "no flags" for url, args in given.items()}
    if len(flags) == 1:
        [(url, launched)] = flags.items()
        return (
            f"server {url} (--server) launched with `{launched}`: every variant run ran on it as it is, "
            "these flags included"
        )
    listed = "; ".join(f"{url} with `{launched}`" for url, launched in flags.items())
    return (
        f"servers given with --server, launched: {listed}. Each variant ran on the first of them launched "
        "with its server flags and none of the other variants'; that server's other flags were in its runs"
    )
