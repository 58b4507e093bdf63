"""The workflow file each variant of a bench runs (``OUT/workflows/<variant>.api.json``): the matrix's
workflow with the variant's nodes inserted, its overrides (``--set`` included) applied and the lossless
frame capture the quality checks compare, so ``leanvideo run`` or ``workflow diff`` of it sees what ran;
and a server group's jobs of those files.

Example::

    path, applied = write_variant_workflow(variant, base, object_info, Path("bench-out/x"))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import modes
from benchmarks.matrix import Variant, variant_slug
from benchmarks.protocol import VariantRun, one_line
from runner.errors import WorkflowError
from runner.graph.workflow import Override, apply_overrides


def write_variant_workflow(
    variant: Variant, base: dict[str, Any], object_info: dict[str, Any], out: Path
) -> tuple[Path, list[Override]]:
    """The workflow the variant runs, its nodes inserted and its overrides (``--set`` included) applied,
    so ``leanvideo run`` or ``workflow diff`` of the file sees what ran; and those overrides with the
    matrix workflow's values they replaced (each run records them; it does not apply them again)."""
    workflow = variant.build_workflow(base)
    applied = apply_overrides(workflow, list(variant.overrides), object_info)
    modes.add_lossless_capture(workflow, object_info)  # the quality checks compare frames, not H.264
    path = out / "workflows" / f"{variant_slug(variant.name)}.api.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(workflow, indent=2) + "\n", encoding="utf-8")
    return path, applied


def prepare_jobs(
    group: list[Variant],
    base: dict[str, Any],
    object_info: dict[str, Any],
    out: Path,
    on_cpu: bool,
    skipped: dict[str, str],
    failed: dict[str, str],
    say: Callable[[str], None],
) -> list[VariantRun]:
    """The variants of ``group`` to run, workflows written; CPU-skipped ones go to ``skipped``, one
    whose own ``set`` the server's /object_info refuses to ``failed``."""
    jobs: list[VariantRun] = []
    for variant in group:
        if skip := variant.cpu_skip(on_cpu):
            skipped[variant.name] = skip
            say(f"{variant.name}: skipped ({skip})")
            continue
        try:
            path, applied = write_variant_workflow(variant, base, object_info, out)
        except WorkflowError as error:
            failed[variant.name] = f"WorkflowError before its runs: {one_line(error)}"
            continue
        jobs.append(VariantRun(variant, path, out / "runs" / variant_slug(variant.name), tuple(applied)))
    return jobs
