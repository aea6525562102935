// The sweep page: its trials (polled from GET /api/v1/sweeps/<id>/ every few seconds), the
// objective against the trial number and each parameter, parallel coordinates, and Stop.
import { apiRequest, getJSON } from "./api.js";
import { formatNumber } from "./format.js";
import { axisFor, parallelCoordinates, scatter } from "./svgplot.js";

const $ = (id) => document.getElementById(id);
const sweepId = JSON.parse($("sweep-id").textContent);
const POLL_MS = 3000;
let last = "";

const fmt = (v) => (v === null || v === undefined ? "—" : typeof v === "number" ? formatNumber(v) : String(v));

function colorFor(t) {
  // Best (t = 0) green through amber to red (t = 1).
  const hue = 130 - 130 * Math.max(0, Math.min(1, t));
  return `hsl(${hue}, 65%, 50%)`;
}

function categoriesOf(spec) {
  if (Array.isArray(spec)) return spec;
  if (spec && spec.type === "categorical") return spec.choices;
  return null;
}

function renderTable(sweep) {
  const names = Object.keys(sweep.space);
  const table = $("trials-table");
  const head = table.tHead;
  const headRow = document.createElement("tr");
  for (const text of ["#", "State", sweep.objective, "Step", ...names, "Seconds", "Job", "Note"]) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = text;
    headRow.append(th);
  }
  head.replaceChildren(headRow);
  const body = table.tBodies[0];
  body.replaceChildren();
  const best = sweep.best ? sweep.best.number : null;
  for (const t of sweep.trials) {
    const tr = body.insertRow();
    tr.dataset.trial = t.number;
    tr.dataset.state = t.state;
    if (t.number === best) tr.classList.add("best-row");
    const cells = [t.number, t.state, fmt(t.value), fmt(t.last_step), ...names.map((n) => fmt(t.params[n])), fmt(t.seconds)];
    for (const text of cells) tr.insertCell().textContent = String(text);
    const jobCell = tr.insertCell();
    if (t.job) {
      const a = document.createElement("a");
      a.href = `/jobs/${t.job}/`;
      a.textContent = `${t.job_name || "job"} #${t.job}`;
      jobCell.append(a);
    } else jobCell.textContent = "—";
    tr.insertCell().textContent = t.number === best ? `best. ${t.message}` : t.message;
  }
  if (!sweep.trials.length) {
    const td = body.insertRow().insertCell();
    td.colSpan = 7 + names.length;
    td.className = "empty";
    td.textContent = "No trial started yet (the controller starts them within a second or two).";
  }
}

function renderPlots(sweep) {
  const scored = sweep.trials.filter((t) => t.value !== null && (t.state === "COMPLETE" || t.state === "PRUNED"));
  const best = sweep.best ? sweep.best.number : null;
  const values = scored.map((t) => t.value);
  const yAxis = axisFor(values);
  const points = (xOf) => scored.map((t) => ({
    x: xOf(t), y: t.value, filled: t.state === "COMPLETE", best: t.number === best,
    label: `trial ${t.number} (${t.state.toLowerCase()}): ${sweep.objective} ${fmt(t.value)}`,
  }));
  const container = $("sweep-plots");
  const boxes = [];
  const box = (id) => {
    const fig = document.createElement("figure");
    fig.className = "chart plot-box";
    fig.dataset.plot = id;
    boxes.push(fig);
    return fig;
  };
  scatter(box("trial"), {
    title: `${sweep.objective} by trial`, xLabel: "trial", yLabel: sweep.objective,
    points: points((t) => t.number), xAxis: axisFor(sweep.trials.map((t) => t.number), { integer: true }), yAxis,
  });
  for (const [name, spec] of Object.entries(sweep.space)) {
    const categories = categoriesOf(spec);
    scatter(box(`param-${name}`), {
      title: `${sweep.objective} by ${name}`, xLabel: name, yLabel: sweep.objective,
      points: points((t) => t.params[name]),
      xAxis: axisFor(sweep.trials.map((t) => t.params[name]), { log: Boolean(spec && spec.log), categories }),
      yAxis,
    });
  }
  container.replaceChildren(...boxes);
  const lo = Math.min(...values), hi = Math.max(...values);
  const rank = (v) => (hi === lo ? 0 : sweep.direction === "maximize" ? (hi - v) / (hi - lo) : (v - lo) / (hi - lo));
  const dims = [
    ...Object.entries(sweep.space).map(([name, spec]) => ({
      name,
      axis: axisFor(sweep.trials.map((t) => t.params[name]), { log: Boolean(spec && spec.log), categories: categoriesOf(spec) }),
    })),
    { name: sweep.objective, axis: yAxis },
  ];
  parallelCoordinates($("parallel"), {
    dims,
    lines: scored.map((t) => ({
      values: { ...t.params, [sweep.objective]: t.value },
      color: colorFor(rank(t.value)),
      best: t.number === best,
      label: `trial ${t.number}: ${sweep.objective} ${fmt(t.value)}`,
    })),
  });
}

function render(sweep) {
  const signature = JSON.stringify(sweep);
  if (signature === last) return;
  last = signature;
  $("sweep-state").textContent = sweep.state;
  $("sweep-state").className = `badge badge-${sweep.state.toLowerCase()}`;
  const c = sweep.counts;
  $("sweep-count").textContent = `${sweep.trials.length}`;
  $("sweep-count").title = Object.entries(c).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(", ");
  $("sweep-best").textContent = sweep.best ? fmt(sweep.best.value) : "—";
  $("sweep-best-detail").textContent = sweep.best ? `trial ${sweep.best.number}: ${Object.entries(sweep.best.params).map(([k, v]) => `${k}=${fmt(v)}`).join(", ")}` : "no complete trial yet";
  $("sweep-message").textContent = [
    `${c.RUNNING} running, ${c.COMPLETE} complete, ${c.PRUNED} pruned, ${c.FAILED} failed, ${c.STOPPED} stopped.`,
    sweep.message,
  ].join(" ");
  const stop = $("sweep-stop");
  if (stop) stop.disabled = sweep.state !== "RUNNING";
  renderTable(sweep);
  renderPlots(sweep);
}

async function poll() {
  try {
    const sweep = await getJSON(`/api/v1/sweeps/${sweepId}/`);
    render(sweep);
    $("live-status").dataset.state = "polling";
    $("live-status").textContent = sweep.state === "RUNNING" ? "polling" : "finished";
    if (sweep.state !== "RUNNING") return;
  } catch (err) {
    $("live-status").dataset.state = "reconnecting";
    $("live-status").textContent = `reconnecting (${err.message})`;
  }
  setTimeout(poll, POLL_MS);
}

$("sweep-stop")?.addEventListener("click", async () => {
  if (!confirm("Stop this sweep and every trial still running?")) return;
  const result = await apiRequest("POST", `/api/v1/sweeps/${sweepId}/stop/`);
  $("action-message").textContent = result.ok ? "Stopped." : result.message;
  if (result.ok) render(result.body);
});

poll();
