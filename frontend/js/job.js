// Job page: live state, events, loss chart and logs; Resize / Restart / Stop for operators.
import { apiRequest, getJSON } from "./api.js";
import { LineChart } from "./chart.js";
import { subscribe } from "./live.js";
import { progressFraction, progressLabel, setBadge, TERMINAL } from "./format.js";

const script = document.getElementById("job-script");
const jobId = script.dataset.jobId;
const eventsList = document.getElementById("events");
let lastSeq = Number(eventsList.dataset.lastSeq || 0);
const MAX_EVENTS = 300;
const MAX_LOG_LINES = 500;

const chart = new LineChart(document.getElementById("loss-chart"), document.getElementById("chart-legend"));
const initial = JSON.parse(document.getElementById("initial-series").textContent || "{}");
chart.setSeries(lossOnly(initial));

// The card is a loss chart; other series (lr, throughput, grad norms) have other scales.
function lossOnly(series) {
  return Object.fromEntries(Object.entries(series || {}).filter(([name]) => name.includes("loss")));
}

function showChart() {
  document.getElementById("chart-empty").hidden = chart.hasData();
}

// Rounds and allocations are server-rendered; when the round or state changes, the page's own
// HTML is fetched again and those parts swapped in (a few times per job, not per frame).
let renderedRound = Number(document.getElementById("job-round").textContent);
let renderedState = document.getElementById("job-state").textContent;
let refreshTimer = null;

async function refreshServerParts() {
  refreshTimer = null;
  try {
    const response = await fetch(location.pathname, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const id of ["rounds-card", "round-detail", "nodes-stat"]) {
      const next = fresh.getElementById(id);
      const current = document.getElementById(id);
      if (next && current) current.replaceWith(next);
    }
  } catch {
    // The next state change or poll tries again.
  }
}

function applyJob(job) {
  if (!job) return;
  if ((job.round !== undefined && job.round !== renderedRound) || (job.state && job.state !== renderedState)) {
    renderedRound = job.round ?? renderedRound;
    renderedState = job.state || renderedState;
    if (!refreshTimer) refreshTimer = setTimeout(refreshServerParts, 500);
  }
  setBadge(document.getElementById("job-state"), job.state);
  if (job.round !== undefined) document.getElementById("job-round").textContent = job.round;
  if (job.restarts !== undefined) document.getElementById("job-restarts").textContent = job.restarts;
  if (job.progress !== undefined) {
    document.getElementById("job-progress").textContent = progressLabel(job.progress);
    const f = progressFraction(job.progress);
    document.getElementById("job-progress-bar").style.width = `${f === null ? 0 : Math.round(f * 100)}%`;
  }
  if (TERMINAL.has(job.state)) {
    document.querySelectorAll("#job-actions button, #job-actions input").forEach((el) => { el.disabled = true; });
  }
}

function addEvent(seq, event) {
  if (seq && seq <= lastSeq) return;
  if (seq) lastSeq = seq;
  document.getElementById("events-empty")?.remove();
  const li = document.createElement("li");
  li.className = `event sev-${event.severity || "info"} fresh`;
  li.dataset.seq = seq || "";
  const time = document.createElement("time");
  const at = event.at ? new Date(event.at) : new Date();
  time.dateTime = at.toISOString();
  time.textContent = at.toISOString().slice(11, 19);
  const kind = document.createElement("span");
  kind.className = "kind";
  kind.textContent = event.kind || "";
  const msg = document.createElement("span");
  msg.className = "msg";
  msg.textContent = event.message || "";
  li.append(time, kind, msg);
  const atBottom = eventsList.scrollTop + eventsList.clientHeight >= eventsList.scrollHeight - 8;
  eventsList.appendChild(li);
  while (eventsList.children.length > MAX_EVENTS) eventsList.firstElementChild.remove();
  if (atBottom) eventsList.scrollTop = eventsList.scrollHeight;
}

function addLogs(lines) {
  const pre = document.getElementById("logs");
  document.getElementById("log-card").hidden = false;
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
  for (const line of lines || []) {
    const span = document.createElement("span");
    if (line.stream === "stderr") span.className = "stderr";
    span.textContent = `[${line.rank}] ${line.text}\n`;
    pre.appendChild(span);
  }
  while (pre.childNodes.length > MAX_LOG_LINES) pre.firstChild.remove();
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function onMessage(data) {
  switch (data.type) {
    case "state":
      applyJob(data.job);
      break;
    case "event":
      addEvent(data.seq ?? data.event?.seq, data.event || {});
      break;
    case "metrics":
      chart.append(lossOnly(data.series));
      showChart();
      break;
    case "log":
      addLogs(data.lines);
      break;
    default:
      break;
  }
}

async function poll() {
  const data = await getJSON(`/jobs/${jobId}/live/?after=${lastSeq}`);
  applyJob(data.job);
  for (const e of data.events) addEvent(e.seq, e);
  chart.setSeries(lossOnly(data.series));
  showChart();
}

subscribe({
  path: `/ws/jobs/${jobId}/`,
  onMessage,
  // The consumer replays every event after lastSeq, so nothing is lost across a reconnect.
  onOpen: (socket) => socket.send(JSON.stringify({ type: "resume", after: lastSeq })),
  poll,
  intervalMs: 3000,
  status: document.getElementById("live-status"),
});

// --- operator actions -------------------------------------------------------------------
const actions = document.getElementById("job-actions");
if (actions) {
  const message = document.getElementById("action-message");
  const say = (text, ok) => {
    message.textContent = text;
    message.className = `action-message ${ok ? "ok" : "bad"}`;
  };
  const call = async (verb, payload, button) => {
    button.disabled = true;
    say(`${verb}…`, true);
    const result = await apiRequest("POST", `/api/v1/jobs/${jobId}/${verb}/`, payload);
    button.disabled = false;
    if (result.ok) {
      say(`${verb[0].toUpperCase()}${verb.slice(1)} accepted.`, true);
      if (result.body && result.body.state) applyJob(result.body);
    } else {
      say(result.message, false);
    }
  };

  document.getElementById("resize-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("resize-nodes");
    const nodes = Number(input.value);
    const min = Number(input.min), max = Number(input.max);
    if (!Number.isInteger(nodes) || nodes < min || nodes > max) {
      say(`Nodes must be a whole number from ${min} to ${max}.`, false);
      return;
    }
    call("resize", { nodes }, ev.submitter || input);
  });
  document.getElementById("restart-button").addEventListener("click", (ev) => {
    if (confirm("Restart this job from its latest checkpoint?")) call("restart", {}, ev.currentTarget);
  });
  document.getElementById("stop-button").addEventListener("click", (ev) => {
    if (confirm("Stop this job? Its ranks get SIGTERM, then SIGKILL after the grace period.")) {
      call("stop", {}, ev.currentTarget);
    }
  });
}
