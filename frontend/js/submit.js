// Submit page: build the job spec, POST it to /api/v1/jobs/, show field errors.
import { apiRequest } from "./api.js";

const form = document.getElementById("submit-form");
const catalog = JSON.parse(document.getElementById("workload-catalog").textContent || "{}");
const workload = document.getElementById("f-workload");
const description = document.getElementById("workload-description");
const hp = document.getElementById("f-hp");
const formError = document.getElementById("form-error");

function syncWorkload() {
  const info = catalog[workload.value];
  const builtIn = Boolean(workload.value);
  document.querySelectorAll(".field.entry").forEach((el) => { el.hidden = builtIn && Object.keys(catalog).length > 0; });
  if (description) description.textContent = info ? info.description : "";
  const help = document.getElementById("hp-help");
  help.innerHTML = "";
  for (const [key, text] of Object.entries((info && info.help) || {})) {
    const dt = document.createElement("dt");
    dt.textContent = key;
    const dd = document.createElement("dd");
    dd.textContent = text;
    help.append(dt, dd);
  }
  if (info && (hp.value.trim() === "" || hp.value.trim() === "{}" || hp.dataset.auto === "1")) {
    hp.value = JSON.stringify(info.hyperparameters || {}, null, 2);
    hp.dataset.auto = "1";
  }
}
if (workload && workload.tagName === "SELECT") {
  workload.addEventListener("change", syncWorkload);
  hp.addEventListener("input", () => { hp.dataset.auto = "0"; });
  syncWorkload();
}

function clearErrors() {
  formError.hidden = true;
  formError.textContent = "";
  form.querySelectorAll(".field-error").forEach((el) => { el.textContent = ""; });
  form.querySelectorAll(".field.invalid").forEach((el) => el.classList.remove("invalid"));
}

function fieldError(field, text) {
  const el = form.querySelector(`.field-error[data-for="${field}"]`);
  if (!el) return false;
  el.textContent = text;
  el.closest(".field")?.classList.add("invalid");
  return true;
}

function intField(name) {
  const raw = form.elements[name].value.trim();
  return raw === "" ? undefined : Number(raw);
}

function buildSpec() {
  const spec = {
    name: form.elements.name.value.trim(),
    nnodes: form.elements.nnodes.value.trim(),
    nproc_per_node: intField("nproc_per_node"),
    gpus_per_proc: intField("gpus_per_proc"),
    strategy: form.elements.strategy.value,
    precision: form.elements.precision.value,
    grad_accum_steps: intField("grad_accum_steps"),
    max_restarts: intField("max_restarts"),
    priority: intField("priority"),
  };
  const chosen = form.elements.workload.value.trim();
  if (chosen) {
    spec.workload = chosen;
  } else {
    spec.entrypoint = form.elements.entrypoint.value.trim();
    spec.args = form.elements.args.value.split("\n").map((a) => a.trim()).filter(Boolean);
    const bundle = intField("bundle");
    if (bundle !== undefined) spec.bundle = bundle;
    const workdir = form.elements.workdir.value.trim();
    if (workdir) spec.workdir = workdir;
  }
  const text = hp.value.trim() || "{}";
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    return { error: ["hyperparameters", `Not valid JSON: ${err.message}`] };
  }
  if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
    return { error: ["hyperparameters", "Must be a JSON object, e.g. {\"lr\": 0.01}."] };
  }
  spec.hyperparameters = parsed;
  for (const key of Object.keys(spec)) if (spec[key] === undefined) delete spec[key];
  return { spec };
}

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  clearErrors();
  const { spec, error } = buildSpec();
  if (error) {
    fieldError(...error);
    return;
  }
  const button = document.getElementById("submit-button");
  button.disabled = true;
  const result = await apiRequest("POST", "/api/v1/jobs/", spec);
  button.disabled = false;
  if (result.ok && result.body && result.body.id !== undefined) {
    location.assign(`/jobs/${result.body.id}/`);
    return;
  }
  const errors = (result.body && result.body.errors) || {};
  const unplaced = [];
  for (const [field, messages] of Object.entries(errors)) {
    const text = Array.isArray(messages) ? messages.join(" ") : typeof messages === "object" ? JSON.stringify(messages) : String(messages);
    if (!fieldError(field, text)) unplaced.push(field === "non_field_errors" ? text : `${field}: ${text}`);
  }
  const detail = result.body && result.body.detail && result.body.detail !== "Invalid input." ? result.body.detail : "";
  const summary = [detail, ...unplaced].filter(Boolean).join(" ");
  if (summary || !Object.keys(errors).length) {
    formError.textContent = summary || result.message;
    formError.hidden = false;
  }
});
