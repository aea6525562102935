// The Hangs card: the newest hang of the job (GET .../hangs/), its ranks grouped by identical
// stack ("ranks 0-1 in all_reduce at train.py:41"), each group's stack on demand, every rank's
// node, process state, step and how long it had stalled.
import { getJSON } from "../api.js";
import { $ } from "./dom.js";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function frameLines(frames) {
  return frames.map((f) => `${f.name} (${f.file}:${f.line})`).join("\n");
}

function groupItem(group, stacks) {
  const li = el("li", undefined, "hang-group");
  const details = document.createElement("details");
  const summary = el("summary", group.text);
  details.append(summary);
  const members = stacks.filter((s) => group.ranks.includes(s.rank));
  const who = members
    .map((s) => `rank ${s.rank} on ${s.node} (pid ${s.pid}, ${s.process_state}, step ${s.step ?? "—"}, stalled ${s.stalled_s.toFixed(1)} s${s.native ? ", native frames" : ""})`)
    .join("; ");
  details.append(el("p", who, "muted"));
  const first = members[0];
  const threads = first && first.threads.length ? first.threads : [];
  for (const thread of threads) {
    details.append(el("p", `${thread.name}${thread.idle ? " (idle)" : ""}, innermost first:`, "muted"));
    details.append(el("pre", frameLines(thread.frames), "mono stack"));
  }
  if (!threads.length && first) details.append(el("p", first.error || "no stack", "muted"));
  li.append(details);
  return li;
}

export async function refreshHangs(jobId) {
  const body = await getJSON(`/api/v1/jobs/${jobId}/hangs/`);
  const card = $("hangs-card");
  const hang = body.results[0];
  card.hidden = !hang;
  if (!hang) return;
  $("hang-summary").textContent = hang.concluded_at
    ? `Round ${hang.round} (${hang.reason}, threshold ${hang.threshold_s} s): ${hang.summary}${hang.action && hang.action !== "none" ? ` — policy: ${hang.action}` : ""}`
    : `Round ${hang.round}: gathering the ranks' stacks…`;
  $("hang-count").textContent = body.results.length > 1 ? `${body.results.length} hangs, newest shown` : "";
  const list = $("hang-groups");
  list.replaceChildren(...hang.groups.map((g) => groupItem(g, hang.stacks)));
}
