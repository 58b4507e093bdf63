"""Write the editor (UI) twin of a shipped API workflow, exported by the pinned frontend itself.

The twin is what the editor makes of the API file: ``app.loadApiJson`` (the frontend's own import,
which also lays the graph out), every seed control set to "fixed" (so the twin submits exactly its API
twin), and ``properties.models`` (``name``, ``url``, ``directory``) on each node that loads a model
file, as the ComfyUI templates carry them, so the editor offers the download and ``leanvideo models
check`` can say where a missing file comes from. Then ``graph.serialize()``, with the random workflow
id replaced by a fixed one so that an unchanged graph exports to the same bytes.

A file's URL comes from the ComfyUI templates installed with the pinned ComfyUI when one of them names
it, else from :data:`RELEASE_SOURCES` (the model's release page); a file neither knows is an error.
``tests/test_ui_workflows.py`` checks the twins in the real editor.

Run (starts its own pinned server, headless Chromium)::

    .venv/bin/python -m tests.ui_export workflows/wan22_t2v_int8.api.json [more.api.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from runner.graph.models import required_models
from runner.graph.workflow import load_workflow
from runner.jobs.models import template_sources
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import find_workspace
from tests.browser import open_app

FIXED_WORKFLOW_ID = "00000000-0000-0000-0000-000000000000"
# Files no pinned template names: the URL their publisher's release notes give.
RELEASE_SOURCES: dict[str, tuple[str, str]] = {
    # Lightricks' README (github.com/Lightricks/LTX-Video), "May, 5th, 2025: New model 13B v0.9.7", links
    # this file of huggingface.co/Lightricks/LTX-Video: the 13B 0.9.7 dev release checkpoint (DiT + VAE).
    "ltxv-13b-0.9.7-dev.safetensors": (
        "https://huggingface.co/Lightricks/LTX-Video/resolve/main/ltxv-13b-0.9.7-dev.safetensors",
        "checkpoints",
    ),
    # Same README, "May, 14th, 2025: New distilled model 13B v0.9.7": the LoRA version of the distill.
    "ltxv-13b-0.9.7-distilled-lora128.safetensors": (
        "https://huggingface.co/Lightricks/LTX-Video/resolve/main/ltxv-13b-0.9.7-distilled-lora128.safetensors",
        "loras",
    ),
}
# JSON.stringify in the page, as the editor saves a file: fields left undefined are dropped.
EXPORT_JS = """([api, name, models]) => {
  const missing = Object.values(api).map((n) => n.class_type)
    .filter((t) => !LiteGraph.registered_node_types[t]);
  if (missing.length) throw new Error(`node types unknown to the editor: ${missing.join(", ")}`);
  window.app.loadApiJson(api, name);
  for (const node of window.app.graph.nodes) {
    for (const widget of node.widgets ?? []) {
      if (widget.name === "control_after_generate") widget.value = "fixed";
    }
    const entries = models[String(node.id)];
    if (entries) node.properties.models = entries;
  }
  return JSON.stringify(window.app.graph.serialize());
}"""


def model_entries(api: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """``{node id: [{name, url, directory}]}`` for every node of ``api`` that loads a model file.

    Raises:
        LookupError: a file neither the installed templates nor :data:`RELEASE_SOURCES` name.
    """
    templates = template_sources()
    entries: dict[str, list[dict[str, str]]] = {}
    for ref in required_models(api):
        if ref.name in templates:
            source = templates[ref.name]
            url, directory = source.url, source.directory
        elif ref.name in RELEASE_SOURCES:
            url, directory = RELEASE_SOURCES[ref.name]
        else:
            raise LookupError(
                f"node {ref.node_id} ({ref.class_type}) loads {ref.name!r}, which no installed ComfyUI "
                "template and no entry of RELEASE_SOURCES names: use the name of its release page"
            )
        entries.setdefault(ref.node_id, []).append({"name": ref.name, "url": url, "directory": directory})
    return entries


def export_twin(page: Any, api_path: Path) -> dict[str, Any]:
    """The editor twin of ``api_path`` as the frontend on ``page`` serializes it."""
    api = load_workflow(api_path)
    ui = json.loads(page.evaluate(EXPORT_JS, [api, api_path.name, model_entries(api)]))
    if len(ui["nodes"]) != len(api):
        raise RuntimeError(f"{api_path}: the editor loaded {len(ui['nodes'])} of {len(api)} nodes")
    ui["id"] = FIXED_WORKFLOW_ID
    return dict(ui)


def twin_path(api_path: Path) -> Path:
    if not api_path.name.endswith(".api.json"):
        raise ValueError(f"{api_path} is not an API workflow (X.api.json)")
    return api_path.with_name(api_path.name[: -len(".api.json")] + ".ui.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ui_export", description=__doc__.split("\n")[0])
    parser.add_argument("workflows", nargs="+", type=Path, help="API workflows (X.api.json)")
    args = parser.parse_args(argv)
    workspace = find_workspace()
    with tempfile.TemporaryDirectory(prefix="leanvideo-ui-export-") as state:
        config = ServerConfig.in_workspace(workspace, Path(state), cpu=True)
        with ComfyServer(config) as server, open_app(server.url) as page:
            for api_path in args.workflows:
                target = twin_path(api_path)
                ui = export_twin(page, api_path)
                target.write_text(json.dumps(ui, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
                print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
