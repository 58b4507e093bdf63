"""Every shipped workflow is versioned and valid against the real pinned server's /object_info."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from runner.graph.validate import validate_workflow
from runner.graph.workflow import load_workflow
from runner.local.server import ComfyServer
from runner.local.workspace import WORKFLOWS_DIR
from runner.tracking.record import workflow_digest

MANIFEST = json.loads((WORKFLOWS_DIR / "manifest.json").read_text(encoding="utf-8"))["workflows"]
CHANGELOG = (WORKFLOWS_DIR / "CHANGELOG.md").read_text(encoding="utf-8")
SHIPPED = sorted(p.name for p in WORKFLOWS_DIR.glob("*.json") if p.name != "manifest.json")
# Editor (UI) files are checked in the real editor instead: tests/test_ui_workflows.py.
SHIPPED_API = [name for name in SHIPPED if name.endswith(".api.json")]


def test_every_workflow_file_is_in_the_manifest() -> None:
    assert sorted(MANIFEST) == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_changed_workflows_get_a_new_version(name: str) -> None:
    entry = MANIFEST[name]
    digest = workflow_digest(json.loads((WORKFLOWS_DIR / name).read_text(encoding="utf-8")))
    assert digest == entry["sha256"], (
        f"{name} changed: bump its version in workflows/manifest.json (now v{entry['version']}), "
        "record the new sha256 and add a line to workflows/CHANGELOG.md"
    )
    section = CHANGELOG.split(f"## {name}\n", 1)
    assert len(section) == 2, f"workflows/CHANGELOG.md has no section for {name}"
    assert re.search(rf"^- v{entry['version']} ", section[1], re.MULTILINE), (
        f"workflows/CHANGELOG.md has no entry for {name} v{entry['version']}"
    )


@pytest.fixture(scope="module")
def object_info(comfy_server: ComfyServer) -> dict[str, Any]:
    return dict(httpx.get(f"{comfy_server.url}/object_info", timeout=60).json())


@pytest.mark.integration
@pytest.mark.parametrize("name", SHIPPED_API)
def test_shipped_workflow_validates_on_the_real_server(name: str, object_info: dict[str, Any]) -> None:
    problems = validate_workflow(load_workflow(WORKFLOWS_DIR / name), object_info)
    if MANIFEST[name]["models"] == "tiny":
        assert problems == [], "\n".join(map(str, problems))
    else:  # full-size model files are not on this machine; everything else must be right
        unexpected = [p for p in problems if "does not exist on the server" not in p.message]
        assert unexpected == [], "\n".join(map(str, unexpected))
        assert problems, "the full-size workflow should name model files that are absent here"
