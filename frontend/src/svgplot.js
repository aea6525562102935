// Small SVG plots for the sweep page, drawn here (no library): a scatter of the objective against
// one quantity (numbers, on a linear or log axis, or categories), and parallel coordinates (one
// polyline per trial across every parameter and the objective). Each plot is an <svg role="img">
// with a text description for screen readers.
import { formatNumber } from "./format.js";

const NS = "http://www.w3.org/2000/svg";

function el(name, attrs = {}, text = null) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

function css(name, fallback) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
}

// An axis for values: numbers (linear or log) or categories (evenly spaced, in the given order).
export function axisFor(values, { log = false, categories = null, integer = false } = {}) {
  if (categories) {
    const keys = categories.map((c) => JSON.stringify(c));
    const n = Math.max(1, keys.length - 1);
    return {
      at: (v) => (keys.length === 1 ? 0.5 : keys.indexOf(JSON.stringify(v)) / n),
      ticks: categories.map((c, i) => [keys.length === 1 ? 0.5 : i / n, String(c)]),
    };
  }
  const nums = values.filter((v) => typeof v === "number" && Number.isFinite(v) && (!log || v > 0));
  let lo = nums.length ? Math.min(...nums) : 0, hi = nums.length ? Math.max(...nums) : 1;
  const f = log ? Math.log10 : (v) => v;
  let a = f(lo), b = f(hi);
  if (a === b) { a -= 0.5; b += 0.5; }
  const at = (v) => (typeof v === "number" && Number.isFinite(v) && (!log || v > 0) ? (f(v) - a) / (b - a) : null);
  const label = (v) => (integer ? String(Math.round(v)) : formatNumber(v));
  const ticks = [0, 0.5, 1].map((t) => [t, label(log ? 10 ** (a + t * (b - a)) : a + t * (b - a))]);
  return { at, ticks };
}

// points: [{x, y, filled, label}]; x and y are axes from axisFor.
export function scatter(container, { title, xLabel, yLabel, points, xAxis, yAxis, width = 360, height = 220 }) {
  const pad = { left: 64, right: 28, top: 10, bottom: 40 };
  const w = width - pad.left - pad.right, h = height - pad.top - pad.bottom;
  const fg = css("--muted", "#8791a0"), line = css("--line", "#2a313c"), accent = css("--accent", "#4aa3ff");
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img", "aria-label": `${title}: ${points.length} trials` });
  svg.append(el("title", {}, title));
  const g = el("g", { transform: `translate(${pad.left},${pad.top})` });
  g.append(el("rect", { x: 0, y: 0, width: w, height: h, fill: "none", stroke: line }));
  for (const [t, text] of xAxis.ticks) {
    g.append(el("line", { x1: t * w, x2: t * w, y1: h, y2: h + 4, stroke: fg }));
    const anchor = t <= 0 ? "start" : t >= 1 ? "end" : "middle";
    g.append(el("text", { x: t * w, y: h + 16, fill: fg, "font-size": 11, "text-anchor": anchor }, text));
  }
  for (const [t, text] of yAxis.ticks) {
    g.append(el("line", { x1: -4, x2: 0, y1: h - t * h, y2: h - t * h, stroke: fg }));
    g.append(el("text", { x: -6, y: h - t * h + 4, fill: fg, "font-size": 11, "text-anchor": "end" }, text));
  }
  g.append(el("text", { x: w / 2, y: h + 34, fill: fg, "font-size": 12, "text-anchor": "middle" }, xLabel));
  g.append(el("text", { x: -50, y: h / 2, fill: fg, "font-size": 12, "text-anchor": "middle", transform: `rotate(-90 -50 ${h / 2})` }, yLabel));
  for (const p of points) {
    const x = xAxis.at(p.x), y = yAxis.at(p.y);
    if (x === null || y === null || x === undefined || y === undefined || x < 0) continue;
    const dot = el("circle", { cx: x * w, cy: h - y * h, r: p.best ? 6 : 4, fill: p.filled ? accent : "none", stroke: accent, "stroke-width": p.best ? 2.5 : 1.5 });
    dot.append(el("title", {}, p.label));
    g.append(dot);
  }
  svg.append(g);
  container.replaceChildren(svg);
}

// dims: [{name, axis}]; lines: [{values: {name: v}, color, best, label}].
export function parallelCoordinates(container, { dims, lines, width = 900, height = 300 }) {
  const pad = { left: 40, right: 60, top: 24, bottom: 30 };
  const w = width - pad.left - pad.right, h = height - pad.top - pad.bottom;
  const fg = css("--muted", "#8791a0"), line = css("--line", "#2a313c");
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img", "aria-label": `Parallel coordinates of ${lines.length} trials over ${dims.length} axes` });
  svg.append(el("title", {}, "Parallel coordinates"));
  const g = el("g", { transform: `translate(${pad.left},${pad.top})` });
  const xOf = (i) => (dims.length === 1 ? w / 2 : (i / (dims.length - 1)) * w);
  dims.forEach((d, i) => {
    const x = xOf(i);
    g.append(el("line", { x1: x, x2: x, y1: 0, y2: h, stroke: line, "stroke-width": 2 }));
    g.append(el("text", { x, y: -8, fill: fg, "font-size": 12, "text-anchor": "middle" }, d.name));
    for (const [t, text] of d.axis.ticks) g.append(el("text", { x: x + 4, y: h - t * h + 4, fill: fg, "font-size": 10 }, text));
  });
  for (const l of [...lines].sort((a, b) => Number(a.best) - Number(b.best))) {
    const pts = dims.map((d, i) => {
      const t = d.axis.at(l.values[d.name]);
      return t === null || t === undefined || t < 0 ? null : `${xOf(i)},${h - t * h}`;
    });
    if (pts.some((p) => p === null)) continue;
    const poly = el("polyline", { points: pts.join(" "), fill: "none", stroke: l.color, "stroke-width": l.best ? 3.5 : 1.4, "stroke-opacity": l.best ? 1 : 0.75 });
    poly.append(el("title", {}, l.label));
    g.append(poly);
  }
  svg.append(g);
  container.replaceChildren(svg);
}
