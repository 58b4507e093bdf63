"""Every variant of a matrix checked against the first server's ``/object_info`` before any run.

A matrix is a file the user wrote, like a workflow: a ``set`` naming an input that does not exist, an
``[[variant.insert]]`` of a node the server lacks or aimed at a missing input, is a mistake in that
file. Found only when its variant's turn came, it failed that variant after the others had run (exit 6,
the first mistake named). Checked here, every mistake is listed at once with its variant, and nothing
runs (exit 5), as with a bad ``--set`` on the command line.

Example::

    problems = matrix_problems(matrix.variants, base, object_info)
    # ["variant 'base': --set 'Nope.steps=2': no node 'Nope' …", "variant 'base': --set '9.stepz=1': …"]
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks.matrix import Variant
from runner.errors import WorkflowError
from runner.graph.validate import unknown_node_problem, validate_workflow
from runner.graph.workflow import apply_overrides, input_names


def matrix_problems(
    variants: Iterable[Variant],
    base: dict[str, Any],
    object_info: dict[str, Any],
    overrides: Iterable[str] = (),
    *,
    server_args: tuple[str, ...] = (),
) -> list[str]:
    """What stops each of ``variants`` from running on a server with ``object_info``, started with
    ``server_args``: its inserts, each of its overrides (then the command line's ``overrides``), and for
    the variants of that server the errors ``workflow validate`` would report on the result (warnings
    are not problems). A variant of a server started with other flags, which may have other nodes or
    models, is checked here for its inserts and overrides only; its own server checks the rest."""
    problems = _override_problems(copy.deepcopy(base), overrides, object_info, "")  # the command line's, once
    line_refused = bool(problems)
    for variant in variants:
        where = f"variant {variant.name!r}: "
        try:
            workflow = variant.build_workflow(base)
        except WorkflowError as error:
            problems.append(f"{where}{error}")
            continue
        found = _override_problems(workflow, variant.overrides, object_info, where, label="set")
        found += _link_input_problems(variant, object_info, where)
        if found or line_refused:  # the rest would only report the same mistakes again, as bad values
            problems += found
            if variant.server_args == server_args:  # what validating would have said that they do not
                problems += _unknown_inserts(variant, object_info, where)
            continue
        problems += _override_problems(workflow, overrides, object_info, where)
        if variant.server_args == server_args:
            checked = validate_workflow(workflow, object_info)
            problems += [f"{where}{problem}" for problem in checked if problem.kind == "error"]
    return problems


def baseline_problems(
    baseline: Variant,
    runnable: list[Variant],
    on_cpu: bool,
    variants: Sequence[Variant] = (),
    unplaced: Mapping[tuple[str, ...], str] | None = None,
) -> list[str]:
    """The baseline, when it is not among the ``runnable`` variants: skipped, it would leave every
    speed-up (and ``--soak``/``--load``, run on its server) out, after all the other runs. And the
    baseline alone runnable of ``variants`` (the matrix's, after ``--variant``): a table of one row,
    nothing compared, that exited 0. ``unplaced``: why no ``--server`` runs a launch-flag set."""
    unplaced = unplaced or {}
    if baseline not in runnable:
        skip = baseline.cpu_skip(on_cpu)
        why = skip or f"it {_flags_needed(baseline, unplaced)}"
        advice = "" if skip else "give a --server launched as it needs, or "
        return [
            f"the baseline {baseline.name!r} would be skipped ({why}): {advice}choose another with --baseline"
        ]
    others = [variant for variant in variants if variant is not baseline]
    if others and not any(variant is not baseline for variant in runnable):
        skips = [variant.cpu_skip(on_cpu) for variant in others]
        reasons = "; ".join(
            f"{variant.name!r} is skipped {skip}"
            if skip
            else f"{variant.name!r} {_flags_needed(variant, unplaced)}"
            for variant, skip in zip(others, skips, strict=True)
        )
        without = (
            "run the bench without --server (it starts a server with each variant's flags), give a "
            "--server launched with their flags, or "
            if not all(skips)
            else ""
        )
        return [
            f"only the baseline {baseline.name!r} can run here, so nothing would be compared ({reasons}): "
            f"{without}choose variants that run here"
        ]
    return []


def _flags_needed(variant: Variant, unplaced: Mapping[tuple[str, ...], str]) -> str:
    """Why no ``--server`` runs ``variant`` (``needs server flags … (no --server was launched …)``)."""
    return unplaced.get(variant.server_args) or f"needs server flags {' '.join(variant.server_args)}"


def _override_problems(
    workflow: dict[str, Any],
    specs: Iterable[str],
    object_info: dict[str, Any],
    where: str,
    label: str = "--set",
) -> list[str]:
    """Each override of ``specs`` that ``workflow`` (changed in place by the others) does not take, said
    as ``label`` (``set`` for a matrix's own, ``--set`` for the command line's)."""
    problems = []
    for spec in specs:
        try:
            apply_overrides(workflow, [spec], object_info)
        except WorkflowError as error:
            said = str(error).removeprefix(f"--set {spec!r}: ")  # named here once, as the source says
            problems.append(f"{where}{label} {spec!r}: {said}")
    return problems


def _link_input_problems(variant: Variant, object_info: dict[str, Any], where: str) -> list[str]:
    """The variant's inserted nodes whose ``link_input`` is no input of their (known) class: said as
    that key, not as the input the class then lacks."""
    problems = []
    for insertion in variant.inserts:
        if insertion.class_type not in object_info:  # said as an unknown node instead
            continue
        known = input_names(object_info, insertion.class_type)
        if insertion.link_input not in known:
            problems.append(
                f"{where}insert {insertion.node_id!r}: link_input {insertion.link_input!r} is not an input "
                f"of {insertion.class_type} (its inputs: {', '.join(known)})"
            )
    return problems


def _unknown_inserts(variant: Variant, object_info: dict[str, Any], where: str) -> list[str]:
    """The variant's inserted nodes whose type the server lacks, said as ``workflow validate`` says them."""
    return [
        f"{where}{unknown_node_problem(insertion.node_id, insertion.class_type, object_info)}"
        for insertion in variant.inserts
        if insertion.class_type not in object_info
    ]
