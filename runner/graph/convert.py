"""Convert an editor (UI) workflow to the API format, using the server's ``/object_info``.

It follows what the v0.3.75 frontend's ``graphToPrompt`` does:

- **widget values**: ``widgets_values`` are positional over the node's widget inputs in
  ``input_order`` (required, then optional; inputs of a widget type that are not ``forceInput``). A
  control widget follows an input that asks for ``control_after_generate`` (or, when the input does
  not say, one named ``seed``/``noise_seed``), and an upload button follows an ``*_upload`` input: each
  takes a position and is skipped. Widgets with no value left in the file take their default (a
  combo's first option). A dict of ``widgets_values`` is read by name. The widgets the frontend's
  extensions add (``audioUI``, the 3D previews' ``image``, ``PreviewAny.preview``) submit ``""``.
- **links** become ``[origin id, origin slot]``; a linked widget input takes the link.
- **Reroute** nodes are followed to their source; **PrimitiveNode** sources give their value.
- **muted** nodes (mode 2) are left out, and so are the links from them; **bypassed** nodes (mode 4)
  are left out and each link from one is followed through the bypassed node's input of the same slot
  (when the type fits) or of the first input of the output's type.
- **subgraphs** are expanded by :mod:`runner.graph.subgraph` (inner ids ``"<instance>:<inner>"``).
- Notes (``Note``, ``MarkdownNote``) are dropped. Legacy group nodes (``workflow>…``) are not
  supported: they raise :class:`~runner.errors.WorkflowError` naming the node.

Checked against the frontend itself: ``tests/test_convert_oracle.py`` loads every installed template
in headless Chromium and compares with ``app.graphToPrompt()``. The one known difference is
``_meta.title`` for a few nodes, where the frontend shows its own bundled translation of the display
name.

Example::

    api = convert_ui_workflow(json.loads(Path("ui.json").read_text()), client.get_json("/object_info"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.errors import WorkflowError
from runner.graph.subgraph import MODE_BYPASSED, MODE_MUTED, WIDGET_TYPES, flatten_subgraphs, is_editor_only
from runner.graph.suggest import missing_type_hint
from runner.graph.ui_shape import check_ui_shape
from runner.graph.workflow import FRONTEND_WIDGETS, api_workflow, is_ui_workflow

Workflow = dict[str, Any]
ObjectInfo = dict[str, Any]
CutLinks = dict[tuple[str, str], str]  # (node id, input) -> where its link came from, and why it is cut

CONTROL_VALUES = frozenset({"fixed", "increment", "decrement", "randomize"})
SEED_NAMES = frozenset({"seed", "noise_seed"})
UPLOAD_OPTIONS = ("image_upload", "video_upload", "audio_upload")


def as_api_workflow(
    document: Any, path: Path, object_info: ObjectInfo, cut: CutLinks | None = None
) -> Workflow:
    """``document`` (the JSON read from ``path``) as an API workflow: itself, or converted when it is an
    editor (UI) file (``cut`` as in :func:`convert_ui_workflow`).

    Raises:
        WorkflowError: not a workflow, or not convertible (each naming ``path``).
    """
    if not is_ui_workflow(document):
        return api_workflow(document, path)
    try:
        return convert_ui_workflow(document, object_info, cut)
    except WorkflowError as error:
        raise WorkflowError(f"{path}: {error}") from error


def check_workflow_document(document: Any, path: Path) -> None:
    """What can be checked of a workflow file without a server: an API workflow's shape, an editor
    file's nodes, links and ids. Called before the server is asked, so that a damaged file is said as
    such (exit 5) also where no server answers (it was said as an unreachable server, exit 4).

    Raises:
        WorkflowError: naming ``path`` and what is wrong.
    """
    if not is_ui_workflow(document):
        api_workflow(document, path)
        return
    try:
        check_ui_shape(document)
        flatten_subgraphs(document)  # two nodes of one id, a damaged subgraph
    except WorkflowError as error:
        raise WorkflowError(f"{path}: {error}") from error


def convert_ui_workflow(ui: dict[str, Any], object_info: ObjectInfo, cut: CutLinks | None = None) -> Workflow:
    """The API-format workflow the editor would submit for ``ui``; see the module docstring. An input
    left out because its link comes from a muted node (or through a bypassed one with nothing to pass
    on) is said in ``cut``, when given: ``{(node id, input): "node 15 (LoraLoader), which is muted"}``.

    Raises:
        WorkflowError: not a UI workflow, a damaged one (:mod:`runner.graph.ui_shape`), an unknown node
            type, or a legacy group node.
    """
    if not isinstance(ui, dict) or not isinstance(ui.get("nodes"), list):
        raise WorkflowError("not an editor (UI) workflow: it has no 'nodes' list")
    check_ui_shape(ui)
    flat_nodes, rows = flatten_subgraphs(ui)
    nodes = {str(node["id"]): node for node in flat_nodes}  # ids made unique by flatten_subgraphs
    links = {int(row[0]): _link(row) for row in rows}
    graph = _Graph(nodes, links, object_info)
    api: Workflow = {}
    unknown: list[str] = []
    for node_id, node in nodes.items():
        kind = str(node.get("type"))
        if is_editor_only(node):
            continue
        if kind.startswith("workflow>") or kind.startswith("workflow/"):
            raise WorkflowError(f"node {node_id} is a group node ({kind}); convert does not expand these yet")
        if kind not in object_info:  # every one is listed: installing them is one trip, not one per run
            hint = missing_type_hint(kind, object_info, node.get("properties"))
            unknown.append(f"node {node_id}: unknown node type {kind!r}{hint}")
            continue
        inputs = widget_inputs(node, object_info[kind])
        if kind in FRONTEND_WIDGETS:
            inputs[FRONTEND_WIDGETS[kind]] = ""
        for slot in node.get("inputs") or []:
            if slot.get("link") is None:
                continue
            source, why = graph.trace(int(slot["link"]))
            if source is not None:
                inputs[str(slot["name"])] = source
            elif not _is_widget_slot(slot):
                inputs.pop(str(slot["name"]), None)
                if cut is not None and why is not None:
                    cut[(node_id, str(slot["name"]))] = why
        title = node.get("title") or object_info[kind].get("display_name") or kind
        api[node_id] = {"inputs": inputs, "class_type": kind, "_meta": {"title": title}}
    if len(unknown) == 1:
        raise WorkflowError(unknown[0])
    if unknown:
        raise WorkflowError(f"{len(unknown)} nodes of unknown types:\n  " + "\n  ".join(unknown))
    return api


def widget_inputs(node: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """The node's widget values by input name, read from its ``widgets_values``."""
    values = node.get("widgets_values")
    names = _widget_names(info)
    if values is not None and not isinstance(values, (list, dict)):  # a string: read letter by letter
        raise WorkflowError(
            f"node {node.get('id')} ({node.get('type')}): widgets_values is a {type(values).__name__}, "
            "not a list of the widgets' values"
        )
    found: dict[str, Any] = {}
    if isinstance(values, dict):  # by name; a widget it does not name keeps its default, as in the editor
        for name, spec, options in names:
            found[name] = _as_submitted(values[name] if name in values else _default(spec, options))
        return found
    values = list(values or [])
    index = 0
    for name, spec, options in names:
        found[name] = _as_submitted(values[index] if index < len(values) else _default(spec, options))
        index += 1
        # The frontend adds a control widget when asked, or by name when the input says nothing.
        if options.get("control_after_generate", name in SEED_NAMES):
            index += 1
        if any(options.get(key) for key in UPLOAD_OPTIONS):
            index += 1
    return found


def _as_submitted(value: Any) -> Any:
    """A widget's value as the editor submits it: a list value wrapped (a bare list is a link)."""
    return {"__value__": value} if isinstance(value, list) else value


def _default(spec: Any, options: dict[str, Any]) -> Any:
    """The value a fresh widget starts with (as the frontend makes it) when the file has none."""
    if "default" in options:
        return options["default"]
    choices = spec if isinstance(spec, list) else options.get("options") or []
    if choices:
        return choices[0]
    return {"INT": 0, "FLOAT": 0, "BOOLEAN": False}.get(str(spec), "")


def _widget_names(info: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    inputs = info.get("input") or {}
    order = info.get("input_order") or {}
    names: list[tuple[str, Any, dict[str, Any]]] = []
    for section in ("required", "optional"):
        specs = inputs.get(section) or {}
        for name in order.get(section) or list(specs):
            spec = specs.get(name)
            if not isinstance(spec, (list, tuple)) or not spec:
                continue
            kind = spec[0]
            options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if (isinstance(kind, list) or kind in WIDGET_TYPES) and not options.get("forceInput"):
                names.append((name, kind, options))
    return names


def _is_widget_slot(slot: dict[str, Any]) -> bool:
    return isinstance(slot.get("widget"), dict)


def _link(row: list[Any]) -> tuple[str, int, str]:
    return str(row[1]), int(row[2]), str(row[5]) if len(row) > 5 else "*"


class _Graph:
    """Link resolution through reroutes, primitives, muted and bypassed nodes."""

    def __init__(
        self, nodes: dict[str, Any], links: dict[int, tuple[str, int, str]], object_info: ObjectInfo
    ):
        self.nodes, self.links, self.object_info = nodes, links, object_info

    def trace(self, link_id: int, depth: int = 0) -> tuple[Any, str | None]:
        """``(source, None)``: ``[origin id, slot]`` or a primitive's value; or ``(None, why)`` when the
        source is muted or missing, ``why`` saying where the link comes from and why it gives nothing."""
        if depth > 64:
            return None, "a chain of more than 64 reroutes or bypassed nodes"
        if link_id not in self.links:
            return None, f"link {link_id}, which is not in the workflow's links"
        origin_id, slot, _ = self.links[link_id]
        origin = self.nodes.get(origin_id)
        if origin is None:
            return None, f"node {origin_id}, which is not in the workflow"
        kind = origin.get("type")
        name = f"node {origin_id} ({kind})"
        if kind == "PrimitiveNode":  # its value, muted or bypassed alike: the editor's graphToPrompt does so
            values = origin.get("widgets_values") or []
            return (
                (values[0], None)
                if values and values[0] is not None
                else (None, f"{name}, which has no value")
            )
        if origin.get("mode") == MODE_MUTED:
            return None, f"{name}, which is muted"
        if kind == "Reroute":
            upstream = (origin.get("inputs") or [{}])[0].get("link")
            if upstream is None:
                return None, f"{name}, with nothing linked into it"
            return self.trace(int(upstream), depth + 1)
        if origin.get("mode") == MODE_BYPASSED:
            upstream = self._bypass_input(origin, slot)
            if upstream is None:
                outputs = origin.get("outputs") or []
                wanted = str(outputs[slot].get("type", "*")) if slot < len(outputs) else "*"
                return None, f"{name}, which is bypassed and has no linked {wanted} input to pass on"
            return self.trace(upstream, depth + 1)
        return [origin_id, slot], None

    def _bypass_input(self, node: dict[str, Any], slot: int) -> int | None:
        """The link feeding a bypassed node's output ``slot``: same slot if the type fits, else the first
        input of that type."""
        inputs = node.get("inputs") or []
        outputs = node.get("outputs") or []
        wanted = str(outputs[slot].get("type", "*")) if slot < len(outputs) else "*"
        candidates = [inputs[slot]] if slot < len(inputs) else []
        candidates += [i for i in inputs if str(i.get("type")) == wanted]
        candidates += [i for i in inputs if _compatible(str(i.get("type", "*")), wanted)]
        for candidate in candidates:
            if _compatible(str(candidate.get("type", "*")), wanted) and candidate.get("link") is not None:
                return int(candidate["link"])
        return None


def _compatible(a: str, b: str) -> bool:
    return "*" in (a, b) or "" in (a, b) or bool(set(a.split(",")) & set(b.split(",")))
