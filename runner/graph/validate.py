"""A whole API-format workflow checked against ``/object_info`` before it is submitted: unknown nodes,
missing or invalid inputs, bad links, lists that are no links, dependency cycles, model files the
server does not have, and a Free VRAM with nothing to pass on whose output is taken.

Example::

    errors = [p for p in validate_workflow(workflow, object_info) if p.kind == "error"]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runner.errors import WorkflowError
from runner.graph.suggest import MODEL_SUFFIXES, close_hint, missing_type_hint
from runner.graph.workflow import (
    FRONTEND_PREVIEW_WIDGETS,
    FRONTEND_WIDGETS,
    ObjectInfo,
    Workflow,
    coerce_value,
    input_choices,
    input_names,
    input_spec,
    is_link,
    node_title,
)


@dataclass(frozen=True)
class Problem:
    """One validation finding; ``node_id`` and ``input_name`` say where."""

    node_id: str
    class_type: str
    input_name: str | None
    message: str
    kind: str = "error"

    def __str__(self) -> str:
        if not self.node_id:  # the workflow as a whole
            return self.message
        where = f"node {self.node_id} ({self.class_type})"
        return (
            f"{where} input {self.input_name!r}: {self.message}"
            if self.input_name
            else f"{where}: {self.message}"
        )


def validate_workflow(
    workflow: Workflow, object_info: ObjectInfo, cut: Mapping[tuple[str, str], str] | None = None
) -> list[Problem]:
    """Check a workflow before submitting: unknown nodes, missing or invalid inputs, bad links and
    model files the server does not have (values missing from ``/object_info`` choice lists). ``cut``:
    where the links of inputs an editor file's conversion left out came from
    (:func:`runner.graph.convert.convert_ui_workflow`), said with those inputs when they are required."""
    problems: list[Problem] = []
    infos = [object_info.get(str(node.get("class_type"))) or {} for node in workflow.values()]
    if all(infos) and not any(info.get("output_node") for info in infos):  # unknown nodes: said below
        problems.append(
            Problem("", "", None, "no output node (SaveImage, a video saver, …): the server would reject it")
        )
    for node_id, node in workflow.items():
        class_type = str(node.get("class_type"))
        info = object_info.get(class_type)
        if info is None:
            problems.append(unknown_node_problem(node_id, class_type, object_info))
            continue
        inputs = node.get("inputs") or {}
        if not isinstance(inputs, dict):
            problems.append(
                Problem(node_id, class_type, None, "inputs must be an object (name -> value or link)")
            )
            continue
        required = ((info.get("input") or {}).get("required")) or {}
        for name in required:
            if name not in inputs:
                source = (cut or {}).get((node_id, name))
                why = f": its link comes from {source}" if source else ""
                problems.append(Problem(node_id, class_type, name, f"required input is missing{why}"))
        for name, value in inputs.items():
            spec = input_spec(object_info, class_type, name)
            if spec is None and (
                FRONTEND_WIDGETS.get(class_type) == name or name in FRONTEND_PREVIEW_WIDGETS
            ):
                continue  # what the editor submits for its own widget there (convert writes it too)
            if spec is None:
                names = input_names(object_info, class_type)
                inside = [known for known in names if len(known) >= 3 and known in name]  # cfg in cfg_scale
                close = close_hint(name, names, "inputs", listed=()) or (
                    f"; close inputs: {', '.join(inside[:5])}" if inside else ""
                )
                said = f"not an input of this node; ignored{close}"
                problems.append(Problem(node_id, class_type, name, said, "warning"))
            elif is_link(value):
                problems += _check_link(workflow, object_info, node_id, class_type, name, spec, value)
            else:
                problems += _check_value(node_id, class_type, name, spec, value)
    problems += [_cycle_problem(workflow, cycle) for cycle in find_cycles(workflow)]
    problems += _empty_pass_throughs(workflow)
    return problems


# Nodes whose output is what their optional input holds, passed on: with nothing there, a node taking
# that output would get nothing (the node refuses to run so, failing the prompt)
PASS_THROUGH_INPUTS = {"LeanVideoFreeVRAM": "value"}


def _empty_pass_throughs(workflow: Workflow) -> list[Problem]:
    """A pass-through node (:data:`PASS_THROUGH_INPUTS`) with nothing on its input, whose output another
    node takes: refused now, naming the takers, rather than failed by the server (exit 6)."""
    problems = []
    for node_id, node in workflow.items():
        name = PASS_THROUGH_INPUTS.get(str(node.get("class_type")))
        inputs = node.get("inputs")
        if name is None or not isinstance(inputs, dict) or name in inputs:  # null: said as a bad value
            continue
        takers = [
            f"node {other} ({_title(entry)}, input {taken!r})"
            for other, entry in workflow.items()
            if isinstance(entry, dict) and isinstance(entry.get("inputs"), dict)
            for taken, value in entry["inputs"].items()
            if is_link(value) and str(value[0]) == str(node_id)
        ]
        if takers:
            said = (
                f"nothing is connected to it, yet the node's output goes to {', '.join(takers)}, which "
                f"would get nothing: connect what it should pass on to {name!r}, or remove that link"
            )
            problems.append(Problem(node_id, str(node.get("class_type")), name, said))
    return problems


def _title(node: dict[str, Any]) -> str:
    """A node as the editor shows it: its title, else its class."""
    title = node_title(node)
    return title if title and title.strip() else str(node.get("class_type"))


def unknown_node_problem(node_id: str, class_type: str, object_info: ObjectInfo) -> Problem:
    """Node ``node_id`` is of a type the server lacks: what to do (start it with the helper nodes, the
    pack is not loaded) or the closest types it has."""
    hint = missing_type_hint(class_type, object_info)
    return Problem(node_id, class_type, None, f"unknown node type{hint}")


def find_cycles(workflow: Workflow) -> list[list[str]]:
    """Each dependency cycle of ``workflow`` once, as node ids ``[a, b, …, a]`` where each takes an input
    from the next (ComfyUI rejects such a prompt without naming a node)."""
    sources = {node_id: _sources(workflow, node) for node_id, node in workflow.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []
    for start in workflow:
        if start in state:
            continue
        path, stack = [start], [iter(sources[start])]
        state[start] = 1
        while stack:
            step = next(stack[-1], None)
            if step is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(step) == 1:
                cycles.append([*path[path.index(step) :], step])
            elif step not in state:
                state[step] = 1
                path.append(step)
                stack.append(iter(sources[step]))
    return cycles


def _sources(workflow: Workflow, node: Any) -> list[str]:
    inputs = node.get("inputs") if isinstance(node, dict) else None
    if not isinstance(inputs, dict):
        return []
    return sorted({str(v[0]) for v in inputs.values() if is_link(v) and str(v[0]) in workflow})


def _cycle_problem(workflow: Workflow, cycle: list[str]) -> Problem:
    named = " → ".join(f"{node_id} ({workflow[node_id].get('class_type')})" for node_id in cycle[:-1])
    message = (
        f"dependency cycle: node {named} → {cycle[-1]} (each takes an input from the next, so none can "
        "run first): remove one of these links"
    )
    return Problem("", "", None, message)


def _check_link(
    workflow: Workflow,
    object_info: ObjectInfo,
    node_id: str,
    class_type: str,
    name: str,
    spec: list[Any],
    link: list[Any],
) -> list[Problem]:
    source_id, index = str(link[0]), link[1]
    source = workflow.get(source_id)
    if source is None:
        return [
            Problem(node_id, class_type, name, f"is linked to node {source_id}, which is not in the workflow")
        ]
    outputs = (object_info.get(str(source.get("class_type"))) or {}).get("output")
    if outputs is None:
        return []  # the source's own problem is reported on the source
    if not isinstance(index, int) or not 0 <= index < len(outputs):
        return [
            Problem(
                node_id,
                class_type,
                name,
                f"is linked to output {index} of node {source_id}, which has {len(outputs)} output(s)",
            )
        ]
    produced, wanted = outputs[index], spec[0]
    if not types_match(produced, wanted):
        return [
            Problem(
                node_id,
                class_type,
                name,
                f"expects {_type_name(wanted)} but node {source_id} output {index} is {_type_name(produced)}",
            )
        ]
    return []


def types_match(produced: Any, wanted: Any) -> bool:
    """Whether an output of type ``produced`` may feed an input of type ``wanted`` (both as /object_info
    gives them), as the server decides it: the same type, or comma-separated type names in common; a
    dropdown (its list of choices, or ``COMBO``) takes the same dropdown only, never a text. ``*`` (a
    node's any-type) matches everything, as its own comparison makes it."""
    if produced == wanted or "*" in (produced, wanted):
        return True
    if not isinstance(produced, str) or not isinstance(wanted, str):
        return False
    return bool({t.strip() for t in produced.split(",")} & {t.strip() for t in wanted.split(",")})


def _type_name(kind: Any) -> str:
    return f"a dropdown of {len(kind)} choice(s)" if isinstance(kind, list) else str(kind)


def _check_value(node_id: str, class_type: str, name: str, spec: list[Any], value: Any) -> list[Problem]:
    if isinstance(value, list):  # ComfyUI reads every list as a link and would reject it as a bad one
        message = (
            f'{json.dumps(value)[:80]} is neither a value nor a link ["node id", output index] (a list '
            'value goes as {"__value__": [...]})'
        )
        return [Problem(node_id, class_type, name, message)]
    if isinstance(value, dict) and "__value__" in value:  # a list value, as the editor wraps it
        value = value["__value__"]
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    choices = input_choices(spec[0], options)
    if (
        choices is not None
        and value not in choices
        and isinstance(value, str)
        and value.lower().endswith(MODEL_SUFFIXES)
    ):
        return [
            Problem(
                node_id,
                class_type,
                name,
                f"model file {value!r} does not exist on the server{_files_hint(value, choices)}",
            )
        ]
    if choices is not None and not choices and options.get("image_upload"):
        return [
            Problem(
                node_id,
                class_type,
                name,
                f"file {value!r} does not exist in the server's input folder: put it there (ComfyUI's "
                "input/; a server leanvideo started has its own, .workspace/servers/<port>/base/input/), or "
                "upload it in the editor's Load Image node; the shipped workflows' images are in "
                "workflows/input/",
            )
        ]
    try:
        coerce_value(spec, value, where="value")
    except WorkflowError as exc:
        return [Problem(node_id, class_type, name, str(exc).removeprefix("value").lstrip(": "))]
    if name == "filename_prefix" and isinstance(value, str) and leaves_output_folder(value):
        message = (
            f"{value!r} saves outside the server's output folder, which ComfyUI refuses when the node runs: "
            "give a path inside it (video/clip)"
        )
        return [Problem(node_id, class_type, name, message)]
    return []


def _files_hint(value: str, choices: list[Any]) -> str:
    """Close names, else the server's model files of that input (a choice that is no file, VAELoader's
    ``pixel_space`` say, is not listed as one), else that it has none."""
    files = [c for c in choices if isinstance(c, str) and c.lower().endswith(MODEL_SUFFIXES)]
    return close_hint(value, choices, listed=files) or "; the server has no model file for this input"


def leaves_output_folder(prefix: str) -> bool:
    """Whether a saver's ``filename_prefix`` points outside the output folder (``../x``, ``/tmp/x``), as
    ComfyUI's ``folder_paths.get_save_image_path`` decides it when the node runs."""
    root = os.path.abspath(os.path.join(os.sep, "output"))
    folder = os.path.abspath(os.path.join(root, os.path.dirname(os.path.normpath(prefix))))
    try:
        return os.path.commonpath((root, folder)) != root
    except ValueError:  # another drive
        return True
