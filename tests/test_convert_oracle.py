"""`workflow convert` against the frontend's own conversion, in headless Chromium.

The oracle: the pinned frontend (comfyui-frontend-package 1.32.9) served by the real server,
``await app.loadGraphData(ui)`` then ``(await app.graphToPrompt()).output`` — the API JSON the editor
itself would submit — for every UI workflow in the installed workflow-templates packages whose nodes
all exist on the server. One page loads them all in turn.

Normalisation: nodes are compared by id, ``class_type`` and ``inputs`` (links, values, order of keys
ignored). ``_meta.title`` is counted apart: for a few nodes the frontend titles them with its own
bundled translation of the display name, which the server's ``/object_info`` does not carry.
"""

from __future__ import annotations

import json
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from runner.errors import WorkflowError
from runner.graph.convert import convert_ui_workflow
from runner.local.server import ComfyServer
from runner.transport.client import ComfyClient
from tests.browser import open_app

pytestmark = pytest.mark.browser

MIN_MATCHING = 180  # measured: 187 of 187 eligible templates match (the floor leaves room for a few)
MIN_ELIGIBLE = 180
TEMPLATE_TIMEOUT_MS = 20_000
FRONTEND_ONLY_TYPES = frozenset({"Note", "MarkdownNote", "Reroute", "PrimitiveNode"})
ORACLE_JS = """async ([ui, timeoutMs]) => {
  const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error("timed out")), timeoutMs));
  const convert = (async () => {
    await window.app.loadGraphData(ui, true, false, null,
      {showMissingNodesDialog: false, showMissingModelsDialog: false});
    return (await window.app.graphToPrompt()).output;
  })();
  return await Promise.race([convert, timeout]);
}"""


def _template_files() -> list[Path]:
    files: list[Path] = []
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("-", "_")
        if not name.startswith("comfyui_workflow_templates"):
            continue
        for entry in dist.files or ():
            if (
                entry.name.endswith(".json")
                and entry.parent.name == "templates"
                and "index" not in entry.name
            ):
                files.append(Path(str(dist.locate_file(entry))))
    return sorted(files, key=lambda path: path.name)


def _node_types(ui: dict[str, Any]) -> set[str]:
    subgraphs = (ui.get("definitions") or {}).get("subgraphs") or []
    types = {str(node.get("type")) for node in ui["nodes"]}
    for subgraph in subgraphs:
        types |= {str(node.get("type")) for node in subgraph.get("nodes") or []}
    return types - {str(s.get("id")) for s in subgraphs} - FRONTEND_ONLY_TYPES


def _semantic(api: dict[str, Any]) -> dict[str, Any]:
    return {node_id: (node["class_type"], node["inputs"]) for node_id, node in api.items()}


def _differences(ours: dict[str, Any], oracle: dict[str, Any]) -> list[str]:
    found = [f"only ours: {node_id}" for node_id in sorted(set(ours) - set(oracle))]
    found += [f"only the frontend's: {node_id}" for node_id in sorted(set(oracle) - set(ours))]
    for node_id in sorted(set(ours) & set(oracle)):
        if ours[node_id] != oracle[node_id]:
            found.append(f"{node_id}: ours {ours[node_id]!r:.160} / frontend {oracle[node_id]!r:.160}")
    return found


def test_convert_matches_the_frontend_on_the_installed_templates(comfy_server: ComfyServer) -> None:
    with ComfyClient(comfy_server.url) as client:
        object_info = client.get_json("/object_info")
    templates = [(path, json.loads(path.read_text(encoding="utf-8"))) for path in _template_files()]
    eligible = [
        (path, ui)
        for path, ui in templates
        if isinstance(ui, dict) and isinstance(ui.get("nodes"), list) and _node_types(ui) <= set(object_info)
    ]
    assert len(eligible) >= MIN_ELIGIBLE, f"only {len(eligible)} of {len(templates)} templates are eligible"
    started = time.monotonic()
    matching: list[str] = []
    title_only: list[str] = []
    mismatches: dict[str, list[str]] = {}
    ltxv: tuple[dict[str, Any], dict[str, Any]] | None = None
    with open_app(comfy_server.url) as page:
        for path, ui in eligible:
            try:
                oracle = page.evaluate(ORACLE_JS, [ui, TEMPLATE_TIMEOUT_MS])
            except Exception as exc:  # the frontend's failure is a finding, not a crash of the test
                mismatches[path.name] = [f"frontend failed: {exc!s:.200}"]
                continue
            try:
                ours = convert_ui_workflow(ui, object_info)
            except WorkflowError as exc:
                mismatches[path.name] = [f"convert refused: {exc}"]
                continue
            if path.name == "ltxv_text_to_video.json":
                ltxv = (ours, oracle)
            if _semantic(ours) != _semantic(oracle):
                mismatches[path.name] = _differences(_semantic(ours), _semantic(oracle))
                continue
            matching.append(path.name)
            if any(ours[node_id].get("_meta") != node.get("_meta") for node_id, node in oracle.items()):
                title_only.append(path.name)
    elapsed = time.monotonic() - started
    print(
        f"\nworkflow convert matches the frontend on {len(matching)} of {len(eligible)} eligible templates "
        f"({len(templates)} installed; {len(title_only)} differ only in _meta.title) in {elapsed:.0f} s"
    )
    for name, found in sorted(mismatches.items()):
        print(f"  mismatch {name}: {found[:3]}")
    assert ltxv is not None, "ltxv_text_to_video.json was not among the eligible templates"
    assert ltxv[0] == ltxv[1], _differences(*ltxv)  # exactly, _meta included
    assert len(matching) >= MIN_MATCHING, f"{len(matching)} of {len(eligible)} match; {mismatches}"
