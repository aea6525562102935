// The comparison page: one chart per metric with a line per job (charts.js: the job page's shared
// cursor, zoom and min/max bands), by step or by wall time; the hyperparameters that differ and
// each metric's final and best values (GET /api/v1/compare/); a link that reopens the same view.
import { getJSON } from "./api.js";
import { ChartGroup, MetricChart } from "./charts.js";
import { formatNumber } from "./format.js";

const PALETTE = ["#4aa3ff", "#3fb950", "#d29922", "#a371f7", "#f85149", "#39c5cf", "#db61a2", "#8b949e", "#e3b341", "#56d364"];
const $ = (id) => document.getElementById(id);
const config = JSON.parse($("compare-config").textContent);
const colorOf = new Map(config.jobs.map((job, i) => [String(job.id), PALETTE[i % PALETTE.length]]));
const nameOf = new Map(config.jobs.map((job) => [String(job.id), `${job.name} #${job.id}`]));

function chartId(metric) {
  return `m-${metric.replace(/[^\w-]/g, "_")}`;
}

// Buckets of the series API on the chosen axis: by time, a bucket's x is seconds since the job
// started (the API adds it); charts.js reads ``step``/``last_step`` as the x of a bucket.
function onAxis(buckets) {
  if (config.x !== "time") return buckets;
  return buckets.filter((b) => b.x !== null && b.x !== undefined).map((b) => ({ ...b, step: b.x, last_step: b.x }));
}

class ComparePage {
  constructor() {
    this.group = new ChartGroup("compare");
    this.charts = new Map();
    this.container = $("charts");
    for (const [id, color] of colorOf) {
      const swatch = document.querySelector(`[data-swatch="${id}"]`);
      if (swatch) swatch.style.background = color;
    }
    window.addEventListener("resize", () => this.group.charts.forEach((c) => c.resize()));
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () =>
      this.group.charts.forEach((c) => { c.rebuild = true; c.invalidate(); }),
    );
    this.wireZoom();
  }

  chart(metric) {
    let chart = this.charts.get(metric);
    if (!chart) {
      document.getElementById("charts-empty")?.remove();
      chart = new MetricChart(this.group, this.container, {
        id: chartId(metric),
        title: metric,
        yLabel: metric,
        xLabel: config.x === "time" ? "seconds since start" : "step",
      });
      this.charts.set(metric, chart);
    }
    return chart;
  }

  apply(metric, series) {
    const chart = this.chart(metric);
    for (const job of config.jobs) {
      const buckets = series[String(job.id)];
      if (!buckets || !buckets.length) continue;
      chart.seriesFor(String(job.id), { label: nameOf.get(String(job.id)), color: colorOf.get(String(job.id)) }).setBuckets(onAxis(buckets));
    }
    chart.invalidate();
  }

  url(metric) {
    return `/api/v1/compare/series/?${config.query}&metric=${encodeURIComponent(metric)}&points=${config.points}&x=${config.x}`;
  }

  // The first chart from the preloaded request (same URL and credentials as the <link rel=preload>,
  // so Chromium reuses it) and alone: on a busy server nothing queues before it. Then
  // ``afterFirst`` (the tables) and the rest a few at a time.
  async load(afterFirst) {
    if (!config.metrics.length) {
      afterFirst();
      return;
    }
    const [first, ...rest] = config.metrics;
    for (const metric of config.metrics) this.chart(metric);
    try {
      const response = await fetch(config.first_url || this.url(first), { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      this.apply(first, (await response.json()).series || {});
      this.restoreZoom();
    } finally {
      afterFirst();
    }
    const queue = [...rest];
    const worker = async () => {
      while (queue.length) {
        const metric = queue.shift();
        this.apply(metric, (await getJSON(this.url(metric))).series || {});
      }
    };
    await Promise.all([worker(), worker(), worker()]);
  }

  wireZoom() {
    $("zoom-reset").addEventListener("click", () => this.group.resetZoom());
    $("zoom-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const from = Number($("zoom-from").value), to = Number($("zoom-to").value);
      if (Number.isFinite(from) && Number.isFinite(to) && to > from) this.group.setZoom(from, to);
    });
    $("compare-x").addEventListener("change", (ev) => {
      const params = new URLSearchParams(config.query);
      params.set("x", ev.target.value);
      location.assign(`?${params}`);
    });
    this.group.onZoom((zoom) => {
      const unit = config.x === "time" ? "s" : "";
      $("zoom-state").textContent = zoom ? `${config.x === "time" ? "seconds" : "steps"} ${zoom.min}${unit}–${zoom.max}${unit}` : "everything";
      if (zoom) {
        $("zoom-from").value = zoom.min;
        $("zoom-to").value = zoom.max;
      }
      this.updateLink(zoom);
    });
    this.updateLink(null);
  }

  restoreZoom() {
    const from = Number(config.from), to = Number(config.to);
    if (config.from !== null && config.to !== null && Number.isFinite(from) && Number.isFinite(to) && to > from) this.group.setZoom(from, to);
  }

  // The link reopens this comparison: the same jobs, axis and zoom.
  updateLink(zoom) {
    const params = new URLSearchParams(config.query);
    if (config.x === "time") params.set("x", "time");
    if (zoom) {
      params.set("from", zoom.min);
      params.set("to", zoom.max);
    }
    const link = $("compare-link");
    if (link) link.href = `?${params}`;
    history.replaceState(null, "", `?${params}`);
  }
}

function cell(tr, text, { header = false, cls = "" } = {}) {
  const td = document.createElement(header ? "th" : "td");
  if (header) td.scope = tr.parentElement?.tagName === "THEAD" ? "col" : "row";
  td.textContent = text;
  if (cls) td.className = cls;
  tr.append(td);
  return td;
}

function show(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return formatNumber(value);
  return typeof value === "string" ? value : JSON.stringify(value);
}

function jobHeader(table, first) {
  const head = table.createTHead();
  head.replaceChildren();
  const tr = head.insertRow();
  cell(tr, first, { header: true });
  for (const job of config.jobs) {
    const th = cell(tr, nameOf.get(String(job.id)), { header: true });
    th.style.borderBottom = `3px solid ${colorOf.get(String(job.id))}`;
  }
}

function renderTables(data) {
  const hp = $("hp-table");
  jobHeader(hp, "Key");
  const body = hp.tBodies[0];
  body.replaceChildren();
  const keys = Object.keys(data.hyperparameters);
  for (const key of keys) {
    const tr = body.insertRow();
    cell(tr, key, { header: true, cls: "mono" });
    for (const job of config.jobs) cell(tr, show(data.hyperparameters[key][String(job.id)]), { cls: "mono" });
  }
  if (!keys.length) cell(body.insertRow(), "Every hyperparameter is the same in these jobs.", { cls: "empty" });
  $("hp-same").textContent = `${data.same_hyperparameters} the same in every job (not shown)`;

  const values = $("values-table");
  jobHeader(values, "Metric");
  const vbody = values.tBodies[0];
  vbody.replaceChildren();
  for (const [name, metric] of Object.entries(data.metrics)) {
    const tr = vbody.insertRow();
    cell(tr, `${name} (${metric.higher_is_better ? "higher" : "lower"} is better)`, { header: true, cls: "mono" });
    const bests = Object.values(metric.jobs).map((s) => s.best).filter((v) => v !== null);
    const top = bests.length ? (metric.higher_is_better ? Math.max(...bests) : Math.min(...bests)) : null;
    for (const job of config.jobs) {
      const s = metric.jobs[String(job.id)];
      const td = cell(tr, s ? `final ${show(s.final)} @ ${show(s.final_step)} · best ${show(s.best)} @ ${show(s.best_step)}` : "—", { cls: "num" });
      if (s && s.best !== null && s.best === top && bests.length > 1) {
        td.classList.add("best-cell");
        td.title = "the best of these jobs";
      }
    }
  }
  if (!Object.keys(data.metrics).length) cell(vbody.insertRow(), "No metrics reported yet.", { cls: "empty" });
}

if (config.jobs.length) {
  const page = new ComparePage();
  const tables = () =>
    getJSON(`/api/v1/compare/?${config.query}`).then(renderTables).catch((err) => {
      $("charts-error").textContent = `The tables could not load: ${err.message}`;
    });
  page.load(tables).catch((err) => { $("charts-error").textContent = `Charts could not load: ${err.message}`; });
}
