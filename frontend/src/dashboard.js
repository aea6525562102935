// Dashboard, job list and node list: live rows from /ws/cluster/, polling /live/ otherwise.
import { apiRequest, getJSON } from "./api.js";
import { subscribe } from "./live.js";
import { age, progressFraction, progressLabel, setBadge } from "./format.js";

// The summary cards are server-rendered; after changes arrive they are fetched again, at most
// every few seconds however busy the cluster is.
let summaryTimer = null;
async function refreshSummary() {
  summaryTimer = null;
  try {
    const response = await fetch(location.pathname + location.search, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const id of ["cluster-summary", "pending-queue"]) {
      const next = fresh.getElementById(id);
      const current = document.getElementById(id);
      if (next && current) current.replaceWith(next);
    }
  } catch {
    // The next change tries again.
  }
}
function summaryChanged() {
  if (!summaryTimer) summaryTimer = setTimeout(refreshSummary, 1500);
}

const unseenJobs = new Set();
function noteNewJob(job) {
  const table = document.getElementById("job-table");
  // Only a fresh submission (PENDING) on an unfiltered first page is news; any other job missing
  // from the table is simply on another page.
  if (!table || unseenJobs.has(job.id) || job.state !== "PENDING" || location.search) return;
  unseenJobs.add(job.id);
  let notice = document.getElementById("new-jobs");
  if (!notice) {
    notice = document.createElement("a");
    notice.id = "new-jobs";
    notice.className = "new-jobs";
    notice.href = location.pathname;
    table.parentElement.insertBefore(notice, table);
  }
  notice.textContent = `${unseenJobs.size} new job${unseenJobs.size > 1 ? "s" : ""} · show`;
}

function updateJobRow(job) {
  if (job.state === "PENDING" || document.querySelector(`#pending-queue [data-job-id="${job.id}"]`)) summaryChanged();
  const row = document.querySelector(`#job-table tr[data-job-id="${job.id}"]`);
  if (!row) {
    noteNewJob(job);
    return;
  }
  const badge = row.querySelector('[data-field="state"]');
  const changed = badge && badge.textContent !== job.state;
  setBadge(badge, job.state);
  const round = row.querySelector('[data-field="round"]');
  if (round && job.round !== undefined) round.textContent = job.round;
  const restarts = row.querySelector('[data-field="restarts"]');
  if (restarts && job.restarts !== undefined) {
    const [, max] = restarts.textContent.split("/");
    restarts.textContent = `${job.restarts}/${max ?? "?"}`;
  }
  const progress = row.querySelector('[data-field="progress"]');
  if (progress && job.progress !== undefined) {
    const f = progressFraction(job.progress);
    progress.querySelector(".progress-bar").style.width = `${f === null ? 0 : Math.round(f * 100)}%`;
    progress.querySelector(".progress-label").textContent = progressLabel(job.progress);
  }
  if (changed || job.state === "PENDING") {
    summaryChanged();
    row.classList.remove("flash");
    void row.offsetWidth;
    row.classList.add("flash");
  }
}

function setMeter(cell, percent, suffix) {
  if (!cell) return;
  const p = Math.round(Number(percent) || 0);
  cell.querySelector(".meter-bar").style.width = `${p}%`;
  const label = cell.querySelector(".meter-label");
  const rest = label.textContent.includes(" of ") ? label.textContent.slice(label.textContent.indexOf(" of ")) : "";
  label.textContent = `${p}%${suffix ? rest : ""}`;
}

function showNodeButtons(row, state) {
  const drain = row.querySelector('[data-node-action="drain"]');
  const undrain = row.querySelector('[data-node-action="undrain"]');
  if (drain) drain.hidden = state !== "ONLINE";
  if (undrain) undrain.hidden = !(state === "DRAINING" || state === "DRAINED");
}

function updateNodeRow(node) {
  const row = document.querySelector(`#node-table tr[data-node-id="${node.id}"]`);
  if (!row) return;
  const badge = row.querySelector('[data-field="state"]');
  if (badge && badge.textContent !== node.state) summaryChanged();
  setBadge(badge, node.state);
  showNodeButtons(row, node.state);
  setMeter(row.querySelector('[data-field="cpu"]'), node.cpu_percent, false);
  setMeter(row.querySelector('[data-field="mem"]'), node.memory_percent, true);
  const hb = row.querySelector('[data-field="heartbeat"]');
  if (hb && node.last_heartbeat) {
    hb.dataset.at = node.last_heartbeat;
    hb.textContent = age(node.last_heartbeat);
  }
}

function onMessage(data) {
  if (data.type === "job" && data.job) updateJobRow(data.job);
  if (data.type === "node" && data.node) updateNodeRow(data.node);
}

async function poll() {
  const data = await getJSON("/live/");
  // Polling only lists active jobs, so a job it does not show is finished, not new.
  data.jobs.forEach((job) => {
    if (document.querySelector(`#job-table tr[data-job-id="${job.id}"]`)) updateJobRow(job);
  });
  data.nodes.forEach(updateNodeRow);
}

// Heartbeat ages tick on their own between updates.
setInterval(() => {
  document.querySelectorAll('#node-table [data-field="heartbeat"]').forEach((cell) => {
    if (cell.dataset.at) cell.textContent = age(cell.dataset.at);
  });
}, 1000);

subscribe({
  path: "/ws/cluster/",
  onMessage,
  poll,
  intervalMs: 5000,
  status: document.getElementById("live-status"),
});

// Drain / undrain for operators (nodes page); the API records them in the audit log.
document.querySelectorAll("[data-node-action]").forEach((button) => {
  button.addEventListener("click", async () => {
    const row = button.closest("tr");
    const verb = button.dataset.nodeAction;
    const name = row.dataset.nodeName || "this node";
    const question = verb === "drain"
      ? `Drain ${name}? Jobs on it are moved off (elastic ones shrink, others restart elsewhere) and nothing new is placed there.`
      : `Undrain ${name}? The scheduler may place jobs on it again.`;
    if (!confirm(question)) return;
    const message = document.getElementById("action-message");
    button.disabled = true;
    const result = await apiRequest("POST", `/api/v1/nodes/${row.dataset.nodeId}/${verb}/`, {});
    button.disabled = false;
    if (result.ok) {
      const state = result.body && result.body.state;
      if (state) {
        setBadge(row.querySelector('[data-field="state"]'), state);
        showNodeButtons(row, state);
      }
      if (message) { message.textContent = ""; message.className = "action-message"; }
    } else if (message) {
      message.textContent = result.message;
      message.className = "action-message bad";
    }
  });
});
