// Node page: GPUs with live utilisation and memory, CPU and memory load, heartbeat age, the
// rounds it holds; drain / undrain (with confirmation) and a network check for operators. Live from /ws/cluster/,
// polling /live/ otherwise; the rounds section is fetched again when jobs change.
import { apiRequest, getJSON } from "./api.js";
import { subscribe } from "./live.js";
import { age, formatBytes, setBadge } from "./format.js";
import { wireCheckButton } from "./netcheck.js";

const root = document.getElementById("node-page");
const nodeId = Number(root.dataset.nodeId);
const nodeName = root.dataset.nodeName;
const $ = (id) => document.getElementById(id);

function meter(el, percent, label) {
  if (!el) return;
  const p = Math.max(0, Math.min(100, Math.round(Number(percent) || 0)));
  el.querySelector(".meter-bar").style.width = `${p}%`;
  el.querySelector(".meter-label").textContent = label ?? `${p}%`;
  el.setAttribute("aria-valuenow", String(p));
}

function showButtons(state) {
  const drain = $("drain-button");
  const undrain = $("undrain-button");
  if (drain) drain.hidden = state !== "ONLINE";
  if (undrain) undrain.hidden = !(state === "DRAINING" || state === "DRAINED");
}

function applyNode(node) {
  if (!node || node.id !== nodeId) return;
  const badge = $("node-state");
  if (badge.textContent !== node.state) scheduleHoldings();
  setBadge(badge, node.state);
  showButtons(node.state);
  meter($("node-cpu"), node.cpu_percent);
  meter($("node-mem"), node.memory_percent);
  if (node.last_heartbeat) $("node-heartbeat").dataset.at = node.last_heartbeat;
  tickHeartbeat();
  for (const gpu of node.gpus || []) {
    const row = document.querySelector(`#gpu-table tr[data-gpu="${gpu.index}"]`);
    if (!row) continue;
    meter(row.querySelector('[data-field="util"]'), gpu.utilization);
    const total = Number(row.dataset.memory) || 0;
    const used = gpu.memory_used_bytes || 0;
    meter(row.querySelector('[data-field="mem"]'), total ? (used / total) * 100 : 0, `${formatBytes(used)} of ${formatBytes(total)}`);
  }
}

function tickHeartbeat() {
  const el = $("node-heartbeat");
  if (el.dataset.at) el.textContent = `${age(el.dataset.at)} ago`;
}
setInterval(tickHeartbeat, 1000);

let holdingsTimer = null;
function scheduleHoldings() {
  if (!holdingsTimer) holdingsTimer = setTimeout(refreshHoldings, 800);
}

async function refreshHoldings() {
  holdingsTimer = null;
  try {
    const response = await fetch(location.pathname, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const id of ["node-holdings", "node-history"]) {
      const next = fresh.getElementById(id);
      const current = document.getElementById(id);
      if (next && current) current.replaceWith(next);
    }
  } catch {
    // The next change tries again.
  }
}

subscribe({
  path: "/ws/cluster/",
  onMessage: (data) => {
    if (data.type === "node") applyNode(data.node);
    if (data.type === "job") scheduleHoldings();
    if (data.type === "event" && data.event && data.event.node === nodeName) scheduleHoldings();
  },
  poll: async () => {
    const data = await getJSON("/live/");
    data.nodes.forEach(applyNode);
    scheduleHoldings();
  },
  intervalMs: 5000,
  status: $("live-status"),
});

for (const button of document.querySelectorAll("[data-node-action]")) {
  button.addEventListener("click", async () => {
    const verb = button.dataset.nodeAction;
    const question = verb === "drain"
      ? `Drain ${nodeName}? Jobs on it are moved off (elastic ones shrink, others restart elsewhere) and nothing new is placed there.`
      : `Undrain ${nodeName}? The scheduler may place jobs on it again.`;
    if (!confirm(question)) return;
    const message = $("action-message");
    button.disabled = true;
    const result = await apiRequest("POST", `/api/v1/nodes/${nodeId}/${verb}/`, {});
    button.disabled = false;
    if (result.ok) {
      message.textContent = `${verb === "drain" ? "Drain" : "Undrain"} accepted.`;
      message.className = "action-message ok";
      if (result.body && result.body.state) {
        setBadge($("node-state"), result.body.state);
        showButtons(result.body.state);
      }
      scheduleHoldings();
    } else {
      message.textContent = result.message;
      message.className = "action-message bad";
    }
  });
}

// A pre-flight network check of this node against the others; the Network card is re-rendered
// with the results once it is done.
wireCheckButton($("check-network-button"), $("network-message"), ["node-network"]);
