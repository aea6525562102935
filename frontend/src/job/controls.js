// The Control card (operators): resize (nodes, or a parameter-server role's count), restart and
// stop, each through the REST API; its answer shown under the buttons.
import { apiRequest } from "../api.js";
import { $ } from "./dom.js";

// onAccepted(summary): the API's new state, round and restarts for the page.
export function bindControls(jobId, onAccepted) {
  const actions = $("job-actions");
  if (!actions) return;
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
      if (result.body && result.body.state) onAccepted({ state: result.body.state, round: result.body.round, restarts: result.body.restarts });
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
