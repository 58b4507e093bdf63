"""API-format workflows: load them and apply ``--set`` overrides, checked against ``/object_info``
(:mod:`runner.graph.validate` checks a whole workflow).

An override is ``TARGET.input=VALUE``. TARGET is a node id (``11``, ``406.0.0.428``, ``54:73``), a node
title (``_meta.title``) or a class_type when only one node has it; VALUE is parsed as JSON when it can
be (``8``, ``2.5``, ``true``, ``"text"``) and taken as a string otherwise, then checked against the
input's type in ``/object_info`` (INT/FLOAT ranges, BOOLEAN, STRING, combo choices). Unknown targets
and inputs are rejected with the closest matches.

Example::

    workflow = load_workflow(Path("workflows/ltxv_tiny_t2v.api.json"))
    applied = apply_overrides(workflow, ["Sample.noise_seed=7", "9.steps=4"], object_info)
"""

from __future__ import annotations

import decimal
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import WorkflowError
from runner.graph.suggest import close_hint
from runner.graph.ui_shape import json_kind
from runner.graph.workflow_file import read_json_file, refuse_constant

Workflow = dict[str, Any]
ObjectInfo = dict[str, Any]

SEED_INPUTS = ("seed", "noise_seed")
EXACT_FLOAT_INT = 2**53  # past it, a float no longer holds every integer
# Input types the pinned frontend draws as widgets of its extensions (a recording, the webcam's frame, a 3D
# scene, an upload button), whose value the server takes as written: never from a link in the editor.
FRONTEND_VALUE_TYPES = frozenset(
    {"AUDIO_RECORD", "WEBCAM", "LOAD_3D", "PREVIEW_3D", "AUDIO_UI", "AUDIOUPLOAD", "IMAGEUPLOAD"}
)
# Widgets the frontend's extensions add to some nodes, by node type: their DOM widgets always submit "",
# which the server ignores (an input it does not declare).
FRONTEND_WIDGETS = {
    **dict.fromkeys(("LoadAudio", "SaveAudio", "PreviewAudio", "SaveAudioMP3", "SaveAudioOpus"), "audioUI"),
    **dict.fromkeys(("Preview3D", "SaveGLB"), "image"),
    "PreviewAny": "preview",
}
# ... and to any node once it shows a video (its DOM preview, in the API export after a run)
FRONTEND_PREVIEW_WIDGETS = frozenset({"video-preview"})


@dataclass(frozen=True)
class Override:
    """One applied ``--set``: where it landed, the new value and the one it replaced."""

    spec: str
    node_id: str
    input_name: str
    value: Any
    previous: Any


def is_ui_workflow(data: Any) -> bool:
    """Whether ``data`` is a workflow as the editor saves it (``nodes`` and ``links``; a list of ``nodes``
    without ``links`` is one that lost them, which :func:`~runner.graph.ui_shape.check_ui_shape` names),
    not API format."""
    if not isinstance(data, dict) or "nodes" not in data:
        return False
    return "links" in data or isinstance(data["nodes"], list)


def load_workflow(path: Path) -> Workflow:
    """Read an API-format workflow, with an error that names the file when it is not one."""
    return api_workflow(read_json_file(path), path)


def api_workflow(workflow: Any, path: Path) -> Workflow:
    """``workflow`` (the JSON read from ``path``) as an API-format workflow, with an error that names the
    file when it is not one."""
    if is_ui_workflow(workflow):
        raise WorkflowError(
            f"workflow file {path} is not in API format: it is an editor (UI) workflow; convert it with "
            f"`leanvideo workflow convert {path}` (or 'Export (API)' in ComfyUI)"
        )
    if not isinstance(workflow, dict):
        raise WorkflowError(f"workflow file {path} is not in API format (node id -> {{class_type, inputs}})")
    if isinstance(workflow.get("prompt"), dict) and "class_type" not in workflow["prompt"]:
        raise WorkflowError(
            f'workflow file {path} is a request to ComfyUI\'s /prompt (its workflow is under "prompt"): '
            "save that object alone as the workflow file"
        )
    for node_id, node in workflow.items():
        if not isinstance(node, dict) or "class_type" not in node:
            what = "has no class_type" if isinstance(node, dict) else f"is {json_kind(node)}, not a node"
            api = "API format is node id -> {class_type, inputs}"
            raise WorkflowError(f"workflow file {path}: node {node_id} {what} ({api})")
        if not isinstance(node["class_type"], str) or not node["class_type"]:
            shown = json.dumps(node["class_type"])[:60]
            raise WorkflowError(
                f"workflow file {path}: node {node_id}: class_type {shown} is not a node type name"
            )
        if not isinstance(node.get("inputs", {}), dict):
            shown = json.dumps(node["inputs"])[:60]
            raise WorkflowError(
                f"workflow file {path}: node {node_id} ({node['class_type']}): inputs must be an object of "
                f"input name -> value or link, not {shown}"
            )
    return workflow


def node_title(node: dict[str, Any]) -> str | None:
    meta = node.get("_meta")
    title = meta.get("title") if isinstance(meta, dict) else None
    return title if isinstance(title, str) else None


def resolve_node(workflow: Workflow, target: str) -> str:
    """The node id ``target`` names: an id, a unique title, or a unique class_type.

    Raises:
        WorkflowError: nothing or more than one node matches (with close matches / the candidates).
    """
    if target in workflow:
        return target
    for label, key in (("title", node_title), ("class_type", lambda n: n.get("class_type"))):
        matches = [node_id for node_id, node in workflow.items() if key(node) == target]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise WorkflowError(
                f"{target!r} is the {label} of several nodes ({', '.join(matches)}); address one by id"
            )
    names = {str(n.get("class_type")) for n in workflow.values()}
    names |= {t for t in map(node_title, workflow.values()) if t}
    # ids are matched too, but listed only as nearest: "1, 10, 11 …" tells nothing
    hint = close_hint(target, names | set(workflow), known="its nodes' titles and classes", listed=names)
    raise WorkflowError(f"no node {target!r} in the workflow{hint}")


def input_spec(object_info: ObjectInfo, class_type: str, input_name: str) -> list[Any] | None:
    """``[type, options]`` of one input of a node class, or ``None`` when the class has no such input."""
    inputs = (object_info.get(class_type) or {}).get("input") or {}
    for section in ("required", "optional"):
        spec = (inputs.get(section) or {}).get(input_name)
        if spec is not None:
            return list(spec) if isinstance(spec, (list, tuple)) else [spec]
    return None


def input_names(object_info: ObjectInfo, class_type: str) -> list[str]:
    inputs = (object_info.get(class_type) or {}).get("input") or {}
    return [name for section in ("required", "optional") for name in (inputs.get(section) or {})]


def parse_override(spec: str) -> tuple[str, str, Any]:
    """Split ``TARGET.input=VALUE`` into its parts; VALUE is parsed as JSON when possible (a text
    input takes it as typed: :func:`apply_overrides`)."""
    left, equals, raw = spec.partition("=")
    target, dot, name = left.rpartition(".")
    if not equals or not dot or not target or not name:
        raise WorkflowError(
            f"--set {spec!r}: expected NODE.input=VALUE (e.g. KSampler.seed=42, 11.noise_seed=7)"
        )
    try:
        value: Any = json.loads(raw, parse_constant=refuse_constant)
    except (ValueError, RecursionError):
        value = raw
    return target.strip(), name.strip(), value


def apply_overrides(
    workflow: Workflow,
    specs: list[str],
    object_info: ObjectInfo | None,
    editor_only: Mapping[str, str] | None = None,
) -> list[Override]:
    """Apply ``--set`` overrides to ``workflow`` in place, each type-checked; returns what changed.
    ``editor_only``: for a workflow converted from an editor file, what to say of a target that names
    one of its editor-only nodes (:func:`~runner.graph.editor_nodes.editor_only_hints`).

    Raises:
        WorkflowError: an unknown node or input (with close matches), a linked input, or a bad value.
    """
    applied: list[Override] = []
    for spec in specs:
        target, name, value = parse_override(spec)
        typed = spec.partition("=")[2]  # what a text input takes: "1.50" stays "1.50", not 1.5
        try:
            node_id = resolve_node(workflow, target)
        except WorkflowError as exc:
            said = (editor_only or {}).get(target)
            raise WorkflowError(f"--set {spec!r}: {said or exc}") from exc
        node = workflow[node_id]
        class_type = str(node.get("class_type"))
        inputs = node.setdefault("inputs", {})
        where = f"--set {spec!r}: node {node_id} ({class_type})"
        if object_info is not None and class_type in object_info:
            spec_list = input_spec(object_info, class_type, name)
            if spec_list is None:
                known = input_names(object_info, class_type)
                hint = close_hint(name, known, "inputs", "its inputs")
                raise WorkflowError(f"{where} has no input {name!r}{hint}")
            given = _as_given(spec_list, value, typed)
            value = coerce_value(spec_list, given, where=f"{where} input {name!r}")
        elif isinstance(inputs.get(name), str):
            value = typed  # a node the server does not describe: text stays text
        elif name not in inputs:
            hint = close_hint(name, list(inputs), "inputs", "its inputs")
            raise WorkflowError(f"{where} has no input {name!r}{hint}")
        if is_link(inputs.get(name)):
            raise WorkflowError(
                f"{where} input {name!r} is linked to node {inputs[name][0]}; cannot set a value"
            )
        applied.append(Override(spec, node_id, name, value, inputs.get(name)))
        inputs[name] = value
    return applied


def _as_given(spec: list[Any], value: Any, typed: str) -> Any:
    """The override's value for an input declared by ``spec``: the text as typed for a text input and
    for a choice spelled so (a file ``1.50``, a mode ``true``), else ``value`` as JSON read it."""
    kind = spec[0]
    if kind == "STRING":
        return typed
    if kind == "INT" and isinstance(value, float) and math.isfinite(value):  # 12345678901234567.0 exactly
        try:
            exact = decimal.Decimal(typed.strip())
        except decimal.InvalidOperation:
            return value
        return int(exact) if exact.is_finite() and exact == exact.to_integral_value() else value
    choices = input_choices(kind, spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
    if choices is not None and value not in choices and typed in choices:
        return typed
    return value


def coerce_value(spec: list[Any], value: Any, *, where: str) -> Any:
    """``value`` converted to the input's type and checked against its range or choices."""
    kind, options = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
    choices = input_choices(kind, options)
    if choices is not None:
        if value not in choices and str(value) in choices:
            value = str(value)
        if value not in choices:
            raise WorkflowError(
                f"{where}: {_shown(value)} is not one of the choices{close_hint(str(value), choices)}"
            )
        return value
    given = value
    if kind == "INT":
        value = _number_of(value, int)  # a numeric string too: ComfyUI converts it the same way
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ):
            raise WorkflowError(f"{where} expects an integer, got {_shown(given)}")
        if isinstance(value, float) and abs(value) > EXACT_FLOAT_INT:
            raise WorkflowError(
                f"{where} expects an integer, got {_shown(given)}: a number this large written with a "
                f"decimal point or exponent is read as the nearest float, {int(value)}; write the integer "
                "digits alone"
            )
        value = int(value)
    elif kind == "FLOAT":
        value = _number_of(value, float)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise WorkflowError(f"{where} expects a finite number, got {_shown(given)}")
        value = float(value)
    elif kind == "BOOLEAN":
        if not isinstance(value, bool):
            raise WorkflowError(f"{where} expects true or false, got {_shown(value)}")
        return value
    elif kind == "STRING":
        return value if isinstance(value, str) else json.dumps(value)
    elif kind in FRONTEND_VALUE_TYPES:
        return value
    else:
        raise WorkflowError(f"{where} takes its {kind} from a link, not a value")
    low, high = options.get("min"), options.get("max")
    if low is not None and value < low:
        raise WorkflowError(f"{where}: {value} is below the minimum {low}")
    if high is not None and value > high:
        raise WorkflowError(f"{where}: {value} is above the maximum {high}")
    return value


def _shown(value: Any) -> str:
    """``value`` as the user wrote it in JSON (``true``, ``1e400`` read as ``Infinity``), a text quoted."""
    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError):
        return repr(value)


def _number_of(value: Any, kind: type[int] | type[float]) -> Any:
    """``value`` as ``kind`` when it is a string that reads as one (``"4"``, ``" 2.5"``), else as it is."""
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            return value
    return value


def find_seeds(workflow: Workflow) -> dict[str, Any]:
    """Every seed input with a literal value, as ``{"11.noise_seed": 42}``."""
    return {
        f"{node_id}.{name}": node.get("inputs", {}).get(name)
        for node_id, node in workflow.items()
        for name in SEED_INPUTS
        if name in node.get("inputs", {}) and not is_link(node["inputs"][name])
    }


def input_choices(kind: Any, options: dict[str, Any]) -> list[Any] | None:
    """The choices of an input declared as ``kind`` with ``options`` (a list, or COMBO's ``options``);
    None for an input that takes any value of its type."""
    if isinstance(kind, list):
        return kind
    if kind == "COMBO":
        return list(options.get("options") or [])
    return None


def is_link(value: Any) -> bool:
    """Whether an input value is a link ``[source node id, output index]`` rather than a literal."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
    )
