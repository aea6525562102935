// The Goodput card: the job's wall time split into productive step time and badput buckets
// (GET /api/v1/jobs/<id>/goodput/?bins=N, console/telemetry/goodput.py), drawn as a stacked bar
// over time (N equal slices of the job's life, each a column of its buckets' shares) with a
// legend of seconds and shares. Colours are fixed per bucket so two jobs' bars read alike.
import { getJSON } from "../api.js";
import { $ } from "./dom.js";

const BINS = 60;
const SVG = "http://www.w3.org/2000/svg";
export const BUCKETS = [
  ["productive", "productive", "#3fb950"],
  ["queued", "queued", "#8b949e"],
  ["starting", "starting", "#58a6ff"],
  ["restoring", "restoring after a failure", "#f85149"],
  ["membership", "membership change", "#bc8cff"],
  ["redone", "work redone", "#ff7b72"],
  ["checkpoint", "checkpoint blocking", "#d29922"],
  ["data", "data waits", "#39c5cf"],
  ["hung", "hung", "#db61a2"],
  ["ending", "ending", "#6e7681"],
];

function seconds(value) {
  if (value >= 3600) return `${(value / 3600).toFixed(1)} h`;
  if (value >= 60) return `${(value / 60).toFixed(1)} min`;
  return `${value.toFixed(1)} s`;
}

const percent = (part, whole) => (whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : "—");

function drawBar(svg, bins) {
  const width = 600;
  const height = 60;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const columns = bins.map((bin, i) => {
    const total = BUCKETS.reduce((sum, [key]) => sum + (bin[key] || 0), 0);
    const group = document.createElementNS(SVG, "g");
    group.dataset.bin = String(i);
    let y = height;
    const x = (i * width) / bins.length;
    const w = width / bins.length;
    for (const [key, label, colour] of BUCKETS) {
      const value = bin[key] || 0;
      if (!total || value <= 0) continue;
      const h = (value / total) * height;
      y -= h;
      const rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("x", x.toFixed(2));
      rect.setAttribute("y", y.toFixed(2));
      rect.setAttribute("width", (w + 0.3).toFixed(2));
      rect.setAttribute("height", h.toFixed(2));
      rect.setAttribute("fill", colour);
      rect.dataset.bucket = key;
      const title = document.createElementNS(SVG, "title");
      title.textContent = `${label}: ${seconds(value)} (${percent(value, total)} of this slice)`;
      rect.append(title);
      group.append(rect);
    }
    return group;
  });
  svg.replaceChildren(...columns);
}

function legendItem([key, label, colour], totals, wall) {
  const li = document.createElement("li");
  li.dataset.bucket = key;
  const swatch = document.createElement("span");
  swatch.className = "swatch";
  swatch.style.background = colour;
  const name = document.createElement("span");
  name.textContent = label;
  const figure = document.createElement("span");
  figure.className = "num";
  figure.textContent = `${seconds(totals[key] || 0)} · ${percent(totals[key] || 0, wall)}`;
  li.append(swatch, name, " ", figure);
  return li;
}

export function renderGoodput(body) {
  const wall = body.wall_seconds || 0;
  const totals = body.seconds || {};
  $("goodput-figure").textContent =
    body.goodput == null ? "no wall time yet" : `${(100 * body.goodput).toFixed(1)}% productive of ${seconds(wall)}`;
  const svg = $("goodput-bar");
  drawBar(svg, body.bins || []);
  const shown = BUCKETS.filter(([key]) => key === "productive" || (totals[key] || 0) > 0);
  svg.setAttribute(
    "aria-label",
    `Goodput over the job's life: ${shown.map(([key, label]) => `${label} ${percent(totals[key] || 0, wall)}`).join(", ")}`,
  );
  $("goodput-legend").replaceChildren(...shown.map((b) => legendItem(b, totals, wall)));
}

export async function refreshGoodput(jobId) {
  renderGoodput(await getJSON(`/api/v1/jobs/${jobId}/goodput/?bins=${BINS}`));
}
