// Submit page: upload code (an archive, or a folder zipped in the browser) to
// /api/v1/bundles/ with a progress bar, build the job spec, POST it to /api/v1/jobs/, and show
// the API's own field errors beside their fields.
import { zip } from "fflate";
import { apiRequest, csrfToken, errorText } from "./api.js";
import { formatBytes } from "./format.js";

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

// The roles of a parameter_server job: shown only for that strategy.
const strategy = form.elements.strategy;
const rolesFieldset = document.getElementById("ps-roles");
function syncStrategy() {
  rolesFieldset.hidden = strategy.value !== "parameter_server";
}
strategy.addEventListener("change", syncStrategy);
syncStrategy();

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

function floatField(name) {
  const raw = form.elements[name].value.trim();
  return raw === "" ? undefined : Number(raw);
}

// KEY=value per line (blank lines and # comments skipped); the API checks names and values.
function parseEnv(text) {
  const value = {};
  for (const [i, raw] of text.split("\n").entries()) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const eq = line.indexOf("=");
    if (eq <= 0) return { error: `Line ${i + 1}: write KEY=value.` };
    value[line.slice(0, eq).trim()] = line.slice(eq + 1);
  }
  return { value };
}

// Secrets: a name and a password field per row; the values go into the spec's secret_env, which
// the API keeps write-only (it answers with the names).
const secretRows = document.getElementById("secret-rows");
function addSecretRow() {
  const row = document.createElement("div");
  row.className = "secret-row";
  const n = secretRows.children.length + 1;
  const name = Object.assign(document.createElement("input"), {
    className: "mono", placeholder: "WANDB_API_KEY", autocomplete: "off", spellcheck: false,
  });
  name.dataset.secret = "name";
  name.setAttribute("aria-label", `Secret ${n} name`);
  const value = Object.assign(document.createElement("input"), { type: "password", autocomplete: "new-password" });
  value.dataset.secret = "value";
  value.setAttribute("aria-label", `Secret ${n} value`);
  const remove = Object.assign(document.createElement("button"), { type: "button", className: "button ghost small", textContent: "Remove" });
  remove.setAttribute("aria-label", `Remove secret ${n}`);
  remove.addEventListener("click", () => row.remove());
  row.append(name, value, remove);
  secretRows.append(row);
  return row;
}
document.getElementById("add-secret").addEventListener("click", () => addSecretRow().querySelector("input").focus());

function secretEnv() {
  const value = {};
  for (const [i, row] of [...secretRows.querySelectorAll(".secret-row")].entries()) {
    const name = row.querySelector('[data-secret="name"]').value.trim();
    const secret = row.querySelector('[data-secret="value"]').value;
    if (!name && !secret) continue;
    if (!name) return { error: `Secret ${i + 1}: give it a name.` };
    if (Object.hasOwn(value, name)) return { error: `${name} is given twice.` };
    value[name] = secret;
  }
  return { value };
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
    grace_period: floatField("grace_period"),
  };
  if (spec.strategy === "parameter_server") {
    spec.roles = {
      ps: { count: intField("ps_count"), mode: form.elements.ps_mode.value },
      worker: { count: intField("worker_count"), min: intField("worker_min"), max: intField("worker_max") },
    };
  }
  const env = parseEnv(form.elements.env.value);
  if (env.error) return { error: ["env", env.error] };
  spec.env = env.value;
  const secrets = secretEnv();
  if (secrets.error) return { error: ["secret_env", secrets.error] };
  if (Object.keys(secrets.value).length) spec.secret_env = secrets.value;
  const chosen = form.elements.workload.value.trim();
  if (chosen) {
    spec.workload = chosen;
  } else {
    spec.entrypoint = form.elements.entrypoint.value.trim();
    spec.args = form.elements.args.value.split("\n").map((a) => a.trim()).filter(Boolean);
    const bundle = form.elements.bundle.value.trim();
    if (bundle !== "") spec.bundle = Number(bundle);
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

// --- code upload -------------------------------------------------------------------------------
const bundleSelect = form.elements.bundle;
const progress = document.getElementById("upload-progress");
const uploadStatus = document.getElementById("upload-status");

function setUploadStatus(text, bad) {
  uploadStatus.textContent = text;
  uploadStatus.className = `hint${bad ? " bad" : ""}`;
}

// A folder becomes a zip of its files, paths relative to the folder (as `trainyard submit` packs
// a directory), so the entrypoint is named as it is inside the folder.
function zipFolder(files) {
  const entries = {};
  for (const { file, data } of files) {
    const path = file.webkitRelativePath || file.name;
    const inside = path.includes("/") ? path.slice(path.indexOf("/") + 1) : path;
    entries[inside] = data;
  }
  return new Promise((resolve, reject) => {
    zip(entries, { level: 6 }, (err, out) => (err ? reject(err) : resolve(out)));
  });
}

function upload(blob, filename) {
  return new Promise((resolve) => {
    const body = new FormData();
    body.append("file", blob, filename);
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/api/v1/bundles/");
    xhr.setRequestHeader("X-CSRFToken", csrfToken());
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", (ev) => {
      if (ev.lengthComputable) progress.value = Math.round((ev.loaded / ev.total) * 100);
    });
    xhr.addEventListener("load", () => {
      let parsed = null;
      try { parsed = JSON.parse(xhr.responseText); } catch { parsed = null; }
      resolve({ ok: xhr.status === 201, status: xhr.status, body: parsed });
    });
    xhr.addEventListener("error", () => resolve({ ok: false, status: 0, body: null }));
    xhr.send(body);
  });
}

async function uploadSelected(input) {
  const files = [...input.files];
  if (!files.length) return;
  clearErrors();
  progress.hidden = false;
  progress.value = 0;
  let blob, filename;
  if (input.id === "f-folder") {
    setUploadStatus(`Packing ${files.length} files…`);
    const read = await Promise.all(files.map(async (file) => ({ file, data: new Uint8Array(await file.arrayBuffer()) })));
    const top = (files[0].webkitRelativePath || "code").split("/")[0];
    blob = new Blob([await zipFolder(read)], { type: "application/zip" });
    filename = `${top}.zip`;
  } else {
    blob = files[0];
    filename = files[0].name;
  }
  setUploadStatus(`Uploading ${filename}…`);
  const result = await upload(blob, filename);
  input.value = "";
  if (!result.ok) {
    progress.hidden = true;
    const text = result.status ? errorText(result.body, result.status) : "Network error while uploading.";
    fieldError("bundle", text);
    setUploadStatus("Upload failed.", true);
    return;
  }
  progress.value = 100;
  const b = result.body;
  let option = bundleSelect.querySelector(`option[value="${b.id}"]`);
  if (!option) {
    option = document.createElement("option");
    option.value = String(b.id);
    bundleSelect.insertBefore(option, bundleSelect.options[1] || null);
  }
  option.textContent = `#${b.id} ${b.filename || "bundle"} (${formatBytes(b.size_bytes)}, just now)`;
  bundleSelect.value = String(b.id);
  setUploadStatus(`Uploaded ${filename} as bundle #${b.id}.`);
}

for (const id of ["f-archive", "f-folder"]) {
  const input = document.getElementById(id);
  if (input) input.addEventListener("change", () => uploadSelected(input));
}
