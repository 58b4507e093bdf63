// The report each LeanVideo node returns as `ui.text` (what Free VRAM freed, what Patch Attention
// patched and why, each INT8 kernel a loader chose), in the editor: once the node has run, a circled
// "i" in its title bar says there is one, and selecting the node (or pointing at it) shows it in a box
// under the node, over whatever is there, wrapped to a readable width. The node itself never changes: not its size
// (it would cover its neighbours), not its widgets; nothing is added to what is saved or submitted.
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
const LINE_HEIGHT = 14;
const MAX_LINES = 40;
const MAX_WIDTH = 640;
const PADDING = 8;
const FONT = "11px monospace";

function reportLines(message) {
  const text = message?.text;
  if (!Array.isArray(text) || text.length === 0) return null;
  return text.map(String).join("\n").split("\n");
}

// Lines cut at spaces (or anywhere, for a long path) to fit `width`; at most MAX_LINES in all.
function wrap(ctx, lines, width) {
  const wrapped = [];
  for (const line of lines) {
    let rest = line;
    while (ctx.measureText(rest).width > width) {
      let cut = rest.length;
      while (cut > 1 && ctx.measureText(rest.slice(0, cut)).width > width) cut -= 1;
      const space = rest.lastIndexOf(" ", cut);
      const at = space > cut / 2 ? space : cut;
      wrapped.push(rest.slice(0, at));
      rest = "    " + rest.slice(at).trimStart();
    }
    wrapped.push(rest);
  }
  if (wrapped.length > MAX_LINES) {
    const more = wrapped.length - MAX_LINES + 1;
    return [...wrapped.slice(0, MAX_LINES - 1), `… ${more} more line(s): the prompt's history has them all`];
  }
  return wrapped;
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

function drawReport(node, ctx) {
  ctx.save();
  ctx.font = FONT;
  const width = Math.max(node.size[0], Math.min(MAX_WIDTH, node.size[0] * 2)) - 2 * PADDING;
  const lines = wrap(ctx, node.leanvideoReport, width);
  const widest = Math.max(...lines.map((line) => ctx.measureText(line).width));
  const boxWidth = Math.min(width, widest) + 2 * PADDING + 4;
  const top = node.size[1] + 6;
  ctx.fillStyle = "rgba(20, 20, 20, 0.94)";
  ctx.strokeStyle = "#666";
  ctx.beginPath();
  ctx.rect(0, top, boxWidth, lines.length * LINE_HEIGHT + PADDING);
  ctx.fill();
  ctx.stroke();
  ctx.fillStyle = "#ddd";
  lines.forEach((line, index) => ctx.fillText(line, PADDING, top + (index + 1) * LINE_HEIGHT));
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

const EXTENSION = {
  name: "leanvideo.reports",
  async setup() {
    api.addEventListener("leanvideo.report", showLaterReport);
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const lines = reportLines(message);
      if (!lines) return;
      this.leanvideoReportToken = reportToken(message);
      this.leanvideoReport = LATER_REPORTS.get(this.leanvideoReportToken) ?? lines;
      this.setDirtyCanvas(true, true);
    };
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      if (!this.leanvideoReport) return;
      drawMarker(this, ctx);
      const shown = this.selected || this.is_selected || this.mouseOver;
      if (!this.flags?.collapsed && shown) drawReport(this, ctx);
    };
  },
};

// A second copy of the pack in custom_nodes serves this file twice: the first registration is the one.
if (!app.extensions?.some((extension) => extension.name === EXTENSION.name)) {
  app.registerExtension(EXTENSION);
}
