"""What a reader of the benchmark table must be told beside its figures: what a variant's runs did
that its name does not say (Patch Attention left the attention unchanged), speed-ups that compare two
time windows or a baseline not measured, and sample sizes too small for any p-value to reach the level.

Example::

    flags = attention_flags(record["telemetry"])     # ["attention ran: sdpa"]
    lines = comparison_caveats(matrix, results) + significance_notes(results)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from benchmarks.stats import repeats_for_significance

if TYPE_CHECKING:
    from benchmarks.matrix import Matrix
    from benchmarks.results import VariantResult

NOT_PATCHED = "attention not patched"


def attention_flags(telemetry: dict[str, Any]) -> list[str]:
    """What Patch Attention did in a run, from its telemetry events: the backend that ran
    (``attention ran: sdpa``), fell back, or that nothing was patched and why; a variant whose attention
    was left unchanged must not pass its speed-up off as the attention's."""
    flags = []
    for event in telemetry.get("events") or []:
        if event.get("kind") != "attention":
            continue
        key, outcome = str(event.get("key", "")), event.get("outcome")
        if outcome == "not patched":
            flags.append(f"{NOT_PATCHED} ({key.removeprefix('not patched: ')})")
        else:
            flags.append(f"attention {'fell back' if outcome == 'fell back' else 'ran'}: {key}")
    return flags


ASYNC_ON, ASYNC_OFF = "--async-offload", "--disable-async-offload"


def comparison_caveats(
    matrix: Matrix, results: Sequence[VariantResult], device: dict[str, Any] | None = None
) -> list[str]:
    """Report lines a reader of the speed-ups must see: a quality reference or baseline not measured,
    variants timed on another server than the baseline's (launch flags), so in another time window,
    and on a CUDA device an ``--async-offload`` variant against a baseline that offloaded asynchronously
    too (ComfyUI 0.3.75's default on NVIDIA). ``device``: the environment's (type, name)."""
    lines = []
    reference = next((r for r in results if r.name == matrix.reference), None)
    if reference is not None and reference.total is None and reference.name != matrix.baseline:
        why = reference.skipped or reference.failed or "no measured run"
        lines.append(f"no PSNR/SSIM: the quality reference “{reference.name}” was not measured ({why})")
    base = next((r for r in results if r.name == matrix.baseline), None)
    if base is not None and base.total is None:
        why = base.skipped or base.failed or "no measured run"
        lines.append(f"**no speed-up: the baseline “{base.name}” was not measured ({why})**")
        return lines
    for result in results:
        unchanged = sorted({flag for flag in result.flags if flag.startswith(NOT_PATCHED)})
        if unchanged:
            lines.append(f"**{result.name}: {'; '.join(unchanged)}: its speed-up is not the attention's**")
    measured = {r.name for r in results if r.total is not None}
    base_args = next((v.server_args for v in matrix.variants if v.name == matrix.baseline), ())
    same = [v.name for v in matrix.variants if ASYNC_ON in v.server_args and v.name in measured]
    device = device or {}
    nvidia = device.get("type") == "cuda" and "nvidia" in str(device.get("name", "")).lower()
    if nvidia and same and ASYNC_OFF not in base_args:  # ROCm is "cuda" too, and not offloaded so
        lines.append(
            f"**{', '.join(same)}: ComfyUI 0.3.75 offloads weights asynchronously by default on NVIDIA, so "
            f"the baseline did too: {ASYNC_ON} compared nothing (launch the baseline with {ASYNC_OFF})**"
        )
    other = [v.name for v in matrix.variants if v.server_args != base_args and v.name in measured]
    if other:
        lines.append(
            f"{', '.join(other)}: timed on another server than the baseline (launch flags need one), so "
            "the speed-up compares two time windows, and a change of the machine's load between them "
            "counts as speed-up (its CI and p do not see it): check in the phase table that the phases "
            "its launch flags do not touch stayed put"
        )
    return lines


def significance_notes(results: Sequence[VariantResult]) -> list[str]:
    """One line per pair of sample sizes whose smallest possible p is not below the level."""
    notes = []
    seen: set[tuple[int, int]] = set()
    for result in results:
        test = result.significance
        if test is None or test.can_be_significant or (test.n_baseline, test.n_variant) in seen:
            continue
        seen.add((test.n_baseline, test.n_variant))
        sizes = (
            f"n={test.n_variant} per variant"
            if test.n_baseline == test.n_variant
            else f"n={test.n_baseline} baseline and n={test.n_variant} variant runs"
        )
        notes.append(
            f"with {sizes} no difference can reach p < {test.level:g} (the smallest possible two-sided "
            f"Mann-Whitney p is {test.p_floor:.3f}), however large it is; use --repeats ≥ "
            f"{repeats_for_significance(test.level)}"
        )
    return notes
