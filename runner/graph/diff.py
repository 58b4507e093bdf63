"""Semantic differences between two API-format workflows: what a reviewer of a workflow change wants.

Not a text diff: key order, whitespace and ``_meta`` layout do not matter. Each :class:`Change` says
*what* changed on *which* node — a node added or removed, its class replaced, its title changed, an
input added, removed or set to another value, or a link rewired to another node's output.

Example::

    changes = diff_workflows(load_workflow(old_path), load_workflow(new_path))
    for change in changes:
        print(change)            # node 11 (SamplerCustom) input 'noise_seed': 42 -> 7
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runner.graph.subgraph import MODE_BYPASSED, MODE_MUTED
from runner.graph.workflow import Workflow, is_link, node_title


@dataclass(frozen=True)
class Change:
    """One semantic difference between workflow A and workflow B."""

    kind: str  # node_added | node_removed | renumbered | class_changed | title_changed | input_added
    #          | input_removed | value_changed | link_rewired | link_replaced | node_muted
    #          | node_bypassed | node_unmuted | node_unbypassed | mode_changed (editor files' modes:
    #          mark_modes)
    node_id: str
    class_type: str
    input_name: str | None = None
    old: Any = None
    new: Any = None

    def __str__(self) -> str:
        where = f"node {self.node_id} ({self.class_type})"
        if self.input_name is not None:
            where += f" input {self.input_name!r}"
        words = {
            "renumbered": f"was node {self.old}",
            "node_added": "added",
            "node_removed": "removed",
            "input_added": f"added = {_show(self.new)}",
            "input_removed": f"removed (was {_show(self.old)})",
            "title_changed": f"title {_show_change(self.old, self.new)}",
            "class_changed": f"class {_show(self.old)} -> {_show(self.new)}",
            "mode_changed": f"{self.old} -> {self.new}",
        }
        said = _mode_said(self.kind, self.old) or words.get(self.kind, _show_change(self.old, self.new))
        return f"{where}: {said}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node_id": self.node_id,
            "class_type": self.class_type,
            "input": self.input_name,
            "old": self.old,
            "new": self.new,
        }


MODE_KINDS = ("node_muted", "node_bypassed", "node_unmuted", "node_unbypassed")


def _mode_said(kind: str, instance: Any) -> str | None:
    """A node muted or bypassed, or no longer, itself or inside the subgraph node ``instance``."""
    if kind not in MODE_KINDS:
        return None
    word, again = kind.removeprefix("node_").removeprefix("un"), kind.startswith("node_un")
    if instance is not None:
        is_now = f"is no longer {word}" if again else f"is {word}"
        return f"{'runs again' if again else 'not run'}: its subgraph node {instance} {is_now}"
    if again:
        return f"no longer {word}"
    return "muted (mode 2): not run" if word == "muted" else "bypassed (mode 4): its inputs pass through"


def _show(value: Any) -> str:
    if is_link(value):
        return f"link from node {value[0]} output {value[1]}"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def _show_change(old: Any, new: Any) -> str:
    """``old -> new``; two texts too long to show whole are shown where they differ, each run of changed
    words with a few words around it (both were cut at the same place, so a prompt changed in its last
    words read unchanged), up to :data:`HUNKS` runs."""
    if not (isinstance(old, str) and isinstance(new, str)) or max(len(old), len(new)) <= SHOWN - 2:
        return f"{_show(old)} -> {_show(new)}"
    a, b = TOKEN.findall(old), TOKEN.findall(new)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    groups = list(matcher.get_grouped_opcodes(2 * WORDS))  # changes with their context, near ones merged
    shown = [
        f"{_excerpt(a, group[0][1], group[-1][2])} -> {_excerpt(b, group[0][3], group[-1][4])}"
        for group in groups[:HUNKS]
    ]
    more = f" (and {len(groups) - HUNKS} more change(s))" if len(groups) > HUNKS else ""
    return "; ".join(shown) + more


SHOWN = 80  # characters of a value shown
HUNKS = 3  # runs of changed words shown of two long texts
WORDS = 3  # words of context either side of one (counted as tokens: a word and the space after it)
# What two long texts are compared in: words of up to 12 letters (a longer run, as text in a script
# without spaces, in pieces of 12), runs of spaces, and each other character (tags joined by commas)
TOKEN = re.compile(r"[^\W_]{1,12}|\s+|.", re.DOTALL)


def _excerpt(tokens: list[str], first: int, last: int) -> str:
    """Tokens ``first:last``, quoted, without spaces at either end, ``…`` where the text goes on; an
    excerpt over twice :data:`SHOWN` characters is cut in its middle."""
    while first < last - 1 and tokens[first].isspace():
        first += 1
    while last - 1 > first and tokens[last - 1].isspace():
        last -= 1
    text = "".join(tokens[first:last])
    if len(text) > 2 * SHOWN:
        text = f"{text[:SHOWN]}…{text[-SHOWN:]}"
    body = json.dumps(text, ensure_ascii=False)[1:-1]
    return f'"{"…" if first else ""}{body}{"…" if last < len(tokens) else ""}"'


def _sort_key(node_id: str) -> tuple[int, ...] | tuple[float, str]:
    parts = node_id.replace(":", ".").split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (float("inf"), node_id)


def diff_workflows(
    a: Workflow, b: Workflow, modes: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})
) -> list[Change]:
    """Every semantic difference from ``a`` to ``b``, in node-id order. Nodes are paired by what they are
    (:func:`match_nodes`), so a renumbered graph shows as ``renumbered`` nodes, not as every node
    replaced; links are compared through that pairing. ``modes``: ``{node id: (type, mode)}`` of each
    side's editor file (empty for an API file): a node its conversion left out (muted, bypassed, or
    inside such a subgraph node) is said so (:func:`mark_modes`), and the other side's node under its
    id is that node, not to be paired with another (an editor file keeps its ids)."""
    a_modes, b_modes = modes
    pairs = match_nodes(
        {n: node for n, node in a.items() if not _hidden(n, b_modes)},
        {n: node for n, node in b.items() if not _hidden(n, a_modes)},
    )
    changes: list[Change] = []
    for old, new in sorted(pairs.items(), key=lambda pair: _sort_key(pair[1])):
        if old != new:
            changes.append(Change("renumbered", new, str(b[new]["class_type"]), old=old, new=new))
        changes.extend(_diff_node(new, _relinked(a[old], pairs, b), b[new]))
    changes += [Change("node_added", n, str(b[n]["class_type"])) for n in b if n not in pairs.values()]
    changes += [Change("node_removed", n, str(a[n]["class_type"])) for n in a if n not in pairs]
    return mark_modes(changes, a_modes, b_modes)  # sorted by node id there


def match_nodes(a: Workflow, b: Workflow) -> dict[str, str]:
    """``{id in a: id in b}`` for the nodes that are the same node, paired in passes, each over the nodes
    still unpaired: the same id, class and title; the same class and title where that is unique on both
    sides; the same class, title and input values (links aside) where unique on both sides; the same
    class, title and uses (the class, title and input each output feeds) where unique; the same id and
    class; the same class where it is unique on both sides; a class with as many
    nodes on both sides, in id order; last, the same id with another class (a class change). Titles come
    first: when a node is inserted, the ids after it move by one and land on another node of the class."""
    pairs: dict[str, str] = {}
    uses = {id(a): _uses(a), id(b): _uses(b)}  # the inputs each node's outputs feed, on its own side
    Key = Callable[[Workflow, str], object]  # what a node is, in its workflow

    def same_id(key: Key) -> None:
        pairs.update(
            {
                n: n
                for n in a
                if n in b and n not in pairs and n not in pairs.values() and key(a, n) == key(b, n)
            }
        )

    def unique(key: Key) -> None:
        left = {n: key(a, n) for n in a if n not in pairs}
        right: dict[object, list[str]] = {}
        for n in b:
            if n not in pairs.values():
                right.setdefault(key(b, n), []).append(n)
        counts = Counter(left.values())
        for old, value in left.items():
            mates = right.get(value, [])
            if len(mates) == 1 and counts[value] == 1:
                pairs[old] = mates[0]

    def class_and_title(workflow: Workflow, n: str) -> tuple[object, ...]:
        return (workflow[n]["class_type"], node_title(workflow[n]))

    def class_title_values(workflow: Workflow, n: str) -> object:  # two prompts of one default title
        inputs = workflow[n].get("inputs") or {}
        values = {name: value for name, value in inputs.items() if not is_link(value)}
        return (*class_and_title(workflow, n), json.dumps(values, sort_keys=True))

    def class_title_uses(workflow: Workflow, n: str) -> object:  # both edited: where each goes tells them
        return (*class_and_title(workflow, n), tuple(sorted(uses[id(workflow)].get(n, []))))

    def class_only(workflow: Workflow, n: str) -> object:
        return workflow[n]["class_type"]

    same_id(class_and_title)
    unique(class_and_title)
    unique(class_title_values)
    unique(class_title_uses)
    same_id(class_only)
    unique(class_only)
    for kind in {a[n]["class_type"] for n in a if n not in pairs}:  # as many on both sides: in id order
        olds = sorted((n for n in a if n not in pairs and a[n]["class_type"] == kind), key=_sort_key)
        news = sorted((n for n in b if n not in pairs.values() and b[n]["class_type"] == kind), key=_sort_key)
        if len(olds) == len(news):
            pairs.update(zip(olds, news, strict=True))
    same_id(lambda workflow, n: True)
    return pairs


def _uses(workflow: Workflow) -> dict[str, list[tuple[Any, ...]]]:
    """``{node id: [(class, title, input, output slot) of each input its outputs feed]}``."""
    uses: dict[str, list[tuple[Any, ...]]] = {}
    for node in workflow.values():
        for name, value in (node.get("inputs") or {}).items():
            if is_link(value):
                use = (str(node.get("class_type")), node_title(node) or "", name, str(value[1]))
                uses.setdefault(str(value[0]), []).append(use)
    return uses


def _relinked(node: dict[str, Any], to_b: dict[str, str], b: Workflow) -> dict[str, Any]:
    """``node`` with its links pointing at the ids their sources have in workflow B. A source with no
    partner in B keeps its id, unless B gave that id to another node: then it points at
    ``"<id> (removed)"``, which no id of B equals, so the link shows as rewired."""

    def source(old: str) -> str:
        return to_b.get(old) or (f"{old} (removed)" if old in b else old)

    inputs = {
        name: [source(str(value[0])), value[1]] if is_link(value) else value
        for name, value in (node.get("inputs") or {}).items()
    }
    return {**node, "inputs": inputs}


def _diff_node(node_id: str, old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    class_type = str(new["class_type"])
    changes: list[Change] = []
    if old["class_type"] != new["class_type"]:
        changes.append(Change("class_changed", node_id, class_type, old=old["class_type"], new=class_type))
    if node_title(old) != node_title(new):
        changes.append(Change("title_changed", node_id, class_type, old=node_title(old), new=node_title(new)))
    old_inputs, new_inputs = old.get("inputs", {}), new.get("inputs", {})
    for name in sorted(set(old_inputs) | set(new_inputs)):
        if name not in new_inputs:
            changes.append(Change("input_removed", node_id, class_type, name, old=old_inputs[name]))
        elif name not in old_inputs:
            changes.append(Change("input_added", node_id, class_type, name, new=new_inputs[name]))
        elif old_inputs[name] != new_inputs[name]:
            before, after = old_inputs[name], new_inputs[name]
            kind = (
                "link_rewired"
                if is_link(before) and is_link(after)
                else "link_replaced"
                if is_link(before) or is_link(after)
                else "value_changed"
            )
            changes.append(Change(kind, node_id, class_type, name, old=before, new=after))
    return changes


MODE_WORDS = {MODE_MUTED: "muted", MODE_BYPASSED: "bypassed"}  # the modes a conversion leaves out


def mark_modes(changes: list[Change], a_modes: Mapping[str, Any], b_modes: Mapping[str, Any]) -> list[Change]:
    """``changes`` with a node that is only muted or bypassed in the editor file B (so not in its
    conversion) said so, not ``removed``, and one only muted or bypassed in A said as no longer so,
    not ``added``. ``*_modes``: ``{node id: (type, mode)}`` of each editor file (empty for API files)."""
    marked = []
    for change in changes:
        other = b_modes if change.kind == "node_removed" else a_modes if change.kind == "node_added" else {}
        kind, mode = other.get(change.node_id, (None, None))
        word = MODE_WORDS.get(mode) if kind == change.class_type else None
        undone = "" if change.kind == "node_removed" else "un"
        if word is not None:
            change = Change(f"node_{undone}{word}", change.node_id, str(kind))
        elif (instance := _hidden_instance(change.node_id, other)) is not None:  # inside a subgraph node
            word = MODE_WORDS[other[instance][1]]
            change = Change(f"node_{undone}{word}", change.node_id, change.class_type, old=instance)
        marked.append(change)
    for node_id, (kind, mode) in a_modes.items():  # left out of both conversions, one way then another
        then, now = MODE_WORDS.get(mode), MODE_WORDS.get(b_modes.get(node_id, (None, None))[1])
        if then and now and then != now and b_modes[node_id][0] == kind:
            marked.append(Change("mode_changed", node_id, str(kind), old=then, new=now))
    return sorted(marked, key=lambda change: _sort_key(change.node_id))


def _hidden(node_id: str, modes: Mapping[str, Any]) -> bool:
    """Whether an editor file's conversion left ``node_id`` out: muted, bypassed, or inside a subgraph
    node that is."""
    return modes.get(node_id, (None, None))[1] in MODE_WORDS or _hidden_instance(node_id, modes) is not None


def _hidden_instance(node_id: str, modes: Mapping[str, Any]) -> str | None:
    """The innermost muted or bypassed subgraph node ``node_id`` (``"5:1"``) is inside, if any."""
    parts = node_id.split(":")
    for end in range(len(parts) - 1, 0, -1):
        instance = ":".join(parts[:end])
        if modes.get(instance, (None, None))[1] in MODE_WORDS:
            return instance
    return None


def summarize(changes: list[Change]) -> dict[str, int]:
    """How many changes of each kind: ``{"value_changed": 2, "node_added": 1, ...}``."""
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.kind] = counts.get(change.kind, 0) + 1
    return counts
