// Where the report box and markers of reports.js may go on the page: whether a point shows the canvas
// (not a panel or menu over it), whether a node is in sight, the span between the panels at the
// canvas's sides; and the pass-through page elements they are made of. No state of its own.

// A page element fixed over the editor that the pointer passes through: the report box, a marker.
export function overlay(className, style) {
  const element = document.createElement("div");
  element.className = className;
  Object.assign(element.style, { position: "fixed", pointerEvents: "none", ...style });
  document.body.appendChild(element);
  return element;
}

// Whether the node (its screen rectangle in the canvas) is in view: within the canvas, and its title
// not under a panel drawn over the canvas (a sidebar).
export function inSight(canvas, rect, [left, top, right, bottom]) {
  if (right < 0 || bottom < 0 || left > rect.width || top > rect.height) return false;
  const py = rect.top + Math.min(Math.max(top + 8, 0), rect.height - 1);
  // its title's left end, middle and right end: a node half under a panel is still in sight
  return [left + 8, (left + right) / 2, right - 8].some((x) =>
    showsCanvas(canvas, rect.left + Math.min(Math.max(x, 0), rect.width - 1), py),
  );
}

// Whether the window point (x, y) shows the canvas: the canvas itself or a node on it, not a panel or
// menu over it (the report box and markers let the pointer through, so they are never hit).
export function showsCanvas(canvas, x, y) {
  const hit = document.elementFromPoint(x, y);
  return !hit || hit === canvas.canvas || !!hit.closest?.("[data-node-id], .dom-widget");
}

// The span of the window's width, at height y, where the canvas shows between the panels at its sides
// (the icon bar, a sidebar): [left, right) in window pixels. Panels run from an edge, so each end is
// found by halving the distance from the canvas's middle, where nothing is drawn over it.
export function openSpan(canvas, rect, y) {
  const shows = (x) => showsCanvas(canvas, x, y);
  const edge = (inside, outside) => {
    if (shows(outside)) return outside;
    while (Math.abs(outside - inside) > 4) {
      const half = (inside + outside) / 2;
      if (shows(half)) inside = half;
      else outside = half;
    }
    return inside;
  };
  const middle = Math.min(Math.max(rect.left + rect.width / 2, 0), window.innerWidth - 1);
  if (!shows(middle)) return [0, window.innerWidth];
  return [Math.ceil(edge(middle, Math.max(rect.left, 0))), Math.floor(edge(middle, Math.min(rect.right, window.innerWidth) - 1)) + 1];
}
