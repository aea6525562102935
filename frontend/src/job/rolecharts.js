// A parameter-server job's role charts: one chart per role (parameter servers, workers, the shard
// queue) instead of a chart per internal series. Each shows one metric, picked in its "Metric"
// select, as a line per process (its "Process" select narrows to one), read from
// GET .../metrics/roles/series/ and refreshed with the Roles card.
//
// Each process counts its own steps: a PS its version (updates applied), a worker its pushes (the
// steps of the loss chart: the workers' chart shares the page's cursor and zoom), the queue the
// examples done. The PS and queue charts therefore have cursor and zoom groups of their own.
import { getJSON } from "../api.js";
import { ChartGroup, MetricChart } from "../charts.js";

const POINTS = 300;

// Known metrics of each role (workers/ps/stats.py, workers/sdk/ps.py): label, unit, value kind.
const KNOWN = {
  ps_rows: ["Rows held", "rows"],
  ps_memory_bytes: ["Memory (RSS)", "bytes", "bytes"],
  ps_bytes_held: ["Parameter bytes held", "bytes", "bytes"],
  ps_pulls_per_s: ["Pulls per second", "pulls/s"],
  ps_pushes_per_s: ["Pushes per second", "pushes/s"],
  ps_pull_p50_ms: ["Pull latency p50", "ms"],
  ps_pull_p99_ms: ["Pull latency p99", "ms"],
  ps_push_p50_ms: ["Push latency p50", "ms"],
  ps_push_p99_ms: ["Push latency p99", "ms"],
  ps_applied_batches: ["Batches applied", "batches"],
  ps_duplicates: ["Duplicate pushes dropped", "pushes"],
  ps_stale: ["Stale pushes refused", "pushes"],
  worker_examples_per_s: ["Examples per second", "examples/s"],
  worker_examples: ["Examples done", "examples"],
  worker_staleness_mean: ["Staleness (mean)", "versions"],
  worker_staleness_max: ["Staleness (max)", "versions"],
  worker_pull_p50_ms: ["Pull latency p50", "ms"],
  worker_pull_p99_ms: ["Pull latency p99", "ms"],
  worker_push_p50_ms: ["Push latency p50", "ms"],
  worker_push_p99_ms: ["Push latency p99", "ms"],
  worker_stale_retries: ["Stale retries", "retries"],
  worker_duplicates: ["Duplicate pushes", "pushes"],
  queue_todo: ["Shards to do", "shards"],
  queue_in_progress: ["Shards in progress", "shards"],
  queue_done: ["Shards done (this epoch)", "shards"],
  queue_requeued: ["Shards re-queued", "shards"],
  queue_workers: ["Workers holding a lease", "workers"],
  queue_epoch: ["Epoch", "epoch"],
};

const FAMILIES = [
  { role: "ps", prefix: "ps_", title: "Parameter servers", each: "PS", xLabel: "PS version (updates applied)", first: "ps_pushes_per_s", sharedGroup: false },
  { role: "worker", prefix: "worker_", title: "Workers", each: "worker", xLabel: "step (the worker's pushes)", first: "worker_examples_per_s", sharedGroup: true },
  { role: "coordinator", prefix: "queue_", title: "Shard queue", each: null, xLabel: "examples done", first: "queue_todo", sharedGroup: false },
];
// Constant for a run, or shown elsewhere (the progress card, the Roles card).
const NOT_CHARTED = new Set(["queue_epochs", "queue_shards_per_epoch", "queue_examples_per_epoch", "queue_examples_done"]);

export const ROLE_SERIES = /^(ps|worker|queue)_/;

function labelOf(name) {
  return (KNOWN[name] || [name])[0];
}

function select(id, label, onChange) {
  const wrap = document.createElement("span");
  wrap.className = "inline-form";
  const tag = document.createElement("label");
  tag.htmlFor = id;
  tag.textContent = label;
  const el = document.createElement("select");
  el.id = id;
  el.addEventListener("change", onChange);
  wrap.append(tag, el);
  return { wrap, el };
}

class RoleChart {
  constructor(jobId, family, container, group, names) {
    this.jobId = jobId;
    this.family = family;
    this.round = null;
    this.names = new Set([...Object.keys(KNOWN), ...names].filter((n) => n.startsWith(family.prefix) && !NOT_CHARTED.has(n)));
    this.metric = this.names.has(family.first) ? family.first : [...this.names][0];
    this.indexes = [];
    this.generation = 0; // bumped when the metric or the process changes
    this.inflight = null;
    this.chart = new MetricChart(group, container, { id: `role-${family.role}`, title: family.title, xLabel: family.xLabel, ...this.axis() });
    this.chart.element.classList.add("role-chart");
    const tools = document.createElement("div");
    tools.className = "chart-tools role-tools";
    this.metricSelect = select(`role-${family.role}-metric`, "Metric", () => this.choose()).el;
    tools.append(this.metricSelect.parentElement);
    if (family.each) {
      this.processSelect = select(`role-${family.role}-process`, "Process", () => this.reload()).el;
      tools.append(this.processSelect.parentElement);
    }
    // What the x axis counts, in words too (the axis title is drawn on the canvas).
    const x = document.createElement("span");
    x.className = "muted role-x";
    x.textContent = `steps: ${family.xLabel}`;
    tools.append(x);
    this.chart.element.querySelector("figcaption").append(tools);
    this.fillMetrics();
  }

  // The y axis is titled by the unit alone (the select names the metric): long titles do not fit.
  axis() {
    const [label, unit, kind] = KNOWN[this.metric] || [this.metric, ""];
    return { yLabel: unit || label, unit: "", kind: kind || "number" };
  }

  fillMetrics() {
    const names = [...this.names].sort((a, b) => labelOf(a).localeCompare(labelOf(b)));
    this.metricSelect.replaceChildren(...names.map((n) => new Option(labelOf(n), n, false, n === this.metric)));
  }

  // The process select: "every PS" or one of them (the round's processes, from the last answer).
  fillProcesses(indexes) {
    if (!this.processSelect || String(indexes) === String(this.indexes)) return;
    this.indexes = indexes;
    const chosen = this.processSelect.value;
    const options = [new Option(`every ${this.family.each} (${indexes.length})`, "")];
    indexes.forEach((i) => options.push(new Option(`${this.family.each} ${i}`, String(i))));
    this.processSelect.replaceChildren(...options);
    this.processSelect.value = indexes.map(String).includes(chosen) ? chosen : "";
  }

  choose() {
    this.metric = this.metricSelect.value;
    Object.assign(this.chart.options, this.axis());
    this.reload();
  }

  // A new metric or process: what is held goes, and any answer still on its way is ignored.
  reload() {
    this.generation += 1;
    this.inflight = null;
    this.chart.dropSeries(new Set());
    this.chart.invalidate();
    return this.refresh().catch(() => {});
  }

  // One request at a time: a refresh asked for while one runs shares it.
  refresh() {
    if (!this.inflight) {
      const generation = this.generation;
      this.inflight = this.fetch(generation).finally(() => {
        if (generation === this.generation) this.inflight = null;
      });
    }
    return this.inflight;
  }

  seriesName(index) {
    return this.family.each ? `${this.family.each} ${index}` : "queue";
  }

  // Each shown process's history once, then only the steps after the last one held.
  async fetch(generation) {
    const shown = this.processSelect && this.processSelect.value !== "" ? [Number(this.processSelect.value)] : null;
    const held = [...this.chart.series.values()].map((entry) => (entry.data.length ? entry.data.lastX() : null));
    const from = held.length && !held.includes(null) ? Math.min(...held) + 1 : null;
    const params = new URLSearchParams({ role: this.family.role, name: this.metric, points: String(POINTS) });
    if (from !== null) params.set("from", String(from));
    const body = await getJSON(`/api/v1/jobs/${this.jobId}/metrics/roles/series/?${params}`);
    if (generation !== this.generation) return; // another metric or process was picked meanwhile
    if (this.round !== null && body.round !== this.round) {
      this.chart.dropSeries(new Set()); // a new round: its processes start their own counts
      this.round = body.round;
      return this.fetch(generation);
    }
    this.round = body.round;
    const indexes = Object.keys(body.series).map(Number).sort((a, b) => a - b);
    this.fillProcesses(indexes);
    const keep = new Set();
    for (const index of indexes) {
      if (shown && !shown.includes(index)) continue;
      const name = this.seriesName(index);
      keep.add(name);
      const fresh = !this.chart.series.has(name);
      const series = this.chart.seriesFor(name);
      if (fresh || from === null) series.setBuckets(body.series[String(index)]);
      else series.mergeBuckets(body.series[String(index)]);
    }
    this.chart.dropSeries(keep);
    this.chart.invalidate();
  }
}

export class RoleCharts {
  // mainGroup: the page's chart group (the workers' chart joins it); names: the job's metric names.
  constructor(jobId, container, mainGroup, names) {
    this.charts = FAMILIES.map((family) => {
      const group = family.sharedGroup ? mainGroup : new ChartGroup(`job-${jobId}-${family.role}`);
      return new RoleChart(jobId, family, container, group, names);
    });
    window.addEventListener("resize", () => this.charts.forEach((c) => c.chart.resize()));
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () =>
      this.charts.forEach(({ chart }) => { chart.rebuild = true; chart.invalidate(); }),
    );
  }

  refresh() {
    return Promise.all(this.charts.map((c) => c.refresh().catch(() => {})));
  }
}
