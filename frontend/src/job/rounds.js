// The Rounds table: every round of the job with its reason, world, allocations and outcome.
import { timeOf } from "../format.js";
import { $ } from "./dom.js";

export function renderRounds(rounds, currentRound) {
  const body = $("rounds-body");
  if (!rounds.length) return;
  body.replaceChildren(
    ...rounds.map((r) => {
      const tr = document.createElement("tr");
      if (r.number === currentRound) tr.className = "current";
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
