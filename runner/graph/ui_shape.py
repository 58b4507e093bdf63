"""Check the shape of an editor (UI) workflow before it is converted: a damaged file gets an error that
names the node or link at fault, never a traceback from deep inside the converter.

What is checked, in the graph and in every subgraph definition (``definitions.subgraphs``):

- ``nodes`` is a list of objects, each with an ``id`` (an integer, or a text as in subgraphs), a
  ``type`` that is a text, and ``widgets_values`` that are a list, an object or null;
- a node's ``inputs`` and ``outputs`` are lists of objects, and an input's ``link`` is a link id or null;
- ``links`` is a list of links, each ``[id, origin id, origin slot, target id, target slot, type]`` (the
  type may be left out) or an object with those keys; ids and slots are integers.

Example::

    check_ui_shape(json.loads(Path("ui.json").read_text()))  # raises WorkflowError naming the culprit
"""

from __future__ import annotations

import json
import re
from typing import Any

from runner.errors import WorkflowError

LINK_FIELDS = ("id", "origin_id", "origin_slot", "target_id", "target_slot")
SAVE_AGAIN = "the file is damaged; save it again from the editor"
INTEGER = re.compile(r"\s*-?\d+\s*")


def check_ui_shape(ui: dict[str, Any]) -> None:
    """Raise :class:`WorkflowError` at the first node or link of ``ui`` that is not shaped as the editor
    writes it; see the module docstring."""
    _check_graph(ui, "")
    definitions = ui.get("definitions")
    if definitions is None:
        return
    if not isinstance(definitions, dict):
        raise WorkflowError(f"'definitions' is {json_kind(definitions)}, not an object: {SAVE_AGAIN}")
    subgraphs = definitions.get("subgraphs")
    _check_objects(subgraphs, "subgraphs", "'definitions'")
    for index, subgraph in enumerate(subgraphs or []):
        where = f" of subgraph {subgraph.get('id', f'#{index + 1}')}"
        _check_graph(subgraph, where, inner=True)
        for key in ("inputs", "outputs"):
            _check_objects(subgraph.get(key), key, where.removeprefix(" of "))


def _check_graph(graph: dict[str, Any], where: str, inner: bool = False) -> None:
    nodes = graph.get("nodes")
    if nodes is None and inner:
        nodes = []
    if not isinstance(nodes, list):
        raise WorkflowError(f"'nodes'{where} is {json_kind(nodes)}, not a list of nodes: {SAVE_AGAIN}")
    for index, node in enumerate(nodes):
        _check_node(index, node, where)
    links = graph.get("links")
    if links is None:  # a graph without links: then no input may name one
        for node in nodes:
            for number, slot in enumerate(node.get("inputs") or []):
                if slot.get("link") is not None:
                    name = repr(slot["name"]) if slot.get("name") else f"#{number + 1}"
                    state = "is null" if "links" in graph else "is missing"
                    raise WorkflowError(
                        f"'links'{where} {state}, yet node {node['id']} ({node.get('type')}) input {name} "
                        f"takes link {slot['link']}: {SAVE_AGAIN}"
                    )
        links = []
    if not isinstance(links, list):
        raise WorkflowError(f"'links'{where} is {json_kind(links)}, not a list of links: {SAVE_AGAIN}")
    seen: set[int] = set()
    for index, row in enumerate(links):
        link_id = _check_link(index, row, where)
        if link_id in seen:  # one of the two would be dropped, and its input said to be missing
            raise WorkflowError(f"link {link_id}{where} is in 'links' twice: {SAVE_AGAIN}")
        seen.add(link_id)


def _check_node(index: int, node: Any, where: str) -> None:
    if not isinstance(node, dict):
        raise WorkflowError(
            f"node #{index + 1} in 'nodes'{where} is {json_kind(node)}, not an object: {SAVE_AGAIN}"
        )
    if not _is_id(node.get("id")):
        shown = (
            "has no id"
            if "id" not in node
            else f"has the id {_shown(node['id'])}, {_not_integer(node['id'])}"
        )
        raise WorkflowError(f"node #{index + 1} ({node.get('type')}){where} {shown}: {SAVE_AGAIN}")
    if not isinstance(node.get("type"), str) or not node["type"]:
        said = (
            "has no type"
            if "type" not in node
            else f"has the type {_shown(node['type'])}, not a node type name"
        )
        raise WorkflowError(f"node {node['id']}{where} {said}: {SAVE_AGAIN}")
    name = f"node {node['id']} ({node.get('type')}){where}"
    values = node.get("widgets_values")
    if values is not None and not isinstance(values, (list, dict)):
        raise WorkflowError(
            f"the widgets_values of {name} are {json_kind(values)}, not a list or an object: {SAVE_AGAIN}"
        )
    for key in ("inputs", "outputs"):
        if key in node and node[key] is None:  # the editor writes a list, or leaves the key out
            raise WorkflowError(f"the {key} of {name} are null, not a list: {SAVE_AGAIN}")
        _check_objects(node.get(key), key, name)
    for slot in node.get("inputs") or []:
        link = slot.get("link")
        if link is not None and not _is_integer(link):
            raise WorkflowError(
                f"{name} input {slot.get('name')!r}: link {_shown(link)} is not a link id: {SAVE_AGAIN}"
            )


def _check_objects(slots: Any, key: str, owner: str) -> None:
    """``slots`` (the ``key`` of ``owner``: its inputs, outputs or subgraphs) is null or a list of
    objects."""
    if slots is None:
        return
    if not isinstance(slots, list):
        raise WorkflowError(f"the {key} of {owner} are {json_kind(slots)}, not a list: {SAVE_AGAIN}")
    for number, slot in enumerate(slots):
        if not isinstance(slot, dict):
            raise WorkflowError(
                f"{key[:-1]} #{number + 1} of {owner} is {json_kind(slot)}, not an object: {SAVE_AGAIN}"
            )


def _check_link(index: int, row: Any, where: str) -> int:
    """Check one link; its id."""
    name = f"entry {index + 1} of 'links'{where}"  # its place, not its id: ids need not count from 1
    if isinstance(row, dict):
        missing = [key for key in LINK_FIELDS if key not in row]
        if missing:
            raise WorkflowError(f"{name} ({_shown(row)}) has no {', '.join(missing)}: {SAVE_AGAIN}")
        values = [row[key] for key in LINK_FIELDS]
    elif isinstance(row, list):
        if len(row) < len(LINK_FIELDS):
            raise WorkflowError(
                f"{name} is {_shown(row)}: a link is [id, origin node, origin slot, target node, target "
                f"slot, type]: {SAVE_AGAIN}"
            )
        values = row[: len(LINK_FIELDS)]
    else:
        raise WorkflowError(f"{name} is {json_kind(row)}, not a link: {SAVE_AGAIN}")
    for key, value in zip(LINK_FIELDS, values, strict=True):
        good = _is_id(value) if key in ("origin_id", "target_id") else _is_integer(value)
        if not good:
            link = f"link {values[0]}" if _is_integer(values[0]) else name
            raise WorkflowError(
                f"{link}{where}: its {key} is {_shown(value)}, {_not_integer(value)}: {SAVE_AGAIN}"
            )
    return int(values[0])


def _not_integer(value: Any) -> str:
    """How a value that should be an id or slot is said to be wrong: 3.5 is a number, yet no integer."""
    return "not an integer" if isinstance(value, float) else "not a number"


def _is_integer(value: Any) -> bool:
    """An integer as JSON gives one, or as text (``"12"``, which the converter reads the same way)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and INTEGER.fullmatch(value) is not None


def _is_id(value: Any) -> bool:
    """A node id: an integer, or a non-empty text (subgraphs' inner ids are texts)."""
    return _is_integer(value) or (isinstance(value, str) and bool(value.strip()))


JSON_KINDS = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a text",
    dict: "an object",
    list: "a list",
}


def json_kind(value: Any) -> str:
    """``value`` as JSON names its kind, with the value itself: ``a text ("oops")``."""
    return "null" if value is None else f"{JSON_KINDS.get(type(value), 'a value')} ({_shown(value)})"


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
