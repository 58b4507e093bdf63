"""The benchmark matrix file: a base workflow plus named variants, parsed into validated dataclasses.

Format (TOML; paths are relative to the matrix file)::

    [bench]
    workflow = "../workflows/ltxv_tiny_t2v.api.json"
    warmups = 1                # runs kept out of the statistics
    repeats = 5                # measured runs per variant
    mode = "warm"              # "warm" (models stay loaded) or "cold" (models unloaded before each run)
    order = "interleaved"      # measured runs round-robin over the variants of a server, or "sequential"
    baseline = "20-step baseline"    # speed-up is measured against this variant (default: the first)
    reference = "20-step baseline"   # quality (PSNR/SSIM) is measured against this one (default: baseline)
    memory_tolerance_mb = 256  # memory must return to within this of the first measured run's start
    fixtures = false           # true: write the tiny fixture models and load the fixture nodes
    timeout_s = 1800

    [[variant]]
    name = "8-step distill"
    extends = "20-step baseline"       # inherit set/insert/server_args of an earlier variant (its own
                                       # server_args, when given, replace the inherited ones)
    set = ["9.steps=8"]                # `leanvideo run --set` overrides
    server_args = ["--async-offload"]  # ComfyUI launch flags (the server is restarted for them)
    skip_on_cpu = "why this variant means nothing on CPU"   # listed with the reason, not run

    [[variant.insert]]                 # a node spliced into a link, in order
    id = "lv_lora"
    class_type = "LoraLoaderModelOnly"
    inputs = { lora_name = "distill.safetensors", strength_model = 1.0 }
    link_input = "model"               # the new node's input that takes the link target.input had
    target = "11.model"                # the input re-pointed at the new node's output 0

Example::

    matrix = load_matrix(Path("benchmarks/seed_table_tiny.toml"))
    print([v.name for v in matrix.variants], matrix.baseline)
"""

from __future__ import annotations

import copy
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner.errors import UsageError, WorkflowError
from runner.local.server_args import refuse_owned_flags

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MODES = ("warm", "cold")
ORDERS = ("interleaved", "sequential")
_BENCH_KEYS = {
    "workflow",
    "warmups",
    "repeats",
    "mode",
    "order",
    "baseline",
    "reference",
    "memory_tolerance_mb",
    "fixtures",
    "timeout_s",
}
MAX_REPEATS = 1000  # measured runs (and warmups) per variant: the run plan is made up front
MAX_SLUG_BYTES = 100  # a variant's file names add a suffix (".api.json") to it; a name is at most 255 bytes
_VARIANT_KEYS = {"name", "extends", "set", "insert", "server_args", "skip_on_cpu"}
_INSERT_KEYS = {"id", "class_type", "inputs", "link_input", "target"}


class MatrixError(WorkflowError):
    """A matrix file that cannot be read or does not validate; the message names file, variant, key."""


@dataclass(frozen=True)
class Insertion:
    """One node spliced into the link that feeds ``target`` (``"NODE.input"``)."""

    node_id: str
    class_type: str
    inputs: tuple[tuple[str, Any], ...]
    link_input: str
    target: str

    def apply(self, workflow: dict[str, Any]) -> None:
        """Add the node to ``workflow`` (in place) and re-point ``target`` at its output 0."""
        node_id, _, input_name = self.target.partition(".")
        consumer = workflow.get(node_id)
        if not isinstance(consumer, dict) or input_name not in consumer.get("inputs", {}):
            raise WorkflowError(f"insert {self.node_id!r}: target {self.target!r} is not an input")
        if self.node_id in workflow:
            raise WorkflowError(f"insert {self.node_id!r}: the workflow already has a node with that id")
        inputs = dict(self.inputs)
        inputs[self.link_input] = consumer["inputs"][input_name]
        workflow[self.node_id] = {
            "class_type": self.class_type,
            "inputs": inputs,
            "_meta": {"title": f"{self.class_type} (bench)"},
        }
        consumer["inputs"][input_name] = [self.node_id, 0]


@dataclass(frozen=True)
class Variant:
    """A named configuration: overrides, inserted nodes and server flags (inherited ones included)."""

    name: str
    overrides: tuple[str, ...] = ()
    inserts: tuple[Insertion, ...] = ()
    server_args: tuple[str, ...] = ()
    skip_on_cpu: str | None = None

    def cpu_skip(self, on_cpu: bool) -> str | None:
        """Why this variant is not run on a CPU server (``on CPU: …``), or None."""
        return f"on CPU: {self.skip_on_cpu}" if on_cpu and self.skip_on_cpu else None

    def build_workflow(self, base: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``base`` with this variant's nodes inserted (overrides are applied by the runner)."""
        workflow = copy.deepcopy(base)
        for insertion in self.inserts:
            insertion.apply(workflow)
        return workflow


@dataclass(frozen=True)
class Matrix:
    """A parsed matrix file."""

    path: Path
    workflow: Path
    variants: tuple[Variant, ...]
    warmups: int = 1
    repeats: int = 5
    mode: str = "warm"
    order: str = "interleaved"
    baseline: str = ""
    reference: str = ""
    memory_tolerance_mb: float = 256.0
    fixtures: bool = False
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.warmups < 0:
            raise MatrixError(f"{self.path}: [bench] warmups must be ≥ 0, got {self.warmups}")
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise MatrixError(f"{self.path}: [bench] repeats must be 1 to {MAX_REPEATS}, got {self.repeats}")
        if self.warmups > MAX_REPEATS:
            raise MatrixError(
                f"{self.path}: [bench] warmups must be at most {MAX_REPEATS}, got {self.warmups}"
            )
        if self.mode not in MODES:
            raise MatrixError(f"{self.path}: [bench] mode must be one of {MODES}, got {self.mode!r}")
        if self.order not in ORDERS:
            raise MatrixError(f"{self.path}: [bench] order must be one of {ORDERS}, got {self.order!r}")
        names = [v.name for v in self.variants]
        for key in ("baseline", "reference"):
            if getattr(self, key) not in names:
                raise MatrixError(f"{self.path}: [bench] {key} {getattr(self, key)!r} is not a variant")

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise MatrixError(f"{self.path}: no variant named {name!r}")


def select_variants(matrix: Matrix, names: Sequence[str] = (), baseline: str | None = None) -> Matrix:
    """``matrix`` with only the variants ``names`` (exact names or their slugs), in file order.

    ``baseline`` (a name or slug) replaces the matrix's baseline and quality reference. The baseline
    and reference always stay in: speed-ups and frame quality are measured against them in the same
    session. Raises :class:`MatrixError` naming an unknown variant and the choices.
    """
    chosen = {_find_variant(matrix, name).name for name in names}
    new_baseline = _find_variant(matrix, baseline).name if baseline else matrix.baseline
    new_reference = new_baseline if baseline else matrix.reference
    if chosen:
        chosen |= {new_baseline, new_reference}
    variants = tuple(v for v in matrix.variants if not chosen or v.name in chosen)
    return replace(matrix, variants=variants, baseline=new_baseline, reference=new_reference)


def variant_slug(name: str) -> str:
    """A file-name-safe form of a variant name (``"8-step + graph compile"`` → ``8-step-graph-compile``,
    ``"8 步 + 注意力"`` → ``8-步-注意力``): letters and digits of any script kept, the rest one ``-``."""
    return re.sub(r"[\W_]+", "-", name.lower()).strip("-") or "variant"


def _find_variant(matrix: Matrix, name: str) -> Variant:
    for variant in matrix.variants:
        if name in (variant.name, variant_slug(variant.name)):
            return variant
    choices = ", ".join(variant_slug(v.name) for v in matrix.variants)
    raise MatrixError(f"{matrix.path}: no variant {name!r}; the variants are {choices}")


def load_matrix(path: Path) -> Matrix:
    """Read and validate a matrix file.

    Raises:
        MatrixError: unreadable TOML, unknown keys, wrong types, bad references; the message names the
            file, the variant and the key.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise MatrixError(f"matrix {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MatrixError(f"cannot read matrix {path}: {exc}") from exc
    return parse_matrix(data, path)


def parse_matrix(data: dict[str, Any], path: Path) -> Matrix:
    """Validate the decoded TOML ``data`` of the matrix at ``path``; see :func:`load_matrix`."""
    bench = data.get("bench")
    if not isinstance(bench, dict):
        raise MatrixError(f"{path}: missing [bench] table")
    _check_keys(bench, _BENCH_KEYS, f"{path}: [bench]")
    unknown_top = set(data) - {"bench", "variant"}
    if unknown_top:
        raise MatrixError(f"{path}: unknown top-level key(s) {sorted(unknown_top)}")
    workflow_value = _typed(bench, "workflow", str, f"{path}: [bench]", required=True)
    workflow = (path.parent / workflow_value).resolve()
    if not workflow.is_file():
        what = "a folder, not a workflow file" if workflow.is_dir() else "no such file"
        raise MatrixError(f"{path}: [bench] workflow {workflow_value!r}: {what} {workflow}")
    raw_variants = data.get("variant")
    if not isinstance(raw_variants, list) or not raw_variants:
        raise MatrixError(f"{path}: no [[variant]] tables")
    variants: list[Variant] = []
    for index, raw in enumerate(raw_variants):
        variants.append(_parse_variant(raw, index, variants, path))
    first = variants[0].name
    baseline = _typed(bench, "baseline", str, f"{path}: [bench]") or first
    where = f"{path}: [bench]"
    return Matrix(
        path=path,
        workflow=workflow,
        variants=tuple(variants),
        warmups=_typed(bench, "warmups", int, where) if "warmups" in bench else 1,
        repeats=_typed(bench, "repeats", int, where) if "repeats" in bench else 5,
        mode=_typed(bench, "mode", str, where) or "warm",
        order=_typed(bench, "order", str, where) or "interleaved",
        baseline=baseline,
        reference=_typed(bench, "reference", str, where) or baseline,
        memory_tolerance_mb=_number(bench, "memory_tolerance_mb", where, default=256.0, minimum=0.0),
        fixtures=bool(_typed(bench, "fixtures", bool, where)),
        timeout_s=_number(bench, "timeout_s", where, default=1800.0, minimum=None),
    )


def _parse_variant(raw: Any, index: int, earlier: list[Variant], path: Path) -> Variant:
    if not isinstance(raw, dict):
        raise MatrixError(f"{path}: variant #{index + 1} is not a table")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise MatrixError(f"{path}: variant #{index + 1}: key 'name' must be a non-empty string")
    where = f"{path}: variant {name!r}:"
    _check_keys(raw, _VARIANT_KEYS, where)
    if any(v.name == name for v in earlier):
        raise MatrixError(f"{where} duplicate name")
    if len(variant_slug(name).encode("utf-8")) > MAX_SLUG_BYTES:
        raise MatrixError(
            f"{where} key 'name': too long for the file names its runs are stored under "
            f"({len(variant_slug(name).encode('utf-8'))} bytes as {variant_slug(name)[:20]!r}…; at most "
            f"{MAX_SLUG_BYTES}): shorten it"
        )
    same_slug = [v.name for v in earlier if variant_slug(v.name) == variant_slug(name)]
    if same_slug:
        raise MatrixError(
            f"{where} its file name {variant_slug(name)!r} is also variant {same_slug[0]!r}'s "
            "(runs and workflows are stored by that name): rename one of them"
        )
    parent = Variant(name="")
    extends = _typed(raw, "extends", str, where)
    if extends:
        found = [v for v in earlier if v.name == extends]
        if not found:
            raise MatrixError(f"{where} key 'extends': {extends!r} is not an earlier variant")
        parent = found[0]
    overrides = _string_list(raw, "set", where)
    for spec in overrides:
        if "=" not in spec or "." not in spec.split("=", 1)[0]:
            raise MatrixError(f"{where} key 'set': {spec!r} is not NODE.input=VALUE")
    server_args = _string_list(raw, "server_args", where)
    if any(not arg.strip() for arg in server_args):
        raise MatrixError(f"{where} key 'server_args': an empty flag ({list(server_args)}): remove it")
    try:
        refuse_owned_flags(server_args)
    except UsageError as error:
        raise MatrixError(f"{where} key 'server_args': {error}") from error
    inserts_raw = raw.get("insert", [])
    if not isinstance(inserts_raw, list):
        raise MatrixError(f"{where} key 'insert' must be an array of tables ([[variant.insert]])")
    inserts = tuple(_parse_insert(item, f"{where} insert #{i + 1}") for i, item in enumerate(inserts_raw))
    return Variant(
        name=name,
        overrides=parent.overrides + overrides,
        inserts=parent.inserts + inserts,
        # its own launch flags replace the inherited ones (server_args = [] for none)
        server_args=server_args if "server_args" in raw else parent.server_args,
        skip_on_cpu=_typed(raw, "skip_on_cpu", str, where) or None,
    )


def _parse_insert(raw: Any, where: str) -> Insertion:
    if not isinstance(raw, dict):
        raise MatrixError(f"{where} is not a table")
    _check_keys(raw, _INSERT_KEYS, where)
    inputs = raw.get("inputs", {})
    if not isinstance(inputs, dict):
        raise MatrixError(f"{where} key 'inputs' must be a table")
    target = _typed(raw, "target", str, where, required=True)
    if target.count(".") != 1:
        raise MatrixError(f"{where} key 'target': {target!r} is not NODE.input")
    return Insertion(
        node_id=_typed(raw, "id", str, where, required=True),
        class_type=_typed(raw, "class_type", str, where, required=True),
        inputs=tuple(sorted(inputs.items())),
        link_input=_typed(raw, "link_input", str, where, required=True),
        target=target,
    )


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise MatrixError(f"{where} unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _typed(table: dict[str, Any], key: str, kind: Any, where: str, *, required: bool = False) -> Any:
    if key not in table:
        if required:
            raise MatrixError(f"{where} missing key {key!r}")
        return None
    value = table[key]
    # bool is an int subclass: never accept true for a count.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise MatrixError(f"{where} key {key!r} has the wrong type: {value!r}")
    return value


def _number(table: dict[str, Any], key: str, where: str, *, default: float, minimum: float | None) -> float:
    """A finite number; ``minimum`` is the least allowed value, ``None`` for strictly positive."""
    value = _typed(table, key, (int, float), where)
    if value is None:
        return default
    number = float(value)
    if not math.isfinite(number):
        raise MatrixError(f"{where} key {key!r} must be a finite number, got {value!r}")
    if minimum is None and number <= 0:
        raise MatrixError(f"{where} key {key!r} must be > 0 seconds, got {value!r}")
    if minimum is not None and number < minimum:
        raise MatrixError(f"{where} key {key!r} must be ≥ {minimum:g}, got {value!r}")
    return number


def _string_list(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise MatrixError(f"{where} key {key!r} must be a list of strings")
    return tuple(value)
