"""Checks of a node's dropdown values, which ComfyUI v0.3.75 makes for V1 dropdowns only: a V3 node's
value that is not one of its choices (a hand-edited or outdated workflow) would otherwise fail in
``execute`` in Python's words (``'x' is not a valid FreeMode``), after the nodes before it ran.

A node checks one input in ``validate_inputs`` (refused at ``/prompt``, as a stock dropdown is): ComfyUI
repeats a failed check's message once for every input that ``validate_inputs`` takes, so a node with
several dropdowns checks the others first thing in ``execute`` (the loaders: nothing runs before them).

Example::

    def validate_inputs(cls, mode: str | None = None) -> bool | str:
        return choice_problem(cls, mode=mode)

    def execute(cls, ckpt_name, compute_dtype, path):
        require_choices(cls, compute_dtype=compute_dtype, path=path)
"""

from __future__ import annotations

import difflib
from typing import Any

import folder_paths
from comfy_api.latest import io

__all__ = ["choice_problem", "file_listed", "require_choices"]


def file_listed(folder: str, name: str | None) -> bool | str:
    """``True`` when ``name`` is in ``models/<folder>`` (or comes from a link, ``None`` here), else why."""
    if name is None:
        return True
    listed = folder_paths.get_filename_list(folder)
    if name in listed:
        return True
    where = f"models/{folder} or another folder ComfyUI reads {folder} from"
    if not listed:
        return f"{name!r} is not in {where} (they hold no model file)"
    close = difflib.get_close_matches(name, listed, n=5, cutoff=0.5)
    close += [item for item in listed if item.lower() == name.lower() and item not in close]
    if close:
        return f"{name!r} is not in {where}; close names: {', '.join(close)}"
    shown = ", ".join(listed[:8]) + (f", … ({len(listed)} in all)" if len(listed) > 8 else "")
    return f"{name!r} is not in {where} (there: {shown})"


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
