// A parameter-server job's Roles card: each PS's, worker's and the shard queue's latest telemetry
// (GET .../metrics/roles/), patched in place like the ranks table.
import { getJSON } from "../api.js";
import { formatBytes, formatNumber, timeOf } from "../format.js";
import { $, patchRows, textRow } from "./dom.js";

const count = (v) => (typeof v === "number" ? Math.round(v).toLocaleString("en-US") : "–");
const pair = (a, b, fmt) => `${fmt(a)} / ${fmt(b)}`;
const ms = (a, b) => (typeof a === "number" || typeof b === "number" ? `${pair(a, b, formatNumber)} ms` : "–");

function renderQueue(queue) {
  const el = $("ps-queue");
  if (!queue || queue.at === null) {
    el.innerHTML = '<span class="muted">The coordinator has not reported yet.</span>';
    return;
  }
  const epochs = typeof queue.epochs === "number" && queue.epochs > 0 ? ` of ${count(queue.epochs)}` : "";
  const epoch = typeof queue.epoch === "number" ? Math.min(queue.epoch + 1, queue.epochs || Infinity) : null;
  el.textContent = "";
  const parts = [
    ["epoch", `epoch ${count(epoch)}${epochs}`],
    ["done", `${count(queue.done)} done`],
    ["in-progress", `${count(queue.in_progress)} in progress`],
    ["todo", `${count(queue.todo)} to do`],
    ["examples", `${count(queue.examples_done)} examples done`],
    ["requeued", `${count(queue.requeued)} re-queued`],
  ];
  parts.forEach(([key, text], i) => {
    const span = document.createElement("span");
    span.dataset.queue = key;
    span.textContent = text;
    if (i) el.append(" · ");
    el.append(span);
  });
  const when = document.createElement("span");
  when.className = "muted";
  when.textContent = ` (at ${timeOf(queue.at)})`;
  el.append(when);
}

function serverRow(p) {
  const tr = textRow([
    [String(p.index), "num"],
    [p.node, ""],
    [count(p.rows), "num ps-rows"],
    [formatBytes(p.memory_bytes), "num ps-memory"],
    [formatNumber(p.pulls_per_s), "num ps-pulls"],
    [formatNumber(p.pushes_per_s), "num ps-pushes"],
    [ms(p.pull_p50_ms, p.pull_p99_ms), "num ps-pull-latency"],
    [ms(p.push_p50_ms, p.push_p99_ms), "num ps-push-latency"],
    [p.at ? timeOf(p.at) : "not yet", "muted"],
  ]);
  tr.dataset.ps = p.index;
  return tr;
}

function workerRow(w) {
  const tr = textRow([
    [String(w.index), "num"],
    [w.node, ""],
    [w.running ? "running" : "ended", w.running ? "" : "muted"],
    [formatNumber(w.examples_per_s), "num worker-rate"],
    [count(w.examples), "num worker-examples"],
    [pair(w.staleness_mean, w.staleness_max, formatNumber), "num worker-staleness"],
    [w.at ? timeOf(w.at) : "not yet", "muted"],
  ]);
  tr.dataset.worker = w.index;
  return tr;
}

// Fetches and shows the roles' statistics; returns them (null on a page without the card).
export async function refreshRoleStats(jobId) {
  if (!$("ps-servers-body")) return null;
  const stats = await getJSON(`/api/v1/jobs/${jobId}/metrics/roles/`);
  renderQueue(stats.queue);
  const servers = $("ps-servers-body");
  patchRows(servers, stats.ps, (p) => p.index, serverRow);
  if (!stats.ps.length) servers.innerHTML = '<tr><td colspan="9" class="empty">No PS: the job is not placed.</td></tr>';
  const workers = $("ps-workers-body");
  patchRows(workers, stats.workers, (w) => w.index, workerRow);
  if (!stats.workers.length) workers.innerHTML = '<tr><td colspan="7" class="empty">No workers: the job is not placed.</td></tr>';
  return stats;
}
