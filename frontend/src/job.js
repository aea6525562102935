// Job page: live state, progress and ETA, charts, ranks, events (root cause linked to its log
// lines), logs, checkpoints; Resize / Restart / Stop for operators.
import { apiRequest, getJSON } from "./api.js";
import { JobCharts } from "./jobcharts.js";
import { subscribe } from "./live.js";
import { LogView } from "./logview.js";
import { formatBytes, formatDuration, formatNumber, progressLabel, setBadge, TERMINAL, timeOf } from "./format.js";

const config = JSON.parse(document.getElementById("job-config").textContent);
const jobId = config.id;
const $ = (id) => document.getElementById(id);
// Log history loaded on open (the rest stays a click away: "Load older lines").
const HISTORY_LINES = 20000;
const LOG_PAGE = 5000;
const MAX_EVENTS = 2000;
const RANKS_EVERY_MS = 5000;

const job = { state: config.state, round: config.round, progress: config.progress || {}, restarts: config.restarts };
let total = config.total_steps || null;
let stepTime = null;
let lastSeq = 0;
let lastFrame = 0;
let liveRound = config.round;

// --- progress and ETA -------------------------------------------------------------------------
function renderProgress() {
  const step = typeof job.progress.step === "number" ? job.progress.step : null;
  const known = total || job.progress.total_steps || job.progress.total || null;
  const bar = $("job-progress-bar");
  const label = $("job-progress");
  const eta = $("job-eta");
  if (step !== null && known) {
    const fraction = Math.max(0, Math.min(1, step / known));
    bar.style.width = `${Math.round(fraction * 100)}%`;
    bar.parentElement.setAttribute("aria-valuenow", String(Math.round(fraction * 100)));
    label.textContent = `${step}/${known}`;
    const remaining = known - step;
    eta.textContent = TERMINAL.has(job.state)
      ? job.state.toLowerCase()
      : remaining <= 0
        ? "done"
        : stepTime
          ? `ETA ${formatDuration(remaining * stepTime)} at ${formatNumber(stepTime)} s/step`
          : "ETA: measuring step time…";
  } else {
    label.textContent = progressLabel(job.progress);
    eta.textContent = step === null ? "" : "no total: call sdk.progress(total) or set hyperparameter steps";
  }
}

// --- state ------------------------------------------------------------------------------------
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
  renderProgress();
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
    renderRounds(detail.rounds || []);
    const current = (detail.rounds || []).find((r) => r.number === detail.round);
    $("round-detail").textContent = current ? `${current.reason} · world ${current.world_size}` : "not placed yet";
    $("world-size").textContent = current && !TERMINAL.has(detail.state) ? current.world_size : "—";
    for (const r of detail.rounds || []) {
      const b = charts.group.boundaries.find((x) => x.round === r.number);
      if (b && (b.reason !== r.reason || b.world !== r.world_size)) {
        b.reason = r.reason;
        b.world = r.world_size;
        charts.group.setBoundaries([...charts.group.boundaries]);
      }
    }
    refreshCheckpoints().catch(() => {});
    await refreshRanks(current);
  } catch {
    // The next state change or poll tries again.
  }
}

function renderRounds(rounds) {
  const body = $("rounds-body");
  if (!rounds.length) return;
  body.replaceChildren(
    ...rounds.map((r) => {
      const tr = document.createElement("tr");
      if (r.number === job.round) tr.className = "current";
      const allocs = r.allocations.map((a) => `${a.node_rank} · ${a.node} · ${a.nproc} · ${a.state}`).join("; ");
      for (const [text, cls] of [
        [r.number, "num"],
        [r.reason + (r.charged ? " (charged)" : ""), ""],
        [r.world_size, "num"],
        [allocs, ""],
        [r.outcome || "—", ""],
        [timeOf(r.created_at), "num"],
        [r.change_seconds == null ? "—" : `${r.change_seconds.toFixed(2)} s`, "num"],
      ]) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.append(td);
      }
      if (r.inplace) {
        // The reason cell says the survivors kept their processes.
        const badge = document.createElement("span");
        badge.className = "badge";
        badge.title = "Survivors kept their processes";
        badge.textContent = "in place";
        tr.children[1].append(" ", badge);
      }
      return tr;
    }),
  );
}

// --- tables refreshed every few seconds --------------------------------------------------------
// Rows keyed by ``keyOf``: a row whose data did not change is left alone (no new nodes, no layout
// of the whole table), a changed one is replaced, and rows are kept in ``items`` order.
function patchRows(body, items, keyOf, render) {
  const existing = new Map([...body.children].map((tr) => [tr.dataset.key, tr]));
  const keep = new Set();
  let previous = null;
  for (const item of items) {
    const key = String(keyOf(item));
    const signature = JSON.stringify(item);
    let tr = existing.get(key);
    if (!tr || tr.dataset.signature !== signature) {
      const fresh = render(item);
      fresh.dataset.key = key;
      fresh.dataset.signature = signature;
      if (tr) tr.replaceWith(fresh);
      tr = fresh;
    }
    keep.add(tr);
    const wanted = previous ? previous.nextSibling : body.firstChild;
    if (wanted !== tr) body.insertBefore(tr, wanted);
    previous = tr;
  }
  for (const tr of [...body.children]) if (!keep.has(tr)) tr.remove();
}

// --- ranks ------------------------------------------------------------------------------------
let currentRound = null;
async function refreshRanks(round) {
  if (round !== undefined) currentRound = round;
  const rnd = currentRound;
  if (!rnd) return;
  let timing = { ranks: [] };
  try {
    timing = await getJSON(`/api/v1/jobs/${jobId}/metrics/ranks/?round=${rnd.number}`);
  } catch {
    // Timing is optional: the table still shows placement and exits.
  }
  const byRank = new Map(timing.ranks.map((r) => [r.rank, r]));
  const rows = [];
  let base = 0;
  for (const alloc of [...rnd.allocations].sort((a, b) => a.node_rank - b.node_rank)) {
    const exits = (alloc.exit_info && alloc.exit_info.exits) || [];
    for (let local = 0; local < alloc.nproc; local++) {
      const rank = base + local;
      const exit = exits.find((e) => e.rank === rank);
      const t = byRank.get(rank) || {};
      let state = alloc.state;
      if (exit) state = exit.exit_code === 0 && !exit.signal ? "EXITED" : "FAILED";
      rows.push({ rank, node: alloc.node, local, state, exit, t });
    }
    base += alloc.nproc;
  }
  const times = rows.map((r) => r.t.step_time).filter((v) => typeof v === "number");
  if (times.length) stepTime = times.sort((a, b) => a - b)[Math.floor(times.length / 2)];
  renderProgress();
  const body = $("ranks-body");
  patchRows(
    body,
    rows,
    (r) => r.rank,
    (r) => {
      const tr = document.createElement("tr");
      tr.dataset.rank = r.rank;
      const exitText = r.exit ? (r.exit.signal ? r.exit.signal : `exit ${r.exit.exit_code}`) : "—";
      const cells = [
        [String(r.rank), "num"],
        [null, "node"],
        [String(r.local), "num"],
        [null, "state"],
        [exitText, r.exit && (r.exit.exit_code !== 0 || r.exit.signal) ? "bad" : ""],
        [r.t.last_step ? String(r.t.last_step) : "—", "num"],
        [null, "num steptime"],
      ];
      for (const [text, cls] of cells) {
        const td = document.createElement("td");
        if (cls) td.className = cls;
        if (cls === "node") {
          const a = document.createElement("a");
          a.href = `/nodes/${encodeURIComponent(r.node)}/`;
          a.textContent = r.node;
          td.append(a);
        } else if (cls === "state") {
          const badge = document.createElement("span");
          setBadge(badge, r.state);
          td.append(badge);
        } else if (cls === "num steptime") {
          td.textContent = typeof r.t.step_time === "number" ? `${formatNumber(r.t.step_time * 1000)} ms` : "—";
          if (r.t.straggler) {
            const chip = document.createElement("span");
            chip.className = "chip warn";
            chip.textContent = "straggler";
            td.append(" ", chip);
          }
        } else {
          td.textContent = text;
        }
        tr.append(td);
      }
      return tr;
    },
  );
  if (!rows.length) body.innerHTML = '<tr><td colspan="7" class="empty">No ranks: the job is not placed.</td></tr>';
  const stragglers = new Set(timing.ranks.filter((r) => r.straggler).map((r) => r.rank));
  charts.loadRanks(rows.map((r) => r.rank), stragglers).catch(() => {});
}

// --- parameter-server roles -------------------------------------------------------------------
// Each PS's, worker's and the shard queue's latest telemetry (GET .../metrics/roles/), patched in
// place like the ranks table.
const count = (v) => (typeof v === "number" ? Math.round(v).toLocaleString("en-US") : "–");
const pair = (a, b, fmt) => `${fmt(a)} / ${fmt(b)}`;
const ms = (a, b) => (typeof a === "number" || typeof b === "number" ? `${pair(a, b, formatNumber)} ms` : "–");

function statsRow(cells) {
  const tr = document.createElement("tr");
  for (const [text, cls] of cells) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    tr.append(td);
  }
  return tr;
}

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

async function refreshRoleStats() {
  if (!$("ps-servers-body")) return;
  const stats = await getJSON(`/api/v1/jobs/${jobId}/metrics/roles/`);
  renderQueue(stats.queue);
  const servers = $("ps-servers-body");
  patchRows(servers, stats.ps, (p) => p.index, (p) => {
    const tr = statsRow([
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
  });
  if (!stats.ps.length) servers.innerHTML = '<tr><td colspan="9" class="empty">No PS: the job is not placed.</td></tr>';
  const workers = $("ps-workers-body");
  patchRows(workers, stats.workers, (w) => w.index, (w) => {
    const tr = statsRow([
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
  });
  if (!stats.workers.length) workers.innerHTML = '<tr><td colspan="7" class="empty">No workers: the job is not placed.</td></tr>';
}

// --- events -----------------------------------------------------------------------------------
const eventsList = $("events");
function eventCategory(kind) {
  return String(kind).split(".")[0].split("_")[0];
}

function addEvent(event, fresh) {
  if (event.seq && event.seq <= lastSeq) return;
  if (event.seq) lastSeq = event.seq;
  $("events-empty")?.remove();
  const li = document.createElement("li");
  li.className = `event sev-${event.severity || "info"}${fresh ? " fresh" : ""}`;
  li.dataset.seq = event.seq || "";
  li.dataset.severity = event.severity || "info";
  li.dataset.category = eventCategory(event.kind);
  li.dataset.round = event.round ?? "";
  const time = document.createElement("time");
  time.dateTime = event.at || new Date().toISOString();
  time.textContent = timeOf(time.dateTime);
  const kind = document.createElement("span");
  kind.className = "kind";
  kind.textContent = event.kind;
  const msg = document.createElement("span");
  msg.className = "msg";
  msg.textContent = event.message;
  li.append(time, kind, msg);
  const cause = event.kind === "rank.failed" && event.data && event.data.cause;
  if (cause) {
    // The round's first failing rank: what broke it. Its log lines are one click away.
    li.classList.add("root-cause");
    const tag = document.createElement("strong");
    tag.className = "chip bad";
    tag.textContent = "root cause";
    const link = document.createElement("button");
    link.type = "button";
    link.className = "linkbutton root-cause-link";
    link.textContent = `Show rank ${cause.rank}'s log at the failure`;
    link.addEventListener("click", () => showFailure(cause));
    msg.append(" ", tag, " ", link);
    eventsList.querySelectorAll(".root-cause.latest").forEach((el) => el.classList.remove("latest"));
    li.classList.add("latest");
  }
  eventsList.append(li);
  li.hidden = !eventVisible(li);
  while (eventsList.children.length > MAX_EVENTS) eventsList.firstElementChild.remove();
  if (fresh && !li.hidden) eventsList.scrollTop = eventsList.scrollHeight;
}

function eventVisible(li) {
  const severity = $("event-severity").value;
  const category = $("event-category").value;
  const text = $("event-search").value.trim().toLowerCase();
  if (severity === "warning" && li.dataset.severity === "info") return false;
  if (severity === "error" && li.dataset.severity !== "error") return false;
  if (category && li.dataset.category !== category) return false;
  if (text && !li.textContent.toLowerCase().includes(text)) return false;
  return true;
}

function filterEvents() {
  for (const li of eventsList.children) if (li.dataset.seq !== undefined) li.hidden = !eventVisible(li);
}
["event-severity", "event-category"].forEach((id) => $(id).addEventListener("change", filterEvents));
$("event-search").addEventListener("input", filterEvents);

// --- logs -------------------------------------------------------------------------------------
let droppedLines = 0;
// The rank filter offers every rank seen so far (rounds grow and shrink the world).
const rankSelect = $("log-rank");
function ensureRankOption(rank) {
  const value = String(rank);
  const options = [...rankSelect.options];
  if (options.some((o) => o.value === value)) return;
  const option = new Option(`Rank ${rank}`, value);
  const after = options.find((o) => o.value !== "" && Number(o.value) > rank);
  rankSelect.add(option, after || null);
}
const logView = new LogView($("log-viewport"), { onChange: renderLogStatus });
function renderLogStatus() {
  if (logView.ranks.size !== rankSelect.options.length - 1) logView.ranks.forEach(ensureRankOption);
  const follow = $("log-follow");
  follow.setAttribute("aria-pressed", String(logView.follow));
  follow.textContent = logView.follow ? "Pause" : "Follow";
  const parts = [`${logView.visible.length.toLocaleString("en-US")} of ${logView.lines.length.toLocaleString("en-US")} lines`];
  parts.push(`${droppedLines.toLocaleString("en-US")} dropped from the live tail${droppedLines ? " (refetched)" : ""}`);
  $("log-status").textContent = parts.join(" · ");
}

function logUrl(params) {
  const q = new URLSearchParams(params);
  return `/api/v1/jobs/${jobId}/logs/?${q}`;
}

let olderAvailable = false;
async function loadLogHistory(limitLines) {
  let before = logView.firstId || null;
  let loaded = 0;
  while (loaded < limitLines) {
    const params = { limit: String(LOG_PAGE) };
    if (before) params.before = String(before);
    const body = await getJSON(logUrl(params));
    logView.prepend(body.lines);
    loaded += body.lines.length;
    olderAvailable = body.lines.length === LOG_PAGE;
    if (!olderAvailable) break;
    before = body.lines[0].id;
  }
  $("log-older").hidden = !olderAvailable;
}

async function fetchLogsAfter(after) {
  let cursor = after;
  for (let i = 0; i < 20; i++) {
    const body = await getJSON(logUrl({ after: String(cursor), limit: String(LOG_PAGE) }));
    logView.append(body.lines);
    if (body.lines.length < LOG_PAGE) break;
    cursor = body.last_id;
  }
}

function onLogFrame(data) {
  const before = logView.lastId;
  logView.append(data.lines || []);
  if (data.skipped) {
    // The live tail keeps the newest lines of a burst; the ones it skipped are in the database.
    droppedLines += data.skipped;
    fetchLogsAfter(before).catch(() => {});
    renderLogStatus();
  }
}

async function showFailure(cause) {
  ensureRankOption(cause.rank);
  $("log-rank").value = String(cause.rank);
  $("log-search").value = "";
  logView.setFilter({ rank: String(cause.rank), query: "" });
  const body = await getJSON(logUrl({ rank: String(cause.rank), round: String(cause.round), limit: "400" }));
  logView.append(body.lines);
  // The failing lines: the rank's lines that make up its error (the traceback or last stderr).
  const error = String(cause.error || "");
  const wanted = body.lines.filter((l) => l.text.trim() && error.includes(l.text.trim()));
  const ids = (wanted.length ? wanted : body.lines.filter((l) => l.stream === "stderr").slice(-20)).map((l) => l.id);
  logView.focusLines(ids.length ? ids : body.lines.slice(-10).map((l) => l.id));
  $("log-card").scrollIntoView({ block: "start" });
  $("log-viewport").focus();
  $("log-status").textContent += ` · showing rank ${cause.rank}'s failure in round ${cause.round}`;
}

$("log-rank").addEventListener("change", (ev) => logView.setFilter({ rank: ev.target.value }));
$("log-search").addEventListener("input", (ev) => logView.setFilter({ query: ev.target.value }));
$("log-follow").addEventListener("click", () => logView.setFollow(!logView.follow));
$("log-older").addEventListener("click", async (ev) => {
  const button = ev.currentTarget;
  button.disabled = true;
  try {
    await loadLogHistory(LOG_PAGE * 4);
  } catch {
    // The button stays for another try.
  } finally {
    button.disabled = false;
  }
});
$("log-download").addEventListener("click", () => {
  const blob = new Blob([logView.text() + "\n"], { type: "text/plain" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `job-${jobId}-logs${logView.filter.rank !== "" ? `-rank${logView.filter.rank}` : ""}.txt`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
});

// --- checkpoints ------------------------------------------------------------------------------
async function refreshCheckpoints() {
  const body = await getJSON(`/api/v1/jobs/${jobId}/checkpoints/`);
  patchRows($("checkpoints-body"), body.results, (c) => c.id, (c) => {
    const tr = document.createElement("tr");
    for (const [text, cls] of [
      [c.step, "num"],
      [formatBytes(c.size_bytes), "num"],
      [`${formatNumber(c.blocking_ms)} ms`, "num"],
      [c.round, "num"],
      [timeOf(c.created_at), "num"],
      [c.path.split("/").pop(), "mono path"],
    ]) {
      const td = document.createElement("td");
      td.className = cls;
      td.textContent = text;
      if (cls === "mono path") td.title = c.path;
      tr.append(td);
    }
    return tr;
  });
  $("checkpoints-empty").hidden = body.results.length > 0;
}

// --- charts -----------------------------------------------------------------------------------
const charts = new JobCharts(jobId, $("charts"), {
  names: config.names,
  onTotal: (value) => {
    total = value;
    renderProgress();
  },
});
// The boundaries drawn on the charts, also as text (for screen readers, and to read exact steps).
charts.group.onBoundaries = (list) => {
  $("round-boundaries").textContent = list.length
    ? `Round boundaries: ${list.map((b) => `round ${b.round} (${b.reason}${b.world ? `, world ${b.world}` : ""}) from step ${b.step}`).join("; ")}.`
    : "";
};
charts.group.setBoundaries(config.boundaries);
$("layers-toggle")?.addEventListener("change", (ev) => charts.setLayers(ev.target.checked).catch(() => {}));
$("zoom-reset").addEventListener("click", () => charts.group.resetZoom());
$("zoom-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const from = Number($("zoom-from").value), to = Number($("zoom-to").value);
  if (Number.isFinite(from) && Number.isFinite(to) && to > from) charts.group.setZoom(from, to);
});
charts.group.onZoom((zoom) => {
  $("zoom-state").textContent = zoom ? `steps ${zoom.min}–${zoom.max}` : "all steps";
  if (zoom) {
    $("zoom-from").value = zoom.min;
    $("zoom-to").value = zoom.max;
  }
});

function onMetrics(data) {
  if (data.frame && lastFrame && data.frame > lastFrame + 1) refetchGap();
  if (data.frame) lastFrame = data.frame;
  if (data.round && data.round > liveRound) {
    // A new round's first points: its boundary goes where they start (total_steps is logged at
    // step 0 whatever the step, so it does not count). The first round has nothing before it.
    const steps = Object.entries(data.series || {})
      .filter(([name]) => name !== "total_steps")
      .flatMap(([, pts]) => pts.map((p) => p[0]));
    if (steps.length) {
      if (liveRound >= 1) {
        charts.group.addBoundary({ round: data.round, step: Math.min(...steps), reason: "new round", world: null });
      }
      liveRound = data.round;
      scheduleRefresh();
    }
  }
  charts.appendFrame(data.series);
}

let gapPending = false;
async function refetchGap() {
  if (gapPending) return;
  gapPending = true;
  try {
    await charts.refetchSince(charts.minLastStep());
  } finally {
    gapPending = false;
  }
}

// --- live -------------------------------------------------------------------------------------
function onMessage(data) {
  if (data.type === "state") applyJob(data.job);
  else if (data.type === "event") {
    addEvent({ ...data.event, seq: data.seq }, true);
    if (/^(round|rank|checkpoint|job)\./.test(data.event.kind)) scheduleRefresh();
  } else if (data.type === "metrics") onMetrics(data);
  else if (data.type === "gap") refetchGap();
  else if (data.type === "log") onLogFrame(data);
}

async function poll() {
  const data = await getJSON(`/jobs/${jobId}/live/?after=${lastSeq}&log_after=${logView.lastId}`);
  applyJob(data.job);
  data.events.forEach((e) => addEvent(e, true));
  logView.append(data.logs || []);
  await charts.refetchSince(charts.minLastStep());
}

const live = subscribe({
  path: `/ws/jobs/${jobId}/`,
  onMessage,
  onOpen: (socket, reconnected) => {
    socket.send(JSON.stringify({ type: "resume", after: lastSeq }));
    if (reconnected) {
      // What happened while away: points by range, lines after the last one held.
      refetchGap();
      fetchLogsAfter(logView.lastId).catch(() => {});
      scheduleRefresh();
    }
  },
  poll,
  intervalMs: 3000,
  status: $("live-status"),
});
// Handles for the bench and for debugging from the console: the connection and the log view.
window.trainyardLive = live;
window.trainyardLogView = logView;

// --- controls (operators) ---------------------------------------------------------------------
const actions = $("job-actions");
if (actions) {
  const message = $("action-message");
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
      if (result.body && result.body.state) applyJob({ state: result.body.state, round: result.body.round, restarts: result.body.restarts });
    } else {
      say(result.message, false);
    }
  };
  // A parameter_server job is resized by role (workers in place; ps through a new round).
  const roleForm = $("role-resize-form");
  if (roleForm) {
    const role = $("resize-role");
    const counts = JSON.parse(roleForm.dataset.counts || "{}");
    role.addEventListener("change", () => { if (counts[role.value]) $("resize-count").value = counts[role.value]; });
    roleForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const count = Number($("resize-count").value);
      if (!Number.isInteger(count) || count < 1) {
        say("The process count must be a whole number of at least 1.", false);
        return;
      }
      await call("resize", { role: role.value, count }, ev.submitter || roleForm);
      const row = document.querySelector(`#job-roles tr[data-role="${role.value}"] .role-count`);
      if (row && message.classList.contains("ok")) row.textContent = String(count);
    });
  }
  $("resize-form")?.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = $("resize-nodes");
    const nodes = Number(input.value);
    const min = Number(input.min), max = Number(input.max);
    if (!Number.isInteger(nodes) || nodes < min || nodes > max) {
      say(`Nodes must be a whole number from ${min} to ${max}.`, false);
      return;
    }
    call("resize", { nodes }, ev.submitter || input);
  });
  $("restart-button").addEventListener("click", (ev) => {
    if (confirm("Restart this job from its latest checkpoint?")) call("restart", {}, ev.currentTarget);
  });
  $("stop-button").addEventListener("click", (ev) => {
    if (confirm("Stop this job? Its ranks get SIGTERM, then SIGKILL after the grace period.")) call("stop", {}, ev.currentTarget);
  });
}

// --- start ------------------------------------------------------------------------------------
config.events.forEach((e) => addEvent(e, false));
eventsList.scrollTop = eventsList.scrollHeight;
renderProgress();
// The loss chart's history first; logs, ranks and checkpoints right after it.
charts
  .load(config.first_url, () => {
    loadLogHistory(HISTORY_LINES).catch(() => {});
    refreshDetail();
  })
  .catch((err) => {
    $("charts-error").textContent = `Charts could not load: ${err.message}`;
  });
refreshRoleStats().catch(() => {});
setInterval(() => {
  if (TERMINAL.has(job.state)) return;
  refreshRanks().catch(() => {});
  refreshRoleStats().catch(() => {});
  refreshCheckpoints().catch(() => {});
}, RANKS_EVERY_MS);
