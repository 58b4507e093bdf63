"""The nodes of an editor (UI) file that the submitted workflow does not have: primitives, reroutes,
notes, muted and bypassed nodes. ``--set`` aimed at one of them is told where its value goes, not
"no node" (a primitive's value goes to the inputs it feeds; set those).

Example::

    hints = editor_only_hints(ui)
    hints.get("Seed")  # "node 12 (Seed) is a primitive of the editor: its value goes to node 3 …"
"""

from __future__ import annotations

from typing import Any

from runner.graph.subgraph import (
    MODE_BYPASSED,
    MODE_MUTED,
    NOTE_TYPES,
    PROMOTED,
    flatten_subgraphs,
    is_editor_only,
    link_origin,
)

Node = dict[str, Any]


def editor_only_hints(ui: dict[str, Any]) -> dict[str, str]:
    """For each editor-only node of ``ui``, by its id and by its title (a title two of them share is
    left out), what ``--set`` should aim at instead. ``ui`` must have passed
    :func:`~runner.graph.ui_shape.check_ui_shape`."""
    nodes, rows = flatten_subgraphs(ui)
    by_id = {str(node.get("id")): node for node in nodes}
    fed = _inputs_fed_by_primitives(nodes, rows, by_id)
    hints: dict[str, str] = {}
    titles: dict[str, int] = {}
    for node_id, node in by_id.items():
        if not is_editor_only(node):
            continue
        hint = _hint(node_id, node, fed.get(node_id, []))
        hints[node_id] = hint
        title = node.get("title")
        if isinstance(title, str) and title:
            titles[title] = titles.get(title, 0) + 1
            hints.setdefault(title, hint)
    for title, count in titles.items():
        if count > 1 and title not in by_id:
            hints.pop(title, None)
    top_titles = {str(n.get("id")): n.get("title") for n in ui["nodes"] if isinstance(n.get("title"), str)}
    for path, hint in _subgraph_hints(by_id, fed, top_titles).items():
        hints.setdefault(path, hint)
    return hints


def _subgraph_hints(
    by_id: dict[str, Node], fed: dict[str, list[tuple[str, str]]], titles: dict[str, str]
) -> dict[str, str]:
    """For each expanded subgraph instance (an id path ``116``, ``116:5``: no node of its own), where
    its promoted widgets' values go and how its nodes are named."""
    inner: dict[str, list[str]] = {}
    for node_id, node in by_id.items():
        if is_editor_only(node):
            continue
        parts = node_id.split(":")
        for depth in range(1, len(parts)):
            inner.setdefault(":".join(parts[:depth]), []).append(node_id)
    hints: dict[str, str] = {}
    for path, ids in inner.items():
        widgets = [
            f"{node.get(PROMOTED)} goes to "
            + " and ".join(f"{target}.{name}" for target, name in fed.get(node_id, []))
            for node_id, node in by_id.items()
            if node_id.startswith(f"{path}:in") and node.get(PROMOTED) and fed.get(node_id)
        ]
        shown = ", ".join(ids[:4]) + (", …" if len(ids) > 4 else "")
        named = f"node {path} ({titles[path]})" if titles.get(path) else f"node {path}"
        said = f"{named} is a subgraph of the editor file: its nodes have ids {path}:<id> ({shown})"
        if widgets:
            said += ("; its widgets: " if len(widgets) > 1 else "; its widget ") + "; ".join(widgets)
        hints[path] = said + ": set those (--set NODE.input=VALUE)"
    return hints


def _inputs_fed_by_primitives(
    nodes: list[Node], rows: list[list[Any]], by_id: dict[str, Node]
) -> dict[str, list[tuple[str, str]]]:
    """Primitive id → ``(node id, input name)`` of each input it feeds, through reroutes."""
    origins = {int(row[0]): str(row[1]) for row in rows}
    fed: dict[str, list[tuple[str, str]]] = {}
    for node in nodes:
        if is_editor_only(node):
            continue
        for slot in node.get("inputs") or []:
            link = slot.get("link")
            source = link_origin(link, by_id, origins) if link is not None else None
            if source is not None and source.get("type") == "PrimitiveNode":
                fed.setdefault(str(source.get("id")), []).append((str(node.get("id")), str(slot.get("name"))))
    return fed


def _hint(node_id: str, node: Node, fed: list[tuple[str, str]]) -> str:
    kind = str(node.get("type"))
    title = node.get("title")
    named = f"node {node_id} ({title})" if isinstance(title, str) and title else f"node {node_id} ({kind})"
    if node.get("mode") in (MODE_MUTED, MODE_BYPASSED):
        state = "muted" if node.get("mode") == MODE_MUTED else "bypassed"
        return f"{named} is {state} in the editor file, so it is not part of the submitted workflow"
    if kind in NOTE_TYPES:
        return f"{named} is a note: it has no inputs"
    if kind == "Reroute":
        return f"{named} is a reroute of the editor: set the input it leads to or from"
    if not fed:
        return f"{named} is a primitive of the editor that feeds no input"
    where = ", ".join(f"node {target} input {name!r}" for target, name in fed)
    target, name = fed[0]
    return (
        f"{named} is a primitive of the editor: its value goes to {where}; set that instead "
        f"(--set {target}.{name}=VALUE)"
    )
