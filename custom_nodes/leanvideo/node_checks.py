"""Checks of a node's dropdown values, which ComfyUI v0.3.75 makes for V1 dropdowns only: a V3 node's
value that is not one of its choices (a hand-edited or outdated workflow) would otherwise fail in
``execute`` in Python's words (``'x' is not a valid FreeMode``), after the nodes before it ran.

A node checks one input in ``validate_inputs`` (refused at ``/prompt``, as a stock dropdown is): ComfyUI
repeats a failed check's message once for every input that ``validate_inputs`` takes, so a node with
several dropdowns checks the others first thing in ``execute``. The INT8 loaders check those of every
INT8 loader the prompt runs (``require_prompt_choices``): a workflow's second loader with a bad value
stops the prompt before the first one spends minutes loading a large checkpoint.

Example::

    def validate_inputs(cls, mode: str | None = None) -> bool | str:
        return choice_problem(cls, mode=mode)

    def execute(cls, ckpt_name, compute_dtype, path):
        require_choices(cls, compute_dtype=compute_dtype, path=path)
        require_prompt_choices(cls.hidden.prompt, LOADERS)   # LOADERS: {class: (file input, folder)}
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import folder_paths
from comfy_api.latest import io

__all__ = [
    "choice_problem",
    "file_listed",
    "require_choices",
    "require_linked_input",
    "require_prompt_choices",
]


def file_listed(folder: str, name: str | None) -> bool | str:
    """``True`` when ``name`` is in ``models/<folder>`` (or comes from a link, ``None`` here), else why."""
    if name is None:
        return True
    if not isinstance(name, str):  # a hand-edited API file: said in words, not as a TypeError
        return _not_a_name(name, folder)
    listed = folder_paths.get_filename_list(folder)
    if name in listed:
        return True
    where = f"models/{folder} or another folder ComfyUI reads {folder} from"
    if not listed:
        return f"{name!r} is not in {where} (they hold no model file)"
    # compared without the suffix every model file shares: with it, "nope.safetensors" was close to all
    stems: dict[str, list[str]] = {}
    for item in listed:
        stems.setdefault(_stem(item), []).append(item)
    close = [
        item
        for stem in difflib.get_close_matches(_stem(name), list(stems), n=5, cutoff=0.5)
        for item in stems[stem]
    ]
    close += [item for item in listed if item.lower() == name.lower() and item not in close]
    if close:
        return f"{name!r} is not in {where}; close names: {', '.join(close)}"
    shown = ", ".join(listed[:8]) + (f", … ({len(listed)} in all)" if len(listed) > 8 else "")
    return f"{name!r} is not in {where} (there: {shown})"


def _stem(name: str) -> str:
    """``name`` in lower case without its file suffix (``.safetensors``, ``.gguf``, …)."""
    lowered = name.lower()
    return lowered.rsplit(".", 1)[0] if "." in lowered.rsplit("/", 1)[-1] else lowered


def choice_problem(node: type[io.ComfyNode], *, named: bool = True, **values: Any) -> bool | str:
    """``True`` when each of ``values`` (input name → value; ``None``: linked or left out) is one of its
    dropdown's choices in ``node``'s schema, else what is wrong with its choices, and the input's name
    when ``named`` (ComfyUI puts it before what ``validate_inputs`` says)."""
    combos = {item.id: item for item in node.define_schema().inputs if isinstance(item, io.Combo.Input)}
    for name, value in values.items():
        choices = list(combos[name].options or [])
        if value is not None and value not in choices:
            return f"{name + ': ' if named else ''}{value!r} is not one of {choices}"
    return True


def require_choices(node: type[io.ComfyNode], **values: Any) -> None:
    """Raise ``ValueError`` naming the input and its choices when a value is not one of them."""
    problem = choice_problem(node, **values)
    if problem is not True:
        raise ValueError(f"{node.define_schema().display_name}: {problem}")


def require_prompt_choices(
    prompt: Mapping[str, Any] | None, loaders: Mapping[type[io.ComfyNode], tuple[str, str]]
) -> None:
    """Raise ``ValueError`` naming the node, the input and what is wrong when a node of ``prompt`` (API
    format, as ComfyUI runs it) whose class is one of ``loaders`` (class → its file input and models
    folder) has a dropdown value that is not one of its choices, or a file that is no file name. Only
    nodes that feed an output node are checked: ComfyUI runs nothing else."""
    if not prompt:
        return
    by_type = {node.define_schema().node_id: node for node in loaders}
    for node_id in sorted(_nodes_that_run(prompt), key=str):
        entry = prompt[node_id]
        node = by_type.get(entry.get("class_type"))
        if node is None:
            continue
        file_input, folder = loaders[node]
        schema = node.define_schema()
        inputs = entry.get("inputs") or {}
        literal = {k: v for k, v in inputs.items() if not isinstance(v, list)}  # a list is a link
        problem: bool | str
        if file_input in literal and not isinstance(literal[file_input], str):  # names: checked at /prompt
            problem = f"{file_input}: {_not_a_name(literal[file_input], folder)}"
        else:
            combos = {item.id for item in schema.inputs if isinstance(item, io.Combo.Input)} - {file_input}
            problem = choice_problem(node, **{k: v for k, v in literal.items() if k in combos})
        if problem is not True:
            raise ValueError(f"node {node_id} ({schema.display_name}): {problem}; nothing was loaded")


def require_linked_input(prompt: Mapping[str, Any] | None, node_id: str | None, name: str, what: str) -> None:
    """Raise ``ValueError`` when node ``node_id`` of ``prompt`` has nothing on its optional input
    ``name`` while another node takes its output: that node would get ``None`` and fail in its own
    words (``'NoneType' object is not subscriptable``), naming itself instead of this one (``what``)."""
    if not isinstance(prompt, Mapping) or node_id is None or not isinstance(prompt.get(node_id), dict):
        return
    if (prompt[node_id].get("inputs") or {}).get(name) is not None:
        return
    takers = [
        f"node {other} ({_title(entry)}, input {input_name!r})"
        for other, entry in prompt.items()
        if isinstance(entry, dict)
        for input_name, value in (entry.get("inputs") or {}).items()
        if isinstance(value, list) and len(value) == 2 and str(value[0]) == str(node_id)
    ]
    if takers:
        raise ValueError(
            f"{what}: nothing is connected to its {name!r} input, yet its output goes to "
            f"{', '.join(takers)}, which would get nothing: connect what it should pass on to {name!r}, or "
            "remove that link"
        )


def _title(entry: Mapping[str, Any]) -> str:
    """A prompt node as the editor shows it: its title, else its class."""
    meta = entry.get("_meta")
    title = meta.get("title") if isinstance(meta, Mapping) else None
    return str(title) if isinstance(title, str) and title.strip() else str(entry.get("class_type"))


def _not_a_name(value: Any, folder: str) -> str:
    given = "no file is chosen (null)" if value is None else f"{value!r} is not a file name"
    return f"{given}: give one of the files in models/{folder}"


def _nodes_that_run(prompt: Mapping[str, Any]) -> set[str]:
    """The ids of the nodes that feed an output node (those included), through links ``[id, slot]``;
    every node when the prompt has no output node ComfyUI knows."""
    import nodes as comfy_nodes  # ComfyUI's registry of node classes

    def is_output(entry: Any) -> bool:
        kind = comfy_nodes.NODE_CLASS_MAPPINGS.get(
            entry.get("class_type") if isinstance(entry, dict) else None
        )
        return bool(getattr(kind, "OUTPUT_NODE", False))

    todo = [node_id for node_id, entry in prompt.items() if is_output(entry)]
    if not todo:
        return {node_id for node_id, entry in prompt.items() if isinstance(entry, dict)}
    seen: set[str] = set()
    while todo:
        node_id = todo.pop()
        if node_id in seen or not isinstance(prompt.get(node_id), dict):
            continue
        seen.add(node_id)
        for value in (prompt[node_id].get("inputs") or {}).values():
            if isinstance(value, list) and len(value) == 2 and str(value[0]) in prompt:
                todo.append(str(value[0]))
    return seen
