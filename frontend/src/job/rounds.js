// The Rounds table: every round of the job with its reason, world, allocations and outcome. Each
// allocation is one line: node (linked), node rank, global ranks, GPUs (or CPU), a parameter-server
// job's processes by role, and its state. Mirrors console/web/templatetags/console_ui.py
// (allocation_lines) for the first paint.
import { setBadge, timeOf } from "../format.js";
import { $ } from "./dom.js";

// Fields of a round and an allocation, read in one place (their names may change with the API).
const outcomeOf = (round) => round.outcome || (round.state ? `open: ${round.state}` : "—");
const allocationsOf = (round) => [...(round.allocations || [])].sort((a, b) => a.node_rank - b.node_rank);
const processesOf = (alloc) => alloc.processes || [];

function span(a, b) {
  return a === b ? `${a}` : `${a}–${b}`;
}

// Ranks as ranges: [0, 1, 2, 5] -> "0–2, 5".
export function rankRanges(ranks) {
  const sorted = [...ranks].sort((a, b) => a - b);
  const parts = [];
  for (let i = 0; i < sorted.length; i++) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    parts.push(span(sorted[i], sorted[j]));
    i = j;
  }
  return parts.join(", ");
}

const ROLE_NAMES = { coordinator: "coordinator", ps: "PS", worker: "worker" };

// One line's parts: {node, nodeRank, ranks, gpus, roles, state}.
export function allocationLines(round) {
  let base = 0;
  return allocationsOf(round).map((alloc) => {
    const processes = processesOf(alloc);
    const ranks = processes.length
      ? processes.filter((p) => !p.removed).map((p) => p.rank)
      : Array.from({ length: alloc.nproc }, (_, i) => base + i);
    base += alloc.nproc;
    const roles = processes.map((p) => `${ROLE_NAMES[p.role] || p.role}${p.role === "coordinator" ? "" : ` ${p.index}`}${p.removed ? " (removed)" : ""}`);
    const gpus = alloc.gpu_indices && alloc.gpu_indices.length ? `GPU ${alloc.gpu_indices.join(", ")}` : "CPU";
    return { node: alloc.node, nodeRank: alloc.node_rank, ranks: ranks.length ? rankRanges(ranks) : "—", count: ranks.length, gpus, roles, state: alloc.state };
  });
}

function lineItem(line) {
  const li = document.createElement("li");
  const node = document.createElement("a");
  node.href = `/nodes/${encodeURIComponent(line.node)}/`;
  node.textContent = line.node;
  const where = document.createElement("span");
  where.className = "muted";
  where.textContent = `node rank ${line.nodeRank}`;
  const ranks = document.createElement("span");
  ranks.textContent = `${line.count === 1 ? "rank" : "ranks"} ${line.ranks}`;
  const gpus = document.createElement("span");
  gpus.textContent = line.gpus;
  const state = document.createElement("span");
  setBadge(state, line.state);
  li.append(node, " ", where, " · ", ranks, " · ", gpus);
  if (line.roles.length) {
    const roles = document.createElement("span");
    roles.className = "alloc-roles";
    roles.textContent = line.roles.join(", ");
    li.append(" · ", roles);
  }
  li.append(" ", state);
  return li;
}

export function renderRounds(rounds, currentRound) {
  const body = $("rounds-body");
  if (!rounds.length) return;
  body.replaceChildren(
    ...rounds.map((r) => {
      const tr = document.createElement("tr");
      if (r.number === currentRound) tr.className = "current";
      const list = document.createElement("ul");
      list.className = "allocs";
      list.append(...allocationLines(r).map(lineItem));
      for (const [content, cls] of [
        [r.number, "num"],
        [r.reason + (r.charged ? " (charged)" : ""), ""],
        [r.world_size, "num"],
        [list, "allocs-cell"],
        [outcomeOf(r), ""],
        [timeOf(r.created_at), "num"],
        [r.change_seconds == null ? "—" : `${r.change_seconds.toFixed(2)} s`, "num"],
      ]) {
        const td = document.createElement("td");
        td.append(content);
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
