"""The INT8 loaders' kernel report: what :meth:`~.dispatch.KernelDispatcher.summary` says.

Example::

    print(summarize("auto (measured at first use)", dispatcher.choices(), {(128, 256, "per_channel")}))
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .kernel_table import Choice, ShapeClass, describe_choice

WeightShape = tuple[int, int, str]  # (out, in, layout) of an INT8 weight, as its shape classes have them


def weight_shape_of(key: str) -> WeightShape:
    """The ``(out, in, layout)`` of the shape class ``key``."""
    shape_class = ShapeClass.from_key(key)
    return shape_class.out_features, shape_class.in_features, shape_class.layout


def of_shapes(choices: dict[str, Choice], weight_shapes: set[WeightShape] | None) -> dict[str, Choice]:
    """The ``choices`` of ``weight_shapes`` only (every one when None): one model's, of the table that
    holds every model's of the server."""
    return {
        key: choice
        for key, choice in choices.items()
        if weight_shapes is None or weight_shape_of(key) in weight_shapes
    }


def summarize(
    mode: str,
    choices: dict[str, Choice],
    weight_shapes: set[WeightShape] | None = None,
    *,
    forced: str | None = None,
    table: Path | None = None,
) -> str:
    """The mode, the known ``choices`` (for ``weight_shapes`` only, ``(out, in, layout)``, when given:
    one model's, the table holding every model's of the server), a reason every shape shares said once,
    shapes of ``weight_shapes`` with no choice yet counted, and the ``table`` file."""
    listed = sorted(of_shapes(choices, weight_shapes).items())
    counts = Counter(choice.kernel for _, choice in listed)  # the line to read first, then each shape's
    chosen = ", ".join(f"{kernel} on {n}" for kernel, n in counts.most_common())
    # counted per shape class (a weight shape at a row count and dtype), as the lines below list them
    lines = [f"INT8 kernels: {mode}" + (f": {chosen} of {len(listed)} shape class(es)" if listed else "")]
    known = {weight_shape_of(key) for key, _ in listed}
    # "int_mm_fused: not measured on a CPU …" on every line made a report of forty lines
    shared: list[tuple[str, str]] = []
    if len(listed) > 1:
        first = listed[0][1].grouped_reasons()
        shared = [reason for reason in first if all(reason in c.grouped_reasons() for _, c in listed[1:])]
    lines += ["  " + describe_choice(key, choice, said_apart=shared) for key, choice in listed]
    lines += [f"  on every shape, {names}: {why}" for names, why in shared]
    if weight_shapes is not None and (pending := weight_shapes - known):
        when = f"{forced} where it can run them" if forced else "chosen at first use"
        lines.append(f"  {len(pending)} weight shape(s) not run yet: {when}")
    if table is not None:
        lines.append(f"  table: {table}")
    return "\n".join(lines)
