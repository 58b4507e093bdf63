"""Flatten subgraphs into one graph, the way the v0.3.75 frontend executes them.

A subgraph instance (a node whose ``type`` is the id of one of ``definitions.subgraphs``) is replaced
by its inner nodes, each under the id ``"<instance id>:<inner id>"`` (nested ones get a longer path,
``"75:12:3"``). Its boundaries become plain reroutes, so :mod:`runner.graph.convert` can follow links across
them as it follows any other:

- subgraph input ``k`` becomes a ``Reroute`` fed by the link into the instance's input ``k``; when that
  input is not linked, a ``PrimitiveNode`` holding the instance's promoted widget value (its
  ``widgets_values`` are positional over the subgraph inputs of a widget type);
- subgraph output ``k`` becomes a ``Reroute`` fed by the inner link into the output node, and links from
  the instance's output ``k`` start there.

Muted and bypassed instances are left as they are: the converter drops or bypasses them like any node.

Example::

    nodes, links = flatten_subgraphs(ui)
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from runner.errors import WorkflowError
from runner.graph.ui_shape import SAVE_AGAIN

SUBGRAPH_INPUT_NODE = -10
SUBGRAPH_OUTPUT_NODE = -20
MODE_MUTED = 2  # a node's ``mode`` in UI workflows: muted (never runs), bypassed (inputs pass through)
MODE_BYPASSED = 4
# Input types the pinned frontend draws as widgets (AUDIO_RECORD: the Comfy.RecordAudio extension's);
# they take a position in ``widgets_values``. runner.graph.convert reads node widgets with this table too.
WIDGET_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "AUDIO_RECORD"})
NOTE_TYPES = frozenset({"Note", "MarkdownNote"})
PROMOTED = "promoted_widget"  # on the primitive standing for an instance's widget value: the widget's name
MAX_DEPTH = 16

Node = dict[str, Any]
LinkRow = list[Any]


def is_editor_only(node: Node) -> bool:
    """Whether a UI node never reaches the API workflow as a node of its own: a note, a reroute or a
    primitive (its value is its targets'), or a muted or bypassed node."""
    kind = node.get("type")
    return (
        kind in NOTE_TYPES
        or kind in ("Reroute", "PrimitiveNode")
        or node.get("mode") in (MODE_MUTED, MODE_BYPASSED)
    )


def link_rows(rows: list[Any]) -> list[LinkRow]:
    """Links as ``[id, origin id, origin slot, target id, target slot, type]`` (dict rows too)."""
    keys = ("id", "origin_id", "origin_slot", "target_id", "target_slot", "type")
    return [[row.get(key) for key in keys] if isinstance(row, dict) else list(row) for row in rows]


def nodes_by_id(nodes: list[Node], where: str = "") -> dict[str, Node]:
    """``nodes`` by id; two with one id (a damaged file: one would silently replace the other) is a
    :class:`WorkflowError` naming them (``where``: the subgraph they are in)."""
    found: dict[str, Node] = {}
    for node in nodes:
        node_id = str(node.get("id"))
        if node_id in found:
            raise WorkflowError(
                f"two nodes{where} have the id {node_id} ({found[node_id].get('type')} and "
                f"{node.get('type')}): the file is damaged; save it again from the editor"
            )
        found[node_id] = node
    return found


def flatten_subgraphs(ui: dict[str, Any]) -> tuple[list[Node], list[LinkRow]]:
    """The nodes and links of ``ui`` with every active subgraph instance expanded; see the module
    docstring. Without subgraphs the graph comes back as it is."""
    definitions = {str(sub.get("id")): sub for sub in (ui.get("definitions") or {}).get("subgraphs") or []}
    rows = link_rows(ui.get("links") or [])
    if not definitions:
        return list(nodes_by_id(ui["nodes"]).values()), rows
    flattener = _Flattener(definitions, start=max((int(r[0]) for r in rows), default=0) + 1)
    flattener.add_scope(ui["nodes"], rows, prefix="", boundary=None, depth=0)
    return flattener.nodes, flattener.links


class _Flattener:
    def __init__(self, definitions: dict[str, Any], start: int):
        self.definitions = definitions
        self.ids = itertools.count(start)
        self.nodes: list[Node] = []
        self.links: list[LinkRow] = []

    def add_scope(
        self,
        nodes: list[Node],
        rows: list[LinkRow],
        prefix: str,
        boundary: tuple[list[str], list[int | None]] | None,
        depth: int,
        inside: tuple[str, ...] = (),
    ) -> None:
        """Add one graph's nodes under ``prefix``. ``boundary`` gives, for an inner graph, the ids of
        the reroutes standing for its inputs and the new ids of the links into its outputs (filled in);
        ``inside``: the subgraphs being expanded, outermost first (one of them again is a cycle)."""
        renamed = {int(row[0]): next(self.ids) for row in rows}
        by_id = nodes_by_id(nodes, f" of subgraph {prefix.rstrip(':')}" if prefix else "")
        for node_id, node in by_id.items():
            kind = str(node.get("type"))
            if kind in inside and node.get("mode") not in (MODE_MUTED, MODE_BYPASSED):
                loop = [self._name(sub) for sub in inside[inside.index(kind) :]]
                others = " -> ".join(repr(name) for name in loop[1:])
                held = f"{others}, which holds it" if others else "itself"
                raise WorkflowError(
                    f"subgraph {loop[0]!r} contains {held} (node {prefix}{node_id}, in subgraph "
                    f"{loop[-1]!r}): the editor refuses it too (circular reference); take that node out"
                )
        expanded = {
            node_id: f"{prefix}{node_id}"
            for node_id, node in by_id.items()
            if str(node.get("type")) in self.definitions
            and node.get("mode") not in (MODE_MUTED, MODE_BYPASSED)
            and depth < MAX_DEPTH
        }
        for row in rows:
            origin, slot = str(row[1]).strip(), int(row[2])
            if boundary is not None and origin == str(SUBGRAPH_INPUT_NODE):
                if not 0 <= slot < len(boundary[0]):
                    raise WorkflowError(
                        f"link {row[0]} of subgraph {prefix.rstrip(':')} comes from its input #{slot + 1}, "
                        f"and it has {len(boundary[0])} input(s): {SAVE_AGAIN}"
                    )
                origin, slot = boundary[0][slot], 0
            elif origin in expanded:
                origin, slot = f"{expanded[origin]}:out{slot}", 0
            else:
                origin = f"{prefix}{origin}"
            self.links.append([renamed[int(row[0])], origin, slot, None, None, row[5]])
            if boundary is not None and str(row[3]).strip() == str(SUBGRAPH_OUTPUT_NODE):
                outputs = boundary[1]
                if int(row[4]) < len(outputs):
                    outputs[int(row[4])] = renamed[int(row[0])]
        for node_id, node in by_id.items():
            node = copy.deepcopy(node)
            node["id"] = f"{prefix}{node_id}"
            for slot_info in node.get("inputs") or []:
                if slot_info.get("link") is not None:
                    slot_info["link"] = renamed.get(int(slot_info["link"]))
            if node_id in expanded:
                self._expand(node, expanded[node_id], depth, inside)
            else:
                self.nodes.append(node)

    def _name(self, subgraph_id: str) -> str:
        return str(self.definitions[subgraph_id].get("name") or subgraph_id)

    def _expand(self, instance: Node, path: str, depth: int, inside: tuple[str, ...]) -> None:
        definition = self.definitions[str(instance["type"])]
        inputs = definition.get("inputs") or []
        linked = {str(i.get("name")): i.get("link") for i in instance.get("inputs") or []}
        widgets = _promoted_values(instance, inputs)
        input_ids: list[str] = []
        for index, spec in enumerate(inputs):
            name = str(spec.get("name"))
            node_id = f"{path}:in{index}"
            input_ids.append(node_id)
            if linked.get(name) is None and name in widgets:
                primitive = {"id": node_id, "type": "PrimitiveNode", "widgets_values": [widgets[name]]}
                self.nodes.append(primitive | {PROMOTED: name})
            else:
                link = linked.get(name)
                self.nodes.append({"id": node_id, "type": "Reroute", "inputs": [{"link": link}]})
        outputs: list[int | None] = [None] * len(definition.get("outputs") or [])
        inner_rows = link_rows(definition.get("links") or [])
        scope = (definition.get("nodes") or [], inner_rows, f"{path}:", (input_ids, outputs), depth + 1)
        self.add_scope(*scope, inside=(*inside, str(instance["type"])))
        for index, link in enumerate(outputs):
            self.nodes.append({"id": f"{path}:out{index}", "type": "Reroute", "inputs": [{"link": link}]})


def _promoted_values(instance: Node, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    values = instance.get("widgets_values")
    if isinstance(values, dict):
        return dict(values)
    names = [str(spec.get("name")) for spec in inputs if str(spec.get("type")) in WIDGET_TYPES]
    return dict(zip(names, list(values or []), strict=False))


def link_origin(link: Any, nodes: dict[str, Node], origins: dict[int, str]) -> Node | None:
    """The node a link's value comes from, followed back through reroutes (a subgraph's boundary is
    one): a primitive or any other node; ``None`` when the chain ends nowhere. ``origins``: link id →
    its origin node's id, from the flattened links."""
    for _ in range(MAX_DEPTH * 4):  # a loop of reroutes in a damaged file ends here
        origin = origins.get(int(link))
        node = nodes.get(origin) if origin is not None else None
        if node is None or node.get("type") != "Reroute":
            return node
        link = next((slot.get("link") for slot in node.get("inputs") or []), None)
        if link is None:
            return None
    return None
