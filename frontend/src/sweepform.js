// The sweep form: its fields as the API's JSON (POST /api/v1/sweeps/), the API's field errors shown
// beside their fields, the new sweep's page on success.
import { apiRequest } from "./api.js";

const form = document.getElementById("sweep-form");
const message = document.getElementById("sweep-form-message");
const JSON_FIELDS = ["job", "space", "pruner_options"];
const NUMBER_FIELDS = ["seed", "max_trials", "parallel"];

function showError(field, text) {
  const slot = form.querySelector(`[data-error-for="${field}"]`);
  const input = form.elements.namedItem(field);
  if (input) input.setAttribute("aria-invalid", text ? "true" : "false");
  if (slot) {
    slot.textContent = text;
    if (input && slot.id === "") slot.id = `error-${field}`;
    if (input) input.setAttribute("aria-describedby", slot.id);
    return true;
  }
  return false;
}

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  form.querySelectorAll("[data-error-for]").forEach((slot) => showError(slot.dataset.errorFor, ""));
  const body = {};
  for (const el of form.elements) {
    if (!el.name) continue;
    body[el.name] = el.value;
  }
  for (const field of JSON_FIELDS) {
    try {
      body[field] = JSON.parse(body[field] || "{}");
    } catch (err) {
      showError(field, `Not valid JSON: ${err.message}`);
      message.textContent = "Fix the fields marked above.";
      return;
    }
  }
  for (const field of NUMBER_FIELDS) body[field] = Number(body[field]);
  message.textContent = "Submitting…";
  const result = await apiRequest("POST", "/api/v1/sweeps/", body);
  if (result.ok) {
    location.assign(`/sweeps/${result.body.id}/`);
    return;
  }
  const errors = (result.body && result.body.errors) || {};
  const unplaced = [];
  for (const [field, messages] of Object.entries(errors)) {
    const text = Array.isArray(messages) ? messages.join(" ") : String(messages);
    if (!showError(field, text)) unplaced.push(`${field}: ${text}`);
  }
  message.textContent = unplaced.length ? unplaced.join(" ") : result.message || "Fix the fields marked above.";
});
