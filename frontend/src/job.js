// Job page: live state, progress and ETA, goodput, charts, ranks, events (root cause linked to its log
// lines), logs, checkpoints, the newest hang's stacks; Resize / Restart / Stop for operators. Each card is a module under
// job/; this file holds the job's live summary and wires the cards to the live connection.
import { getJSON } from "./api.js";
import { setBadge, TERMINAL } from "./format.js";
import { subscribe } from "./live.js";
import { refreshCheckpoints } from "./job/checkpoints.js";
import { refreshGoodput } from "./job/goodput.js";
import { refreshHangs } from "./job/hangs.js";
import { bindControls } from "./job/controls.js";
import { $ } from "./job/dom.js";
import { EventList } from "./job/events.js";
import { LogPanel } from "./job/logs.js";
import { MetricsPanel } from "./job/metrics.js";
import { ProgressCard } from "./job/progress.js";
import { ROLE_SERIES, RoleCharts } from "./job/rolecharts.js";
import { RanksTable } from "./job/ranks.js";
import { refreshRoleStats } from "./job/roles.js";
import { renderRounds } from "./job/rounds.js";

const config = JSON.parse(document.getElementById("job-config").textContent);
const jobId = config.id;
// Log history loaded on open (the rest stays a click away: "Load older lines").
const HISTORY_LINES = 20000;
const REFRESH_EVERY_MS = 5000;

const job = { state: config.state, round: config.round, progress: config.progress || {}, restarts: config.restarts };
const progress = new ProgressCard(job, { total: config.total_steps, unit: config.progress_unit });
const logs = new LogPanel(jobId);
const events = new EventList({ onRootCause: (cause) => logs.showFailure(cause) });
const metrics = new MetricsPanel(config, {
  onTotal: (total) => progress.setTotal(total),
  onNewRound: () => scheduleRefresh(),
  onStep: (round, step) => progress.noteStep(round, step),
  skip: config.parameter_server ? (name) => ROLE_SERIES.test(name) : null,
});
const roleCharts = config.parameter_server ? new RoleCharts(jobId, $("role-charts"), metrics.charts.group, config.names) : null;
const ranks = new RanksTable(jobId, {
  onTiming: (seconds) => progress.setStepTime(seconds),
  onRanks: (list, stragglers) => metrics.charts.loadRanks(list, stragglers).catch(() => {}),
});

// --- the job's state --------------------------------------------------------------------------
function applyJob(summary) {
  if (!summary) return;
  // Progress arrives with every heartbeat; the rest of the page is fetched again only when the
  // job changes round or state.
  const roundChanged = summary.round !== undefined && summary.round !== job.round;
  const stateChanged = summary.state !== undefined && summary.state !== job.state;
  Object.assign(job, Object.fromEntries(Object.entries(summary).filter(([, v]) => v !== undefined)));
  setBadge($("job-state"), job.state);
  $("job-round").textContent = job.round;
  $("job-restarts").textContent = job.restarts;
  progress.render();
  if (TERMINAL.has(job.state)) {
    document.querySelectorAll("#job-actions button, #job-actions input").forEach((el) => { el.disabled = true; });
  }
  if (roundChanged || stateChanged) scheduleRefresh();
}

let refreshTimer = null;
function scheduleRefresh() {
  if (!refreshTimer) refreshTimer = setTimeout(refreshDetail, 400);
}

// The job as the API has it (rounds with allocations and exits): rounds table, ranks, boundaries.
async function refreshDetail() {
  refreshTimer = null;
  try {
    const detail = await getJSON(`/api/v1/jobs/${jobId}/`);
    const rounds = detail.rounds || [];
    renderRounds(rounds, job.round);
    const current = rounds.find((r) => r.number === detail.round);
    $("round-detail").textContent = current ? `${current.reason} · world ${current.world_size}` : "not placed yet";
    $("world-size").textContent = current && !TERMINAL.has(detail.state) ? current.world_size : "—";
    metrics.updateBoundaries(rounds);
    refreshCheckpoints(jobId).catch(() => {});
    refreshGoodput(jobId).catch(() => {});
    refreshHangs(jobId).catch(() => {});
    refreshRoleStats(jobId).catch(() => {});
    roleCharts?.refresh();
    await ranks.refresh(current);
  } catch {
    // The next state change or poll tries again.
  }
}

// --- live -------------------------------------------------------------------------------------
function onMessage(data) {
  if (data.type === "state") applyJob(data.job);
  else if (data.type === "event") {
    events.add({ ...data.event, seq: data.seq }, true);
    if (/^(round|rank|checkpoint|job)\./.test(data.event.kind)) scheduleRefresh();
  } else if (data.type === "metrics") metrics.onFrame(data);
  else if (data.type === "gap") metrics.refetchGap();
  else if (data.type === "log") logs.onFrame(data);
}

async function poll() {
  const data = await getJSON(`/jobs/${jobId}/live/?after=${events.lastSeq}&log_after=${logs.view.lastId}`);
  applyJob(data.job);
  data.events.forEach((e) => events.add(e, true));
  logs.view.append(data.logs || []);
  await metrics.charts.refetchSince(metrics.charts.minLastStep());
}

const live = subscribe({
  path: `/ws/jobs/${jobId}/`,
  onMessage,
  onOpen: (socket, reconnected) => {
    socket.send(JSON.stringify({ type: "resume", after: events.lastSeq }));
    if (reconnected) {
      // What happened while away: points by range, lines after the last one held.
      metrics.refetchGap();
      logs.fetchAfter(logs.view.lastId).catch(() => {});
      scheduleRefresh();
    }
  },
  poll,
  intervalMs: 3000,
  status: $("live-status"),
});
// Handles for the bench and for debugging from the console: the connection and the log view.
window.trainyardLive = live;
window.trainyardLogView = logs.view;

bindControls(jobId, applyJob);

// --- start ------------------------------------------------------------------------------------
config.events.forEach((e) => events.add(e, false));
events.scrollToEnd();
progress.render();
// The loss chart's history first; logs, ranks and checkpoints right after it.
metrics.load(config.first_url, () => {
  logs.loadHistory(HISTORY_LINES).catch(() => {});
  refreshDetail();
  roleCharts?.refresh();
});
refreshRoleStats(jobId).catch(() => {});
setInterval(() => {
  if (TERMINAL.has(job.state)) return;
  ranks.refresh().catch(() => {});
  refreshRoleStats(jobId).catch(() => {});
  roleCharts?.refresh();
  // Live frames carry rank 0's points: a parameter-server job's rank 0 is its coordinator, so
  // its workers' loss and throughput are read by range.
  if (config.parameter_server) metrics.refetchGap();
  refreshCheckpoints(jobId).catch(() => {});
  refreshGoodput(jobId).catch(() => {});
}, REFRESH_EVERY_MS);
