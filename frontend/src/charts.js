// Metric charts on uPlot: a group shares one cursor (hover any chart, all show that step), one
// zoom (drag to zoom, double-click or "Reset zoom" to undo; live points never undo it) and the
// job's round boundaries (a dashed line per resize, restart or failure on every chart).
//
// Each series is kept as buckets {x, mean, min, max}: the query API's downsampled buckets (min and
// max kept) and then live points (min = max = value). Where a series is downsampled the band
// between min and max is drawn, so a spike never hides between two drawn points.
import uPlot from "uplot";
import { formatBytes, formatNumber } from "./format.js";

const PALETTE = ["#4aa3ff", "#3fb950", "#d29922", "#a371f7", "#f85149", "#39c5cf", "#db61a2", "#8b949e"];
// Past this many buckets a series merges its older half pairwise (keeping min and max), so a
// chart left open for days stays as cheap to draw as a fresh one.
const MAX_BUCKETS = 3000;
// Redraws share an animation frame up to this budget; the rest wait for the next frame, so a
// burst of live frames never blocks the page for long.
const FRAME_BUDGET_MS = 8;
// Live frames come 10 times a second; charts redraw at most 4 times a second, each redraw
// taking every point that arrived meanwhile (hover and zoom draw at once, through uPlot).
const MIN_REDRAW_MS = 250;
const REASON_COLORS = { failure: "--bad", node_loss: "--bad", restart: "--warn", resize: "--accent", scale: "--accent" };

function cssVar(name, fallback) {
  const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return value || fallback;
}

function alpha(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

const dirty = new Set();
let frameRequested = false;
let lastDraw = -Infinity;

function drawDirty() {
  frameRequested = false;
  const start = performance.now();
  lastDraw = start;
  for (const chart of dirty) {
    dirty.delete(chart);
    chart.redraw();
    if (performance.now() - start > FRAME_BUDGET_MS) break;
  }
  if (dirty.size) {
    // The rest of this batch: next frame, not a throttle period later.
    frameRequested = true;
    requestAnimationFrame(drawDirty);
  }
}

function requestFrame() {
  if (frameRequested) return;
  frameRequested = true;
  const wait = lastDraw + MIN_REDRAW_MS - performance.now();
  if (wait > 0) setTimeout(() => requestAnimationFrame(drawDirty), wait);
  else requestAnimationFrame(drawDirty);
}

export class Series {
  constructor() {
    this.x = [];
    this.mean = [];
    this.min = [];
    this.max = [];
    this.downsampled = false;
  }

  get length() {
    return this.x.length;
  }

  lastX() {
    return this.x.length ? this.x[this.x.length - 1] : -Infinity;
  }

  // Buckets from /api/v1/jobs/{id}/metrics/: {step, last_step, min, max, mean, count}.
  setBuckets(buckets) {
    this.x = [];
    this.mean = [];
    this.min = [];
    this.max = [];
    this.downsampled = false;
    this.mergeBuckets(buckets);
  }

  // Buckets of a range fetched later (a gap, a reconnect): replaces what the range covered.
  mergeBuckets(buckets) {
    if (!buckets.length) return;
    const lo = buckets[0].step;
    const hi = buckets[buckets.length - 1].last_step;
    const keep = [];
    for (let i = 0; i < this.x.length; i++) if (this.x[i] < lo || this.x[i] > hi) keep.push(i);
    const rows = keep.map((i) => [this.x[i], this.mean[i], this.min[i], this.max[i]]);
    for (const b of buckets) {
      rows.push([b.last_step, b.mean, b.min, b.max]);
      if (b.count > 1) this.downsampled = true;
    }
    rows.sort((a, b) => a[0] - b[0]);
    this.x = rows.map((r) => r[0]);
    this.mean = rows.map((r) => r[1]);
    this.min = rows.map((r) => r[2]);
    this.max = rows.map((r) => r[3]);
    this.compact();
  }

  // Live points [[step, value], ...]; ones at or before the last step are repeats.
  append(points) {
    let added = 0;
    for (const [step, value] of points) {
      if (step <= this.lastX()) continue;
      this.x.push(step);
      this.mean.push(value);
      this.min.push(value);
      this.max.push(value);
      added++;
    }
    if (added) this.compact();
    return added;
  }

  compact() {
    if (this.x.length <= MAX_BUCKETS) return;
    const half = Math.floor(this.x.length / 2) & ~1;
    const x = [], mean = [], min = [], max = [];
    for (let i = 0; i < half; i += 2) {
      x.push(this.x[i + 1]);
      mean.push(avg(this.mean[i], this.mean[i + 1]));
      min.push(lowest(this.min[i], this.min[i + 1]));
      max.push(highest(this.max[i], this.max[i + 1]));
    }
    this.x = x.concat(this.x.slice(half));
    this.mean = mean.concat(this.mean.slice(half));
    this.min = min.concat(this.min.slice(half));
    this.max = max.concat(this.max.slice(half));
    this.downsampled = true;
  }

  valueAt(step) {
    // The bucket at or just before ``step`` (binary search; x is sorted).
    let lo = 0, hi = this.x.length - 1, found = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.x[mid] <= step) { found = mid; lo = mid + 1; } else hi = mid - 1;
    }
    return found;
  }
}

function stepRange(u, min, max) {
  if (min === null || max === null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  return min === max ? [min - 1, max + 1] : [min, max];
}

function padRange(u, min, max) {
  if (min === null || max === null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
  if (min === max) {
    const pad = Math.abs(min) * 0.1 || 1;
    return [min - pad, max + pad];
  }
  return uPlot.rangeNum(min, max, 0.1, true);
}

const avg = (a, b) => (a === null ? b : b === null ? a : (a + b) / 2);
const lowest = (a, b) => (a === null ? b : b === null ? a : Math.min(a, b));
const highest = (a, b) => (a === null ? b : b === null ? a : Math.max(a, b));

export class ChartGroup {
  constructor(key) {
    this.key = key;
    this.charts = [];
    this.boundaries = [];
    this.zoom = null;
    this.listeners = [];
  }

  add(chart) {
    this.charts.push(chart);
    return chart;
  }

  remove(chart) {
    this.charts = this.charts.filter((c) => c !== chart);
  }

  onZoom(fn) {
    this.listeners.push(fn);
  }

  setBoundaries(boundaries) {
    this.boundaries = boundaries;
    this.charts.forEach((c) => c.invalidate());
    if (this.onBoundaries) this.onBoundaries(this.boundaries);
  }

  addBoundary(boundary) {
    if (this.boundaries.some((b) => b.round === boundary.round)) return false;
    this.setBoundaries([...this.boundaries, boundary].sort((a, b) => a.step - b.step));
    return true;
  }

  setZoom(min, max) {
    this.zoom = min < max ? { min, max } : null;
    this.charts.forEach((c) => c.applyZoom());
    this.listeners.forEach((fn) => fn(this.zoom));
  }

  resetZoom() {
    this.setZoom(0, 0);
  }
}

// A chart of one or more series sharing an x axis (steps) and a y axis per unit.
// options: {title, unit, yLabel, xLabel (default "step"), kind ("number" | "bytes" | "seconds" |
// "rate"), height, log}
export class MetricChart {
  constructor(group, container, options) {
    this.group = group;
    this.options = options;
    this.container = container;
    this.series = new Map(); // name -> {data: Series, label, color, dash, width}
    this.plot = null;
    this.hoverIdx = null;
    this.element = document.createElement("figure");
    this.element.className = "chart";
    this.element.dataset.chart = options.id;
    const caption = document.createElement("figcaption");
    caption.className = "chart-head";
    const title = document.createElement("h3");
    title.textContent = options.title;
    title.id = `chart-title-${options.id}`;
    this.legend = document.createElement("div");
    this.legend.className = "chart-legend";
    this.legend.setAttribute("aria-live", "off");
    caption.append(title, this.legend);
    this.canvasBox = document.createElement("div");
    this.canvasBox.className = "chart-canvas";
    this.canvasBox.setAttribute("role", "img");
    this.canvasBox.setAttribute("aria-labelledby", title.id);
    this.empty = document.createElement("p");
    this.empty.className = "muted chart-empty";
    this.empty.textContent = "No points yet.";
    this.element.append(caption, this.canvasBox, this.empty);
    container.append(this.element);
    group.add(this);
  }

  seriesFor(name, style = {}) {
    let entry = this.series.get(name);
    if (!entry) {
      const color = style.color || PALETTE[this.series.size % PALETTE.length];
      entry = { data: new Series(), label: style.label || name, color, dash: style.dash, width: style.width || 1.6 };
      this.series.set(name, entry);
      this.rebuild = true;
    } else if (style.label && (style.label !== entry.label || String(style.dash) !== String(entry.dash) || (style.width || 1.6) !== entry.width || (style.color || entry.color) !== entry.color)) {
      // Compared by value: the rank chart passes a fresh dash array every few seconds, and a
      // changed style means destroying and rebuilding the uPlot instance (a long task).
      Object.assign(entry, { label: style.label, dash: style.dash, width: style.width || 1.6, color: style.color || entry.color });
      this.rebuild = true;
    }
    return entry.data;
  }

  dropSeries(keep) {
    for (const name of [...this.series.keys()]) {
      if (!keep.has(name)) {
        this.series.delete(name);
        this.rebuild = true;
      }
    }
  }

  hasPoints() {
    for (const { data } of this.series.values()) if (data.length) return true;
    return false;
  }

  pointCount() {
    let n = 0;
    for (const { data } of this.series.values()) n += data.length;
    return n;
  }

  invalidate() {
    dirty.add(this);
    requestFrame();
  }

  formatValue(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (this.options.kind === "bytes") return formatBytes(v);
    if (this.options.kind === "seconds") return v < 1 ? `${formatNumber(v * 1000)} ms` : `${formatNumber(v)} s`;
    return formatNumber(v);
  }

  // One x array for all series (uPlot.join aligns series that have different steps).
  data() {
    const entries = [...this.series.values()];
    const tables = entries.map(({ data }) => [data.x, data.mean, data.min, data.max]);
    if (tables.length === 1) return tables[0];
    return uPlot.join(tables);
  }

  build() {
    const entries = [...this.series.values()];
    const axisColor = cssVar("--muted", "#8791a0");
    const gridColor = cssVar("--line", "#2a313c");
    const series = [{ label: "step" }];
    const bands = [];
    entries.forEach((entry, i) => {
      const base = 1 + i * 3;
      series.push({ label: entry.label, stroke: entry.color, width: entry.width, dash: entry.dash, spanGaps: true, points: { show: false } });
      series.push({ label: `${entry.label} min`, stroke: "transparent", width: 0, spanGaps: true, points: { show: false } });
      series.push({ label: `${entry.label} max`, stroke: "transparent", width: 0, spanGaps: true, points: { show: false } });
      if (entry.data.downsampled) bands.push({ series: [base + 2, base + 1], fill: alpha(entry.color, 0.18) });
    });
    const width = Math.max(280, this.canvasBox.clientWidth || 560);
    const unit = this.options.unit ? ` (${this.options.unit})` : "";
    const opts = {
      width,
      height: this.options.height || 200,
      legend: { show: false },
      series,
      bands,
      // A series of one point (a chart's first live frame) or a flat one has a zero-width range,
      // on which uPlot's tick splitting never ends: both axes get a padded range instead.
      scales: { x: { time: false, range: stepRange }, y: this.options.log ? { distr: 3 } : { range: padRange } },
      axes: [
        { label: this.options.xLabel || "step", stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor }, labelSize: 18, size: 36 },
        {
          label: `${this.options.yLabel || this.options.title}${unit}`,
          stroke: axisColor,
          grid: { stroke: gridColor, width: 1 },
          ticks: { stroke: gridColor },
          size: 64,
          labelSize: 18,
          values: (u, vals) => vals.map((v) => this.formatValue(v)),
        },
      ],
      cursor: {
        sync: { key: this.group.key, setSeries: false },
        drag: { x: true, y: false, setScale: false },
        bind: { dblclick: () => null },
        points: { show: false },
      },
      hooks: {
        setSelect: [(u) => this.onSelect(u)],
        setCursor: [(u) => this.onCursor(u)],
        draw: [(u) => this.drawBoundaries(u)],
      },
    };
    if (this.plot) this.plot.destroy();
    this.plot = new uPlot(opts, this.data(), this.canvasBox);
    this.plot.over.addEventListener("dblclick", () => this.group.resetZoom());
    this.rebuild = false;
    this.applyZoom();
  }

  redraw() {
    const has = this.hasPoints();
    this.empty.hidden = has;
    this.canvasBox.hidden = !has;
    if (!has) {
      this.renderLegend();
      return;
    }
    const bandsWanted = [...this.series.values()].some((e) => e.data.downsampled);
    if (!this.plot || this.rebuild || bandsWanted !== this.hadBands) {
      this.hadBands = bandsWanted;
      this.build();
    } else {
      this.plot.setData(this.data(), !this.group.zoom);
      if (this.group.zoom) this.plot.setScale("x", this.group.zoom);
    }
    if (!this.firstDrawn) {
      this.firstDrawn = true;
      performance.mark(`chart-drawn:${this.options.id}`);
    }
    this.renderLegend();
  }

  applyZoom() {
    if (!this.plot) return;
    if (this.group.zoom) this.plot.setScale("x", this.group.zoom);
    else this.plot.setData(this.plot.data, true); // back to the whole range, autoscaled
  }

  resize() {
    if (this.plot) this.plot.setSize({ width: Math.max(280, this.canvasBox.clientWidth), height: this.options.height || 200 });
  }

  onSelect(u) {
    if (u.select.width < 4) return;
    const min = u.posToVal(u.select.left, "x");
    const max = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    this.group.setZoom(Math.round(min), Math.round(max));
  }

  onCursor(u) {
    const idx = u.cursor.idx;
    const step = idx === null || idx === undefined ? null : u.data[0][idx];
    if (step === this.hoverStep) return;
    this.hoverStep = step;
    this.renderLegend();
  }

  // Legend rows are made once per series and then only their text changes: a live redraw
  // touches a text node per series, not the page's layout tree.
  renderLegend() {
    const entries = [...this.series.values()];
    if (!this.legendRows || this.legendRows.length !== entries.length || this.legendRows.some((r, i) => r.entry !== entries[i])) {
      this.legendRows = entries.map((entry) => {
        const item = document.createElement("span");
        item.className = "legend-item";
        const swatch = document.createElement("span");
        swatch.className = "swatch";
        item.append(swatch, document.createTextNode(""));
        return { entry, item, swatch, text: item.lastChild };
      });
      this.legend.replaceChildren(...this.legendRows.map((r) => r.item));
    }
    for (const row of this.legendRows) {
      const { entry } = row;
      const s = entry.data;
      const i = this.hoverStep === null || this.hoverStep === undefined ? s.length - 1 : s.valueAt(this.hoverStep);
      let text = entry.label;
      if (i >= 0) {
        text += ` ${this.formatValue(s.mean[i])}`;
        if (s.min[i] !== s.max[i]) text += ` [${this.formatValue(s.min[i])} – ${this.formatValue(s.max[i])}]`;
        text += ` @ ${s.x[i]}`;
      }
      if (row.text.data !== text) row.text.data = text;
      if (row.color !== entry.color) {
        row.swatch.style.background = entry.color;
        row.color = entry.color;
      }
    }
  }

  drawBoundaries(u) {
    const { ctx, bbox } = u;
    const [xMin, xMax] = [u.scales.x.min, u.scales.x.max];
    ctx.save();
    ctx.font = `${Math.round(11 * devicePixelRatio)}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    for (const b of this.group.boundaries) {
      if (b.step < xMin || b.step > xMax) continue;
      const x = Math.round(u.valToPos(b.step, "x", true)) + 0.5;
      const color = cssVar(REASON_COLORS[b.reason] || "--info", "#a371f7");
      ctx.strokeStyle = color;
      ctx.fillStyle = color;
      ctx.lineWidth = Math.max(1, devicePixelRatio);
      ctx.setLineDash([5 * devicePixelRatio, 4 * devicePixelRatio]);
      ctx.beginPath();
      ctx.moveTo(x, bbox.top);
      ctx.lineTo(x, bbox.top + bbox.height);
      ctx.stroke();
      ctx.fillText(`R${b.round} ${b.reason}${b.world ? ` ·${b.world}` : ""}`, x + 4 * devicePixelRatio, bbox.top + 2);
    }
    ctx.restore();
  }

  destroy() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.group.remove(this);
    dirty.delete(this);
    this.element.remove();
  }
}
