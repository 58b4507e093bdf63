// The report each LeanVideo node returns as `ui.text` (what Free VRAM freed, what Patch Attention
// patched and why, each INT8 kernel a loader chose), in the editor: once the node has run, a circled
// "i" in its title bar says there is one, and pointing at the node (or selecting it alone) shows the
// report in a box under it. The box is a page element over the canvas, so no node drawn later and no
// text box of a node covers it, and its text keeps its size at any zoom. The node itself never changes:
// not its size, not its widgets; nothing is added to what is saved or submitted.
import { api } from "../../scripts/api.js";
import { app } from "../../scripts/app.js";

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

// The report of a node made again from its workflow (another tab and back, a page reload): the editor
// keeps each node's last output, which the node's own fields lost.
function reportOf(node) {
  if (node.leanvideoReport === undefined) {
    const kept = app.nodeOutputs?.[String(node.id)];
    if (!(kept && node.graph === app.graph && setReport(node, kept))) node.leanvideoReport = null;
  }
  return node.leanvideoReport;
}

// Each node as it starts runs again: the report it showed is an earlier run's, and would stay beside
// the error of this one if it failed. A node served from the cache keeps its report, said to be so.
function forget({ detail }) {
  const node = detail == null ? null : app.graph?.getNodeById?.(detail);
  if (node && NODES.has(node.type)) {
    node.leanvideoReport = null;
    node.leanvideoCached = false;
    node.setDirtyCanvas?.(true, true);
  }
}

function markCached({ detail }) {
  for (const id of detail?.nodes ?? []) {
    const node = app.graph?.getNodeById?.(id);
    if (node && NODES.has(node.type)) node.leanvideoCached = true;
  }
}

let box = null;

function reportBox() {
  if (box?.isConnected) return box;
  box = document.createElement("div");
  box.className = "leanvideo-report";
  Object.assign(box.style, {
    position: "fixed",
    zIndex: "1000", // over the nodes' text boxes, under the editor's menus and dialogs
    pointerEvents: "none",
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
  document.body.appendChild(box);
  return box;
}

function shownNode(canvas) {
  const over = canvas.node_over;
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
  const text = shown.join("\n");
  if (element.textContent !== text) element.textContent = text;
  // under the node, as wide as twice its width on screen (within MIN_WIDTH…MAX_WIDTH); above it where
  // the window has no room below; moved in from the window's edges
  const rect = canvas.canvas.getBoundingClientRect();
  const scale = canvas.ds.scale;
  const [x, bottom] = canvas.ds.convertOffsetToCanvas([node.pos[0], node.pos[1] + node.size[1] + GAP]);
  const titleTop = canvas.ds.convertOffsetToCanvas([0, node.pos[1] - (LiteGraph.NODE_TITLE_HEIGHT ?? 30)])[1];
  element.style.maxWidth = `${Math.round(Math.min(MAX_WIDTH, Math.max(MIN_WIDTH, 2 * node.size[0] * scale)))}px`;
  element.style.display = "block";
  const [width, height] = [element.offsetWidth, element.offsetHeight];
  const below = rect.top + bottom;
  const above = rect.top + titleTop - GAP - height;
  const top = below + height <= window.innerHeight ? below : above >= 0 ? above : window.innerHeight - height;
  element.style.left = `${Math.round(Math.max(0, Math.min(rect.left + x, window.innerWidth - width)))}px`;
  element.style.top = `${Math.round(Math.max(0, top))}px`;
  element.leanvideoNode = node.id;
}

const EXTENSION = {
  name: "leanvideo.reports",
  async setup() {
    api.addEventListener("leanvideo.report", showLaterReport);
    api.addEventListener("executing", forget);
    api.addEventListener("execution_cached", markCached);
    const canvas = app.canvas;
    const onDrawForeground = canvas.onDrawForeground;
    canvas.onDrawForeground = function (ctx, visibleArea) {
      onDrawForeground?.apply(this, arguments);
      placeBox(this);
    };
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (setReport(this, message)) this.setDirtyCanvas(true, true);
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
