// The report each LeanVideo node returns as `ui.text` (what Free VRAM freed, what Patch Attention
// patched and why, each INT8 kernel a loader chose), drawn under the node's widgets in the editor once
// the node has run. Drawn, not a widget: no value is added to what is saved or submitted; the node
// grows to show it (its size is saved, as any node's).
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
const MAX_WIDTH = 720;
const FONT = "11px monospace";

function reportLines(message) {
  const text = message?.text;
  if (!Array.isArray(text) || text.length === 0) return null;
  const lines = text.join("\n").split("\n");
  if (lines.length > MAX_LINES) {
    const more = lines.length - MAX_LINES + 1;
    return [...lines.slice(0, MAX_LINES - 1), `… ${more} more line(s): the prompt's history has them all`];
  }
  return lines;
}

function fitToReport(node) {
  const lines = node.leanvideoReport;
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = FONT;
  const widest = Math.max(...lines.map((line) => ctx.measureText(line).width)) + 20;
  const base = node.computeSize();
  node.leanvideoReportTop = base[1];
  node.setSize([
    Math.max(node.size[0], Math.min(widest, MAX_WIDTH)),
    base[1] + lines.length * LINE_HEIGHT + 8,
  ]);
}

const EXTENSION = {
  name: "leanvideo.reports",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const lines = reportLines(message);
      if (!lines) return;
      this.leanvideoReport = lines;
      fitToReport(this);
      this.setDirtyCanvas(true, true);
    };
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      if (!this.leanvideoReport || this.flags?.collapsed) return;
      const top = this.leanvideoReportTop ?? this.computeSize()[1];
      ctx.save();
      ctx.beginPath();
      ctx.rect(0, top, this.size[0], this.size[1] - top);
      ctx.clip();
      ctx.font = FONT;
      ctx.fillStyle = LiteGraph.NODE_TEXT_COLOR ?? "#aaa";
      this.leanvideoReport.forEach((line, index) => {
        ctx.fillText(line, 10, top + (index + 1) * LINE_HEIGHT);
      });
      ctx.restore();
    };
  },
};

// A second copy of the pack in custom_nodes serves this file twice: the first registration is the one.
if (!app.extensions?.some((extension) => extension.name === EXTENSION.name)) {
  app.registerExtension(EXTENSION);
}
