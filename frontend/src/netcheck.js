// A pre-flight network check started from a page (node page, network page): POST to the
// button's data-check-url, poll /api/v1/nodes/network/?check=ID until the check is done, then
// replace the page's sections named in `sections` with their fresh server-rendered versions.
import { apiRequest, getJSON } from "./api.js";

const POLL_MS = 500;
const GIVE_UP_MS = 30000;

async function refreshSections(ids) {
  const response = await fetch(location.pathname, { credentials: "same-origin" });
  if (!response.ok) return;
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  for (const id of ids) {
    const next = fresh.getElementById(id);
    const current = document.getElementById(id);
    if (next && current) current.replaceWith(next);
  }
}

export function wireCheckButton(button, message, sections) {
  if (!button) return;
  button.addEventListener("click", async () => {
    button.disabled = true;
    message.textContent = "Checking…";
    message.className = "action-message";
    const started = await apiRequest("POST", button.dataset.checkUrl, {});
    if (!started.ok) {
      button.disabled = false;
      message.textContent = started.message;
      message.className = "action-message bad";
      return;
    }
    const id = started.body.id;
    const began = Date.now();
    let check = started.body;
    while (!check.done && Date.now() - began < GIVE_UP_MS) {
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
      try {
        const view = await getJSON(`/api/v1/nodes/network/?check=${id}`);
        check = view.checks[0] || check;
      } catch {
        // The next poll tries again.
      }
    }
    button.disabled = false;
    if (!check.done) {
      message.textContent = `Check #${id} is still running; reload later.`;
      message.className = "action-message bad";
      return;
    }
    const failed = check.nodes.length && Object.values(check.results || {}).some((r) => (r.peers || []).some((p) => !p.ok));
    const silent = check.silent && check.silent.length ? ` No answer from ${check.silent.join(", ")}.` : "";
    message.textContent = `Check #${id} done: ${failed ? "some links failed" : "every link tested reached"}.${silent}`;
    message.className = failed || silent ? "action-message bad" : "action-message ok";
    await refreshSections(sections);
  });
}
