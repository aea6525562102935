// The Checkpoints table, newest first (GET .../checkpoints/).
import { getJSON } from "../api.js";
import { formatBytes, formatNumber, timeOf } from "../format.js";
import { $, patchRows } from "./dom.js";

function checkpointRow(c) {
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
}

export async function refreshCheckpoints(jobId) {
  const body = await getJSON(`/api/v1/jobs/${jobId}/checkpoints/`);
  patchRows($("checkpoints-body"), body.results, (c) => c.id, checkpointRow);
  $("checkpoints-empty").hidden = body.results.length > 0;
}
