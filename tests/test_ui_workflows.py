"""The shipped editor (UI) workflows in the real pinned frontend: they load with every node known, the
editor turns each back into exactly its API twin, and the tiny one queued from the page makes a video.

Screenshots land in ``test-artifacts/`` (git-ignored) for a person to look at.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.local.server import ComfyServer
from runner.local.workspace import REPO_ROOT, WORKFLOWS_DIR
from tests.browser import open_app

UI_FILES = sorted(WORKFLOWS_DIR.glob("*.ui.json"))
ARTIFACTS = REPO_ROOT / "test-artifacts"
LOAD_JS = """async (ui) => {
  const missing = ui.nodes.map((n) => n.type).filter((t) => !LiteGraph.registered_node_types[t]);
  const warned = [];
  const original = window.app.showMissingNodesError;
  window.app.showMissingNodesError = (types) => { warned.push(types); };
  try {
    await window.app.loadGraphData(ui, true, false, null,
      {showMissingNodesDialog: true, showMissingModelsDialog: false});
  } finally {
    window.app.showMissingNodesError = original;
  }
  const output = (await window.app.graphToPrompt()).output;
  return {missing, warned, output};
}"""


BOX_JS = """() => { const b = document.querySelector('.leanvideo-report');
  return b && {display: b.style.display, node: b.leanvideoNode, z: b.style.zIndex, text: b.textContent}; }"""
SELECT_JS = """(id) => { const c = window.app.canvas; const node = c.graph.getNodeById(id); c.deselectAll?.();
  c.selectNode(node); c.centerOnNode(node); c.setDirty(true, true); }"""


@pytest.fixture(scope="module")
def editor_url(comfy_server: ComfyServer) -> str:
    """The server's editor, told the first-run tutorial is done so no templates dialog covers the graph."""
    response = httpx.post(f"{comfy_server.url}/settings/Comfy.TutorialCompleted", json=True, timeout=30)
    assert response.status_code == 200
    return comfy_server.url


def _api_twin(ui_path: Path) -> dict[str, Any]:
    return dict(json.loads(ui_path.with_name(ui_path.name.replace(".ui.json", ".api.json")).read_text()))


def _semantic(workflow: dict[str, Any]) -> dict[str, Any]:
    return {
        node_id: (node["class_type"], node["inputs"], (node.get("_meta") or {}).get("title"))
        for node_id, node in workflow.items()
    }


def test_every_ui_workflow_has_an_api_twin() -> None:
    assert len(UI_FILES) >= 3
    for path in UI_FILES:
        assert _api_twin(path)


@pytest.mark.browser
def test_ui_workflows_load_in_the_editor_and_match_their_api_twin(editor_url: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with open_app(editor_url) as page:
        for path in UI_FILES:
            loaded = page.evaluate(LOAD_JS, json.loads(path.read_text()))
            page.screenshot(path=str(ARTIFACTS / f"{path.stem}.png"))
            assert loaded["missing"] == [], f"{path.name}: node types missing in the editor"
            assert loaded["warned"] == [], f"{path.name}: the editor warned of missing nodes"
            invalid = page.get_by_text("Invalid workflow").count()
            assert invalid == 0, f"{path.name}: the editor rejected the file's schema"
            assert _semantic(loaded["output"]) == _semantic(_api_twin(path)), path.name


@pytest.mark.browser
def test_tiny_workflow_queued_from_the_page_makes_a_video(comfy_server: ComfyServer, editor_url: str) -> None:
    ui = json.loads((WORKFLOWS_DIR / "ltxv_tiny_t2v.ui.json").read_text())
    for node in ui["nodes"]:  # a new prompt text, so the run is not served from ComfyUI's cache
        if node["type"] == "CLIPTextEncode":
            node["widgets_values"][0] += f" ({time.time_ns()})"
    before = set(httpx.get(f"{comfy_server.url}/history").json())
    with open_app(editor_url) as page:
        page.evaluate(LOAD_JS, ui)
        page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
        deadline, outputs = time.monotonic() + 240, None
        while time.monotonic() < deadline and outputs is None:
            history = httpx.get(f"{comfy_server.url}/history").json()
            for prompt_id in set(history) - before:
                if history[prompt_id].get("status", {}).get("completed"):
                    outputs = history[prompt_id]["outputs"]
            time.sleep(0.5)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ltxv_tiny_t2v.queued.png"))
    assert outputs is not None, "the prompt queued from the page did not finish"
    files = [item["filename"] for out in outputs.values() for item in out.get("images", [])]
    assert any(name.endswith(".mp4") for name in files), outputs


PACK_NODES = {
    "LeanVideoDiffusionModelLoaderINT8": ("Load Diffusion Model (INT8)", "advanced/loaders"),
    "LeanVideoCheckpointLoaderINT8": ("Load Checkpoint (INT8)", "advanced/loaders"),
    "LeanVideoTextEncoderLoaderINT8": ("Load Text Encoder (INT8)", "advanced/loaders"),
    "LeanVideoFreeVRAM": ("Free VRAM", "utils"),
    "LeanVideoPatchAttention": ("Patch Attention", "advanced/model_patches"),
    "LeanVideoSaveVideoLossless": ("Save Video (lossless)", "image/video"),
}


@pytest.mark.browser
def test_pack_nodes_are_registered_in_the_editor_under_their_names(editor_url: str) -> None:
    """The editor's node search matches display names; each node must be there under its own."""
    with open_app(editor_url) as page:
        found = page.evaluate(
            """(ids) => Object.fromEntries(ids.map((id) => {
                 const type = LiteGraph.registered_node_types[id];
                 return [id, type ? [type.title, type.category] : null];
               }))""",
            list(PACK_NODES),
        )
    assert found == {node_id: list(expected) for node_id, expected in PACK_NODES.items()}


@pytest.mark.browser
def test_the_nodes_reports_show_in_the_editor_once_they_ran(
    comfy_server: ComfyServer, editor_url: str
) -> None:
    """Free VRAM, Patch Attention and the INT8 loaders return a report (``ui.text``); the stock editor
    draws no such text, so the pack's extension draws it under the node, and saves nothing of it."""
    served = httpx.get(f"{comfy_server.url}/extensions", timeout=30).json()
    assert {"/extensions/leanvideo/reports.js", "/extensions/leanvideo/screen.js"} <= set(served)
    ui = json.loads((WORKFLOWS_DIR / "ltxv_tiny_t2v_int8.ui.json").read_text())
    for node in ui["nodes"]:  # a new prompt text, so that every node runs again
        if node["type"] == "CLIPTextEncode":
            node["widgets_values"][0] += f" ({time.time_ns()})"
    reported = {n["id"]: n["type"] for n in ui["nodes"] if n["type"] in PACK_NODES}
    with open_app(editor_url) as page:
        page.evaluate(LOAD_JS, ui)
        saved_before = page.evaluate(
            "() => window.app.graph.serialize().nodes.map((n) => [n.widgets_values, n.size])"
        )
        page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
        page.wait_for_function(
            "(ids) => ids.every((id) => window.app.graph.getNodeById(id)?.leanvideoReport)",
            arg=list(reported),
            timeout=240_000,
        )
        reports = page.evaluate(
            "(ids) => Object.fromEntries(ids.map((id) => "
            "[id, window.app.graph.getNodeById(id).leanvideoReport]))",
            list(reported),
        )
        saved_after = page.evaluate(
            "() => window.app.graph.serialize().nodes.map((n) => [n.widgets_values, n.size])"
        )
        ARTIFACTS.mkdir(exist_ok=True)
        page.evaluate(  # a node selected alone shows its report under it
            SELECT_JS, next(i for i, kind in reported.items() if kind == "LeanVideoFreeVRAM")
        )
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "ltxv_tiny_t2v_int8.reports.png"))
        free_vram = next(i for i, kind in reported.items() if kind == "LeanVideoFreeVRAM")
        shown = page.evaluate(BOX_JS)  # a page element over the canvas: no node or text box covers it
        assert (shown["display"], shown["node"], shown["z"]) == ("block", free_vram, "1000"), shown
        assert "unloaded" in shown["text"]
        page.evaluate("() => { window.app.canvas.selectItems(); window.app.canvas.setDirty(true, true); }")
        page.wait_for_timeout(300)
        assert page.evaluate(BOX_JS)["display"] == "none"  # many selected: one box would cover another
        # the nodes made again (another tab and back): test_a_run_queued_in_one_tab_keeps_its_reports…
        # a loader that runs again and fails shows no report of the run before
        checkpoint = next(i for i, kind in reported.items() if kind == "LeanVideoCheckpointLoaderINT8")
        page.evaluate(
            "(id) => { const n = window.app.graph.getNodeById(id); const w = (name) => n.widgets.find("
            "(x) => x.name === name); w('ckpt_name').value = 'ltxv-tiny.safetensors';"
            " w('quantize_on_load').value = false; }",
            checkpoint,
        )
        page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
        forgotten = "(id) => window.app.graph.getNodeById(id).leanvideoReport === null"
        page.wait_for_function(forgotten, arg=checkpoint, timeout=60_000)
    by_type = {reported[int(node_id)]: "\n".join(lines) for node_id, lines in reports.items()}
    assert "unloaded" in by_type["LeanVideoFreeVRAM"], by_type
    assert "attention: auto → sdpa" in by_type["LeanVideoPatchAttention"], by_type
    assert "INT8 kernels:" in by_type["LeanVideoCheckpointLoaderINT8"], by_type
    # drawn, not a widget, and the node keeps its size (a grown node covered its neighbours)
    assert saved_after == saved_before


OPEN_JS = """async ([ui, name]) => {
  const file = new File([JSON.stringify(ui)], name, {type: 'application/json'});
  await window.app.handleFile(file); }"""  # as Workflow > Open does: a tab of its own
REPORT_JS = "(id) => (window.app.graph.getNodeById(id)?.leanvideoReport ?? []).join('\\n')"


def _bumped(name: str) -> dict[str, Any]:
    ui: dict[str, Any] = json.loads((WORKFLOWS_DIR / name).read_text())
    for node in ui["nodes"]:  # a new prompt text, so that every node runs again
        if node["type"] == "CLIPTextEncode":
            node["widgets_values"][0] += f" ({time.time_ns()})"
    return ui


def _idle(url: str) -> None:
    """Wait until the server's queue is empty."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        queue = httpx.get(f"{url}/queue", timeout=30).json()
        if not queue["queue_running"] and not queue["queue_pending"]:
            return
        time.sleep(0.5)
    pytest.fail("the server's queue did not empty in 240 s")


@pytest.mark.browser
def test_a_run_queued_in_one_tab_keeps_its_reports_out_of_another(
    comfy_server: ComfyServer, editor_url: str
) -> None:
    """A run queued in tab A and ending while tab B was shown put its Free VRAM report into B's node of
    the same id (the editor hands a run's events to the graph on screen). A node scrolled out of sight
    left its box on the window's edge, over the menu or the Run button."""
    free_vram = 16  # in both workflows
    with open_app(editor_url) as page:
        page.evaluate(OPEN_JS, [_bumped("ltxv_tiny_t2v_freevram.ui.json"), "freevram.json"])
        page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
        page.wait_for_timeout(500)
        _idle(comfy_server.url)
        page.wait_for_function(f"() => ({REPORT_JS})({free_vram})", timeout=10_000)
        own = page.evaluate(REPORT_JS, free_vram)
        page.evaluate(OPEN_JS, [_bumped("ltxv_tiny_t2v_int8.ui.json"), "int8.json"])
        page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
        page.locator(".workflow-tabs .p-togglebutton", has_text="freevram").first.click()
        page.wait_for_timeout(500)
        _idle(comfy_server.url)
        history = httpx.get(f"{comfy_server.url}/history?max_items=1", timeout=30).json()
        (ran,) = history.values()
        theirs = "\n".join(ran["outputs"][str(free_vram)]["text"])
        assert theirs != own  # the int8 tab's run, timed apart
        page.evaluate(SELECT_JS, free_vram)  # drawn, so its report is read
        page.wait_for_function(f"(text) => ({BOX_JS})().text === text", arg=own, timeout=10_000)
        page.evaluate(  # scrolled far out of sight: no box left on the window's edge
            "() => { const c = window.app.canvas; c.ds.offset[0] += 20000; c.setDirty(true, true); }"
        )
        page.wait_for_function(f"() => ({BOX_JS})().display === 'none'", timeout=10_000)
        page.locator(".workflow-tabs .p-togglebutton", has_text="int8").first.click()
        page.evaluate(SELECT_JS, free_vram)
        page.wait_for_function(f"(text) => ({BOX_JS})().text === text", arg=theirs, timeout=10_000)
        # a tab opened while another tab's run goes, and never run itself, shows no report (the editor
        # kept that run's outputs under its node ids, and the box showed them)
        page.evaluate(OPEN_JS, [_bumped("ltxv_tiny_t2v_int8.ui.json"), "again.json"])  # a new prompt
        page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
        page.evaluate(OPEN_JS, [_bumped("ltxv_tiny_t2v_freevram.ui.json"), "never.json"])
        page.wait_for_timeout(500)
        _idle(comfy_server.url)
        page.evaluate(SELECT_JS, free_vram)
        page.wait_for_timeout(1000)
        assert page.evaluate(BOX_JS)["display"] == "none"
        assert page.evaluate(REPORT_JS, free_vram) == ""


@pytest.mark.browser
def test_pointing_at_a_node_shows_its_report_with_nodes_drawn_as_page_elements(
    comfy_server: ComfyServer, editor_url: str
) -> None:
    """With "Nodes 2.0" (Comfy.VueNodes.Enabled, which the editor's banner offers) the canvas does not
    see the node under the pointer: pointing at Free VRAM showed nothing."""
    setting = "async (on) => { await window.app.extensionManager.setting.set('Comfy.VueNodes.Enabled', on); }"
    with open_app(editor_url) as page:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.evaluate(setting, True)
        try:
            page.evaluate(OPEN_JS, [_bumped("ltxv_tiny_t2v_freevram.ui.json"), "vue.json"])
            page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
            page.wait_for_timeout(500)
            _idle(comfy_server.url)
            page.evaluate("() => { const c = window.app.canvas; c.centerOnNode(c.graph.getNodeById(16)); }")
            # the circled "i" the canvas cannot draw on a node that is a page element: over its header
            shown = "() => [...document.querySelectorAll('.leanvideo-report-marker')]"
            shown += ".filter((m) => m.style.display !== 'none').length"
            page.evaluate("() => window.app.canvas.setDirty(true, true)")
            page.wait_for_function(f"() => ({shown})() >= 1", timeout=10_000)
            # as big as the canvas would draw it at this zoom; none where nodes are drawn in outline
            sizes = "() => [...document.querySelectorAll('.leanvideo-report-marker')]"
            sizes += ".filter((m) => m.style.display !== 'none').map((m) => m.offsetWidth)"
            zoom = "(s) => { const c = window.app.canvas; c.ds.changeScale(s, [700, 450]);"
            zoom += " c.setDirty(true, true); }"
            page.evaluate(zoom, 2)
            page.wait_for_function(f"() => ({sizes})().includes(28)", timeout=10_000)
            page.evaluate(zoom, 0.3)
            page.wait_for_function(f"() => ({shown})() === 0", timeout=10_000)
            page.evaluate(zoom, 1)
            page.wait_for_function(f"() => ({sizes})().includes(14)", timeout=10_000)
            page.locator('[data-node-id="16"]').first.hover()
            page.wait_for_function(f"() => ({BOX_JS})().node === 16", timeout=10_000)
            assert "unloaded" in page.evaluate(BOX_JS)["text"]
            page.mouse.move(5, 500)  # off the node: the box goes
            page.wait_for_function(f"() => ({BOX_JS})().display === 'none'", timeout=10_000)
            away = "() => { const c = window.app.canvas; c.ds.offset[0] += 20000; c.setDirty(true, true); }"
            page.evaluate(away)
            page.wait_for_function(f"() => ({shown})() === 0", timeout=10_000)  # scrolled away: no marker
        finally:
            page.evaluate(setting, False)


# The canvas's open span at height y: where the canvas itself is hit, scanning in from each side
OPEN_EDGES_JS = """(y) => { const cv = window.app.canvas.canvas; const seen = [];
  for (let x = 0; x < window.innerWidth; x += 2) if (document.elementFromPoint(x, y) === cv) seen.push(x);
  return [seen[0], seen[seen.length - 1]]; }"""
# Where the node and its box are on screen, drawn first (the box is placed as the canvas draws)
PLACED_JS = """(id) => { const c = window.app.canvas; c.draw(true, true); const n = c.graph.getNodeById(id);
  const r = c.canvas.getBoundingClientRect(); const t = LiteGraph.NODE_TITLE_HEIGHT;
  const [l, top] = c.ds.convertOffsetToCanvas([n.pos[0], n.pos[1] - t]);
  const [rt, bot] = c.ds.convertOffsetToCanvas([n.pos[0] + n.size[0], n.pos[1] + n.size[1]]);
  const b = document.querySelector('.leanvideo-report').getBoundingClientRect();
  return {node: [r.left + l, r.top + top, r.left + rt, r.top + bot], box: [b.left, b.top, b.right, b.bottom],
          shown: document.querySelector('.leanvideo-report').style.display}; }"""


@pytest.mark.browser
def test_the_report_box_keeps_off_the_side_panels_and_narrows_before_covering_its_node(
    comfy_server: ComfyServer, editor_url: str
) -> None:
    """In a narrow window the box of a tall node, with no room below or beside it at full width, was laid
    over the node's own widgets (or over the icon bar); a node mostly under the Node Library had its box
    drawn over the library's list."""
    pan = "([dx, dy]) => { const c = window.app.canvas; c.ds.offset[0] += dx; c.ds.offset[1] += dy;"
    pan += " c.setDirty(true, true); }"
    with open_app(editor_url) as page:
        page.set_viewport_size({"width": 900, "height": 700})
        page.evaluate(OPEN_JS, [_bumped("ltxv_tiny_t2v_int8.ui.json"), "narrow.json"])
        page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
        page.wait_for_timeout(500)
        _idle(comfy_server.url)
        checkpoint, free_vram = 1, 16
        page.wait_for_function(
            f"() => ({REPORT_JS})({checkpoint}) && ({REPORT_JS})({free_vram})", timeout=10_000
        )
        page.evaluate("() => window.app.canvas.ds.changeScale(1, [450, 350])")
        page.evaluate(SELECT_JS, checkpoint)
        page.evaluate(pan, [250, 150])
        page.wait_for_timeout(600)
        placed = page.evaluate(PLACED_JS, checkpoint)
        (left, top, right, bottom), (bl, bt, br, bb) = placed["node"], placed["box"]
        assert placed["shown"] == "block", placed
        assert br <= left or bl >= right or bb <= top or bt >= bottom, placed  # beside, not over, its node
        open_left, _ = page.evaluate(OPEN_EDGES_JS, (top + bottom) / 2)
        assert bl >= open_left - 2, (placed, open_left)  # not over the icon bar
        # mostly under the Node Library: the box is in the canvas beside the panel, not over its list
        page.evaluate(SELECT_JS, free_vram)
        node_left = page.evaluate(PLACED_JS, free_vram)["node"][0]
        page.evaluate(pan, [90 - node_left, 0])
        library = "Workspace.ToggleSidebarTab.node-library"
        page.evaluate("async (c) => { await window.app.extensionManager.command.execute(c); }", library)
        page.wait_for_timeout(1200)
        page.evaluate("() => window.app.canvas.setDirty(true, true)")
        placed = page.evaluate(PLACED_JS, free_vram)
        open_left, _ = page.evaluate(OPEN_EDGES_JS, placed["node"][1] + 8)
        assert placed["node"][0] < open_left < placed["node"][2], (placed, open_left)  # its right end shows
        assert placed["shown"] == "block", placed
        assert placed["box"][0] >= open_left - 2, (placed, open_left)
