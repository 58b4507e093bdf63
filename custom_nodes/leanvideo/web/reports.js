// The report each LeanVideo node returns as `ui.text` (what Free VRAM freed, what Patch Attention
// patched and why, each INT8 kernel a loader chose), in the editor: once the node has run, a circled
// "i" in its title bar (over its header where nodes are page elements) says there is one, and
// pointing at the node (or selecting it alone) shows the report in a box under it (beside it, or above
// it, where the window has no room). The box is a page element over the canvas, so no node drawn later
// and no text box of a node covers it, and its text keeps its size at any zoom; it goes when its node
// is scrolled away or under a panel (where things may go on the page: screen.js). Each workflow tab
// keeps the reports of the runs it queued. The node itself never changes: not its size, not its
// widgets; nothing is added to what is saved or submitted.
import { api } from "../../scripts/api.js";
import { app } from "../../scripts/app.js";
import { inSight, openSpan, overlay } from "./screen.js";

const NODES = new Set([
  "LeanVideoDiffusionModelLoaderINT8",
  "LeanVideoCheckpointLoaderINT8",
  "LeanVideoTextEncoderLoaderINT8",
  "LeanVideoFreeVRAM",
  "LeanVideoPatchAttention",
  "LeanVideoSaveVideoLossless",
]);
const MAX_LINES = 40;
const MAX_WIDTH = 640; // px on screen
const MIN_WIDTH = 280;
const GAP = 6;
const CACHED_LINE = "(cached: this report is from the run that computed the node's output)";

function reportLines(message) {
  const text = message?.text;
  if (!Array.isArray(text) || text.length === 0) return null;
  return text.map(String).join("\n").split("\n");
}

// A small circled "i" at the right of the title bar (drawn: a font may lack the ⓘ glyph).
function drawMarker(node, ctx) {
  const title = LiteGraph.NODE_TITLE_HEIGHT ?? 30;
  const x = node.size[0] - 14;
  const y = -title / 2;
  ctx.save();
  ctx.strokeStyle = ctx.fillStyle = LiteGraph.NODE_TITLE_COLOR ?? "#999";
  ctx.lineWidth = 1.2;
  ctx.beginPath();
  ctx.arc(x, y, 6, 0, 2 * Math.PI);
  ctx.stroke();
  ctx.font = "bold 9px sans-serif";
  ctx.textAlign = "center";
  ctx.fillText("i", x, y + 3.5);
  ctx.restore();
}

// A report that changed after its node ran (an INT8 loader's kernels, chosen when the sampler first
// runs each layer shape) comes as a `leanvideo.report` message, {token, text}: the token is the one in
// that run's UI output (`leanvideo_report`). It replaces the report of every node showing that run's
// (in a subgraph too, or under another id: a cached loader is shared by equal nodes), and is kept for
// a node whose cached run is shown again, with the report as it was when the loader ran.
const LATER_REPORTS = new Map();
const KEPT_REPORTS = 64;

function reportToken(message) {
  const token = message?.leanvideo_report;
  return Array.isArray(token) && typeof token[0] === "string" ? token[0] : null;
}

function eachNode(graph, visit, depth = 0) {
  for (const node of graph?._nodes ?? graph?.nodes ?? []) {
    visit(node);
    if (node.subgraph && depth < 8) eachNode(node.subgraph, visit, depth + 1);
  }
}

function showLaterReport({ detail }) {
  const token = typeof detail?.token === "string" ? detail.token : null;
  const lines = reportLines(detail);
  if (!token || !lines) return;
  LATER_REPORTS.delete(token);
  LATER_REPORTS.set(token, lines);
  if (LATER_REPORTS.size > KEPT_REPORTS) LATER_REPORTS.delete(LATER_REPORTS.keys().next().value);
  eachNode(app.graph, (node) => {
    if (node.leanvideoReportToken !== token) return;
    node.leanvideoReport = lines;
    node.setDirtyCanvas?.(true, true);
  });
}

function setReport(node, message) {
  const lines = reportLines(message);
  if (!lines) return false;
  node.leanvideoReportToken = reportToken(message);
  node.leanvideoReport = LATER_REPORTS.get(node.leanvideoReportToken) ?? lines;
  return true;
}

// Which workflow tab queued each prompt. The editor hands a run's events to the graph on screen, so a
// run queued in one tab and still going when another is shown would put its reports into that tab's
// nodes of the same ids; each tab's reports are kept apart here, and shown when it is on screen again.
const PROMPT_TABS = new Map();
const TAB_REPORTS = new WeakMap(); // tab -> Map(node id -> the UI output of its last run)
let runningPrompt = null;

function activeTab() {
  return app.extensionManager?.workflow?.activeWorkflow ?? null;
}

function tabOf(promptId) {
  return PROMPT_TABS.get(promptId) ?? null; // null: queued before this page, or no tabs to tell
}

function onScreen(promptId) {
  const tab = tabOf(promptId);
  return tab === null || tab === activeTab();
}

function keptReports(tab) {
  if (!tab) return null;
  if (!TAB_REPORTS.has(tab)) TAB_REPORTS.set(tab, new Map());
  return TAB_REPORTS.get(tab);
}

function keepReport({ detail }) {
  const id = detail?.display_node ?? detail?.node;
  if (id == null || !reportLines(detail?.output)) return;
  keptReports(tabOf(detail.prompt_id))?.set(String(id), detail.output);
}

// The report of a node made again from its workflow (another tab and back): the node's own fields lost
// it. Its tab's kept report; where the editor has no tabs to tell apart, the editor's kept output (not
// with tabs: it holds the outputs of another tab's run that ended while this one was shown).
function reportOf(node) {
  if (node.leanvideoReport === undefined) {
    const id = String(node.id);
    const tab = activeTab();
    const kept = tab ? keptReports(tab).get(id) : app.nodeOutputs?.[id];
    if (!(kept && node.graph === app.graph && setReport(node, kept))) node.leanvideoReport = null;
  }
  return node.leanvideoReport;
}

// Each node as it starts runs again: the report it showed is an earlier run's, and would stay beside
// the error of this one if it failed. A node served from the cache keeps its report, said to be so.
function forget({ detail }) {
  if (detail == null) return;
  keptReports(tabOf(runningPrompt))?.delete(String(detail));
  const node = onScreen(runningPrompt) ? app.graph?.getNodeById?.(detail) : null;
  if (node && NODES.has(node.type)) {
    node.leanvideoReport = null;
    node.leanvideoCached = false;
    node.setDirtyCanvas?.(true, true);
  }
}

function markCached({ detail }) {
  if (!onScreen(detail?.prompt_id)) return;
  for (const id of detail?.nodes ?? []) {
    const node = app.graph?.getNodeById?.(id);
    if (node && NODES.has(node.type)) node.leanvideoCached = true;
  }
}

function trackPrompts() {
  const queuePrompt = api.queuePrompt;
  if (typeof queuePrompt !== "function") return;
  api.queuePrompt = async function (...args) {
    const tab = activeTab();
    const result = await queuePrompt.apply(this, args);
    if (tab && typeof result?.prompt_id === "string") {
      PROMPT_TABS.set(result.prompt_id, tab);
      if (PROMPT_TABS.size > KEPT_REPORTS) PROMPT_TABS.delete(PROMPT_TABS.keys().next().value);
    }
    return result;
  };
  api.addEventListener("execution_start", ({ detail }) => {
    runningPrompt = detail?.prompt_id ?? null;
  });
  api.addEventListener("executed", keepReport);
}

// The node pointed at where nodes are page elements ("Nodes 2.0"): the canvas does not see it.
let pointedId = null;

function trackPointedNode() {
  document.addEventListener("pointerover", (event) => {
    const element = event.target?.closest?.("[data-node-id]");
    const id = element?.getAttribute("data-node-id") ?? null;
    if (id !== pointedId) {
      pointedId = id;
      app.canvas?.setDirty?.(true, true);
    }
  });
}

let box = null;

function reportBox() {
  if (box?.isConnected) return box;
  box = overlay("leanvideo-report", {
    zIndex: "1000", // over the nodes' text boxes, under the editor's menus and dialogs
    display: "none",
    boxSizing: "border-box",
    padding: "6px 8px",
    font: "11px/14px monospace",
    whiteSpace: "pre-wrap",
    maxHeight: "calc(100vh - 4px)",
    overflow: "hidden",
    overflowWrap: "anywhere",
    color: "var(--fg-color, #ddd)",
    background: "var(--comfy-menu-bg, rgba(20, 20, 20, 0.94))",
    border: "1px solid var(--border-color, #666)",
    borderRadius: "4px",
    boxShadow: "0 2px 8px rgba(0, 0, 0, 0.4)",
  });
  return box;
}

function shownNode(canvas) {
  const over = canvas.node_over ?? (pointedId === null ? null : app.graph?.getNodeById?.(pointedId));
  if (over && NODES.has(over.type) && reportOf(over)) return over;
  const selected = [...(canvas.selectedItems ?? [])].filter((item) => NODES.has(item?.type));
  const all = canvas.selectedItems?.size ?? Object.keys(canvas.selected_nodes ?? {}).length;
  // one node selected alone: with many (select all, a box selection) their boxes would cover each other
  return all === 1 && selected.length === 1 && reportOf(selected[0]) ? selected[0] : null;
}

function placeBox(canvas) {
  const node = shownNode(canvas);
  const element = reportBox();
  if (!node || node.flags?.collapsed) {
    element.style.display = "none";
    element.leanvideoNode = null;
    return;
  }
  const lines = node.leanvideoCached ? [CACHED_LINE, ...node.leanvideoReport] : node.leanvideoReport;
  const shown =
    lines.length > MAX_LINES
      ? [...lines.slice(0, MAX_LINES - 1), `… ${lines.length - MAX_LINES + 1} more line(s): the prompt's history has them all`]
      : lines;
  const rect = canvas.canvas.getBoundingClientRect();
  const title = LiteGraph.NODE_TITLE_HEIGHT ?? 30;
  const [left, top] = canvas.ds.convertOffsetToCanvas([node.pos[0], node.pos[1] - title]);
  const [right, bottom] = canvas.ds.convertOffsetToCanvas([node.pos[0] + node.size[0], node.pos[1] + node.size[1]]);
  if (!inSight(canvas, rect, [left, top, right, bottom])) {
    element.style.display = "none"; // scrolled away, or under a panel: its box would be left on the edge
    element.leanvideoNode = null;
    return;
  }
  const text = shown.join("\n");
  if (element.textContent !== text) element.textContent = text;
  // under the node, as wide as twice its width on screen (within MIN_WIDTH…MAX_WIDTH); beside it where
  // the window has no room below (level with its title, or moved up as far as it must), then above it
  // (clear of the toolbar of a selected node); narrower (to MIN_WIDTH) where it fits there so, before
  // it covers the node; never over a panel at the side
  const [open, shut] = openSpan(canvas, rect, rect.top + Math.max(top + 8, 0));
  const [x, y] = [rect.left + left, rect.top + top];
  const wanted = Math.round(Math.min(MAX_WIDTH, Math.max(MIN_WIDTH, 2 * (right - left))));
  const under = Math.max(x, open);
  const beside = (height) => Math.max(0, Math.min(y, window.innerHeight - height)); // level with its title
  const spots = [
    [shut - under, () => [under, rect.top + bottom + GAP]],
    [shut - (rect.left + right + GAP), (width, height) => [rect.left + right + GAP, beside(height)]],
    [x - GAP - open, (width, height) => [x - GAP - width, beside(height)]],
    [shut - under, (width, height) => [under, y - TOOLBAR - GAP - height]],
  ];
  element.style.display = "block";
  const sized = (width) => {
    element.style.maxWidth = `${width}px`;
    return [element.offsetWidth, element.offsetHeight];
  };
  const fits = ([sx, sy], [width, height]) =>
    sx >= open && sy >= 0 && sx + width <= shut && sy + height <= window.innerHeight;
  let placed = null;
  for (const [room, at] of spots) {
    if (Math.min(wanted, room) < MIN_WIDTH) continue;
    const size = sized(Math.min(wanted, Math.floor(room)));
    const spot = at(...size);
    if (fits(spot, size)) {
      placed = spot;
      break;
    }
  }
  if (!placed) {
    const [width, height] = sized(Math.max(MIN_WIDTH, Math.min(wanted, shut - open)));
    placed = [Math.min(under, shut - width), window.innerHeight - height];
  }
  element.style.left = `${Math.round(Math.max(0, Math.min(placed[0], window.innerWidth - element.offsetWidth)))}px`;
  element.style.top = `${Math.round(Math.max(0, placed[1]))}px`;
  element.leanvideoNode = node.id;
}

// Where nodes are page elements ("Nodes 2.0"), the canvas draws no title bar to mark: a circled "i" is
// a page element of its own over each such node's header, left of its badges, where nothing covers it.
const MARKERS = new Map(); // node id -> marker element
let markersDue = 0; // the animation frame that places them, once per frame

function placeMarkers() {
  const shown = new Set();
  // as big as the canvas's marker at this zoom; none where the editor draws nodes in outline (zoomed out)
  const scale = app.canvas?.ds?.scale ?? 1;
  const outlined = app.canvas?.low_quality || scale < 0.6;
  const size = Math.round(14 * scale);
  for (const element of outlined ? [] : document.querySelectorAll(".lg-node[data-node-id]")) {
    const id = element.getAttribute("data-node-id");
    const node = app.graph?.getNodeById?.(id);
    if (!node || !NODES.has(node.type) || !reportOf(node) || node.flags?.collapsed) continue;
    const header = element.querySelector(".lg-node-header") ?? element;
    const bounds = header.getBoundingClientRect();
    const middle = bounds.left + bounds.width / 2;
    const lefts = [...header.querySelectorAll("*")] // the badges at its right end
      .map((child) => child.getBoundingClientRect())
      .filter((rect) => rect.width > 0 && rect.left > middle)
      .map((rect) => rect.left);
    const x = Math.min(bounds.right - 6 * scale, ...lefts) - 4 * scale - size;
    const y = bounds.top + bounds.height / 2 - size / 2;
    if (x < 0 || y < 0 || x + size > window.innerWidth || y + size > window.innerHeight) continue; // away
    const hit = document.elementFromPoint(x + size / 2, y + size / 2);
    if (hit && !element.contains(hit)) continue; // under a panel or another node
    let marker = MARKERS.get(id);
    if (!marker?.isConnected) {
      marker = markerElement();
      MARKERS.set(id, marker);
    }
    Object.assign(marker.style, {
      left: `${Math.round(x)}px`,
      top: `${Math.round(y)}px`,
      width: `${size}px`,
      height: `${size}px`,
      font: `bold ${Math.round(size * 0.64)}px sans-serif`,
      display: "flex",
    });
    shown.add(id);
  }
  for (const [id, marker] of MARKERS) if (!shown.has(id)) marker.style.display = "none";
}

function markerElement() {
  const marker = overlay("leanvideo-report-marker", {
    zIndex: "999", // under the report box
    boxSizing: "border-box",
    border: "1.2px solid currentColor",
    borderRadius: "50%",
    alignItems: "center",
    justifyContent: "center",
    color: "var(--fg-color, #999)",
  });
  marker.textContent = "i";
  return marker;
}

const TOOLBAR = 44; // px above a selected node: the editor's selection toolbox

// A LoRA the server applied to nothing (another model's keys, another size): ComfyUI says so in its log
// only, and the frames are made without it. The server tells the page that queued the prompt, once per
// reason; it is said here as a warning that stays until it is read.
function tellUnappliedLora({ detail }) {
  const text =
    `A LoRA of this run was applied to nothing: ${detail?.reason}. The first of its weights left out: ` +
    `${detail?.first}. The frames are made without them; the server's log lists each.`;
  const toast = app.extensionManager?.toast;
  if (toast?.add) toast.add({ severity: "warn", summary: "LeanVideo: a LoRA did nothing", detail: text });
  else console.warn(`LeanVideo: ${text}`);
}

const EXTENSION = {
  name: "leanvideo.reports",
  async setup() {
    api.addEventListener("leanvideo.report", showLaterReport);
    api.addEventListener("leanvideo.lora_not_applied", tellUnappliedLora);
    api.addEventListener("executing", forget);
    api.addEventListener("execution_cached", markCached);
    trackPrompts();
    trackPointedNode();
    const canvas = app.canvas;
    const onDrawForeground = canvas.onDrawForeground;
    canvas.onDrawForeground = function (ctx, visibleArea) {
      onDrawForeground?.apply(this, arguments);
      placeBox(this);
      markersDue ||= requestAnimationFrame(() => {
        markersDue = 0; // after the node elements took their new places
        placeMarkers();
      });
    };
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      // a run queued in another tab: its report is kept for that tab (keepReport), not put here
      if (onScreen(runningPrompt) && setReport(this, message)) this.setDirtyCanvas(true, true);
    };
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      if (reportOf(this) && !this.flags?.collapsed) drawMarker(this, ctx);
    };
  },
};

// A second copy of the pack in custom_nodes serves this file twice: the first registration is the one.
if (!app.extensions?.some((extension) => extension.name === EXTENSION.name)) {
  app.registerExtension(EXTENSION);
}
