// Which chart each metric goes on, and loading them: history from the downsampled query API,
// then live frames appended; gaps (a dropped frame, a reconnect, polling) refetched by range.
import { getJSON } from "./api.js";
import { ChartGroup, MetricChart } from "./charts.js";

// In page order. Every stored name lands on exactly one chart: the first whose test matches, or
// a chart of its own ("other"). total_steps is the script's progress total, not a signal.
export const CHART_KINDS = [
  { id: "loss", title: "Loss", yLabel: "loss", test: (n) => /(^|[_/])loss$/.test(n) && !n.startsWith("grad") },
  { id: "grad", title: "Gradient norm (global)", yLabel: "‖grad‖₂", test: (n) => n === "grad_norm" },
  { id: "samples", title: "Throughput", yLabel: "samples", unit: "samples/s", test: (n) => n === "samples_per_s" || n === "throughput" },
  { id: "tokens", title: "Token throughput", yLabel: "tokens", unit: "tokens/s", test: (n) => n === "tokens_per_s" },
  { id: "lr", title: "Learning rate", yLabel: "lr", test: (n) => /^(lr|learning_rate)(\/|_|$)/.test(n) },
  // Sampled by the agent for every job, plain scripts too (workers/agent/hangwatch.py).
  { id: "res_cpu", title: "CPU (process and children)", yLabel: "CPU", unit: "% of a core", test: (n) => n === "res_cpu_percent" },
  { id: "res_memory", title: "Resident memory (process and children)", yLabel: "RSS", unit: "bytes", kind: "bytes", test: (n) => n === "res_memory_bytes" },
  { id: "res_gpu_util", title: "GPU utilisation", yLabel: "GPU", unit: "%", test: (n) => n === "res_gpu_util_percent" },
  { id: "res_gpu_memory", title: "GPU memory", yLabel: "GPU memory", unit: "bytes", kind: "bytes", test: (n) => n === "res_gpu_memory_bytes" },
  { id: "memory", title: "Memory", yLabel: "peak memory", unit: "bytes", kind: "bytes", test: (n) => /memory/.test(n) },
  { id: "eval", title: "Evaluation", yLabel: "score", test: (n) => /^(accuracy|acc|auc|ctr|perplexity|f1|precision|recall)$/.test(n) },
  { id: "params", title: "Parameter norm", yLabel: "‖θ‖₂", test: (n) => n === "param_norm" },
  { id: "update", title: "Update / parameter ratio", yLabel: "‖Δθ‖/‖θ‖", test: (n) => n === "update_ratio" },
];
export const STEP_TIME_NAMES = ["step_time_s", "step_time"];
const NOT_CHARTED = new Set(["total_steps"]);
const LAYER_PREFIX = "grad_norm/";
// Buckets per series on first load: about a chart's width in pixels.
const HISTORY_POINTS = 600;
const RANK_POINTS = 300;

export function chartIdFor(name) {
  if (NOT_CHARTED.has(name) || STEP_TIME_NAMES.includes(name)) return null;
  if (name.startsWith(LAYER_PREFIX)) return "layers";
  const kind = CHART_KINDS.find((k) => k.test(name));
  return kind ? kind.id : `other:${name}`;
}

export class JobCharts {
  // skip(name): a series charted elsewhere (a parameter-server job's role series: job/rolecharts.js).
  constructor(jobId, container, { names, onTotal, skip }) {
    this.jobId = jobId;
    this.skip = skip || (() => false);
    this.container = container;
    this.group = new ChartGroup(`job-${jobId}`);
    this.charts = new Map();
    this.names = new Set(names);
    this.layers = false;
    this.onTotal = onTotal || (() => {});
    this.rankChart = null;
    this.ranks = [];
    window.addEventListener("resize", () => this.group.charts.forEach((c) => c.resize()));
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () =>
      this.group.charts.forEach((c) => { c.rebuild = true; c.invalidate(); }),
    );
  }

  chart(id) {
    let chart = this.charts.get(id);
    if (chart) return chart;
    let options;
    if (id === "layers") options = { id, title: "Gradient norm per layer", yLabel: "‖grad‖₂", log: false };
    else if (id.startsWith("other:")) options = { id: id.replace(/[^\w-]/g, "_"), title: id.slice(6), yLabel: id.slice(6) };
    else options = { ...CHART_KINDS.find((k) => k.id === id) };
    document.getElementById("charts-empty")?.remove();
    chart = new MetricChart(this.group, this.container, options);
    // Keep page order stable: known kinds first, in CHART_KINDS order, then the rest by name.
    this.charts.set(id, chart);
    this.order();
    return chart;
  }

  order() {
    const rank = (id) => {
      const i = CHART_KINDS.findIndex((k) => k.id === id);
      if (i >= 0) return i;
      if (id === "steptime") return CHART_KINDS.length;
      if (id === "layers") return CHART_KINDS.length + 1;
      return CHART_KINDS.length + 2;
    };
    const ids = [...this.charts.keys()].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    ids.forEach((id) => this.container.append(this.charts.get(id).element));
  }

  namesFor(id) {
    return [...this.names].filter((n) => chartIdFor(n) === id);
  }

  wanted(name) {
    const id = chartIdFor(name);
    return id !== null && (id !== "layers" || this.layers) && !this.skip(name);
  }

  async fetchSeries(names, params = "") {
    if (!names.length) return {};
    const url = `/api/v1/jobs/${this.jobId}/metrics/?name=${encodeURIComponent(names.join(","))}&points=${HISTORY_POINTS}${params}`;
    const body = await getJSON(url);
    return body.series || {};
  }

  // History: the loss chart first and alone (what people look at; on a busy server its request
  // should not queue behind the others), then ``afterFirst`` (the page's other requests) and the
  // rest of the charts in one request.
  async load(firstUrl, afterFirst = () => {}) {
    const byChart = new Map();
    for (const name of this.names) {
      if (!this.wanted(name)) continue;
      const id = chartIdFor(name);
      if (!byChart.has(id)) byChart.set(id, []);
      byChart.get(id).push(name);
      this.chart(id);
    }
    const apply = (series) => {
      for (const [name, buckets] of Object.entries(series)) {
        this.chart(chartIdFor(name)).seriesFor(name).setBuckets(buckets);
        this.chart(chartIdFor(name)).invalidate();
      }
    };
    try {
      // The page preloads this exact URL (<link rel="preload">) while the script loads.
      // Same URL, mode and credentials as the preload (and no custom header), so Chromium reuses it.
      if (firstUrl) {
        const response = await fetch(firstUrl, { credentials: "same-origin" });
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        apply((await response.json()).series || {});
      }
      else apply(await this.fetchSeries(byChart.get("loss") || []));
    } finally {
      afterFirst();
    }
    apply(await this.fetchSeries([...byChart.entries()].filter(([id]) => id !== "loss").flatMap(([, n]) => n)));
  }

  async setLayers(on) {
    this.layers = on;
    const existing = this.charts.get("layers");
    if (!on) {
      if (existing) existing.destroy();
      this.charts.delete("layers");
      return;
    }
    const names = this.namesFor("layers").slice(0, 40);
    const chart = this.chart("layers");
    const series = await this.fetchSeries(names);
    for (const [name, buckets] of Object.entries(series)) {
      chart.seriesFor(name, { label: name.slice(LAYER_PREFIX.length) }).setBuckets(buckets);
    }
    chart.invalidate();
  }

  // A live frame: {"series": {name: [[step, value], ...]}, "round": R}.
  appendFrame(series) {
    for (const [name, points] of Object.entries(series || {})) {
      if (!this.names.has(name)) this.names.add(name);
      if (name === "total_steps") {
        const last = points[points.length - 1];
        if (last && last[1]) this.onTotal(last[1]);
        continue;
      }
      if (!this.wanted(name)) continue;
      const id = chartIdFor(name);
      const chart = this.chart(id);
      const label = id === "layers" ? { label: name.slice(LAYER_PREFIX.length) } : {};
      if (chart.seriesFor(name, label).append(points)) chart.invalidate();
    }
  }

  lastStep() {
    let last = -1;
    for (const chart of this.charts.values()) {
      if (chart === this.rankChart) continue;
      for (const { data } of chart.series.values()) if (data.length) last = Math.max(last, data.lastX());
    }
    return last;
  }

  minLastStep() {
    let last = Infinity;
    for (const [id, chart] of this.charts) {
      if (id === "steptime") continue;
      for (const { data } of chart.series.values()) if (data.length) last = Math.min(last, data.lastX());
    }
    return Number.isFinite(last) ? last : 0;
  }

  // Everything after the oldest series' last step: after a gap notice, a reconnect, or each poll.
  async refetchSince(step) {
    const names = [...this.names].filter((n) => this.wanted(n));
    const series = await this.fetchSeries(names, `&from=${Math.max(0, step)}`);
    for (const [name, buckets] of Object.entries(series)) {
      if (!buckets.length) continue;
      const chart = this.chart(chartIdFor(name));
      chart.seriesFor(name).mergeBuckets(buckets);
      chart.invalidate();
    }
  }

  // Step time per rank, with stragglers drawn thick and dashed; fetched every few seconds (live
  // frames carry rank 0 only).
  async loadRanks(ranks, stragglers) {
    const name = STEP_TIME_NAMES.find((n) => this.names.has(n)) || STEP_TIME_NAMES[0];
    if (!ranks.length || !this.names.has(name)) return;
    if (!this.rankChart) {
      document.getElementById("charts-empty")?.remove();
      this.rankChart = new MetricChart(this.group, this.container, {
        id: "steptime",
        title: "Step time per rank",
        yLabel: "step time",
        unit: "s",
        kind: "seconds",
      });
      this.charts.set("steptime", this.rankChart);
      this.order();
    }
    // Each rank's whole history once, then only the steps after the last one held (a narrow
    // range the API answers from raw points, cheap however long the run).
    const held = ranks.map((r) => {
      const entry = this.rankChart.series.get(`rank ${r}`);
      return entry && entry.data.length ? entry.data.lastX() : null;
    });
    const results = await Promise.all(
      ranks.map((r, i) =>
        getJSON(
          `/api/v1/jobs/${this.jobId}/metrics/?name=${name}&rank=${r}&points=${RANK_POINTS}` +
            (held[i] === null ? "" : `&from=${held[i] + 1}`),
        ),
      ),
    );
    const keep = new Set();
    ranks.forEach((rank, i) => {
      const key = `rank ${rank}`;
      const buckets = (results[i].series || {})[name] || [];
      // A rank that never timed a step (a parameter-server job's PS and coordinator) has no line.
      if (held[i] === null && !buckets.length) return;
      keep.add(key);
      const straggler = stragglers.has(rank);
      const series = this.rankChart.seriesFor(key, {
        label: straggler ? `rank ${rank} ⚠ straggler` : `rank ${rank}`,
        dash: straggler ? [6, 3] : undefined,
        width: straggler ? 3 : 1.4,
        color: straggler ? "#f85149" : undefined,
      });
      if (held[i] === null) series.setBuckets(buckets);
      else series.mergeBuckets(buckets);
    });
    this.rankChart.dropSeries(keep);
    this.rankChart.invalidate();
  }
}
