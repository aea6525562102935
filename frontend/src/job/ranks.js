// The Ranks table of the current round: placement and exits from the job's detail, step times
// and stragglers from GET .../metrics/ranks/, patched in place every few seconds.
import { getJSON } from "../api.js";
import { formatNumber, setBadge } from "../format.js";
import { $, patchRows } from "./dom.js";

// Every rank of ``round``: its node, local rank, state (an exit overrides the allocation's),
// exit and timing.
export function rankRows(round, timing) {
  const byRank = new Map(timing.ranks.map((r) => [r.rank, r]));
  const rows = [];
  let base = 0;
  for (const alloc of [...round.allocations].sort((a, b) => a.node_rank - b.node_rank)) {
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
  return rows;
}

function rankRow(r) {
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
}

export class RanksTable {
  // onTiming(medianStepTime) for the ETA; onRanks(ranks, stragglers) for the step-time chart.
  constructor(jobId, { onTiming, onRanks }) {
    this.jobId = jobId;
    this.onTiming = onTiming;
    this.onRanks = onRanks;
    this.round = null;
  }

  async refresh(round) {
    if (round !== undefined) this.round = round;
    const rnd = this.round;
    if (!rnd) return;
    let timing = { ranks: [] };
    try {
      timing = await getJSON(`/api/v1/jobs/${this.jobId}/metrics/ranks/?round=${rnd.number}`);
    } catch {
      // Timing is optional: the table still shows placement and exits.
    }
    const rows = rankRows(rnd, timing);
    const times = rows.map((r) => r.t.step_time).filter((v) => typeof v === "number");
    if (times.length) this.onTiming(times.sort((a, b) => a - b)[Math.floor(times.length / 2)]);
    const body = $("ranks-body");
    patchRows(body, rows, (r) => r.rank, rankRow);
    if (!rows.length) body.innerHTML = '<tr><td colspan="7" class="empty">No ranks: the job is not placed.</td></tr>';
    const stragglers = new Set(timing.ranks.filter((r) => r.straggler).map((r) => r.rank));
    this.onRanks(rows.map((r) => r.rank), stragglers);
  }
}
