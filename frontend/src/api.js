// Calls to the console's REST API with the session cookie and CSRF token.

export function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

// The API answers errors as {"detail": "...", "errors": {field: [messages]}}.
export function errorText(body, status) {
  if (!body || typeof body !== "object") return `Request failed (HTTP ${status}).`;
  const parts = [];
  if (body.detail && body.detail !== "Invalid input.") parts.push(String(body.detail));
  const errors = body.errors || {};
  for (const [field, messages] of Object.entries(errors)) {
    const text = Array.isArray(messages) ? messages.join(" ") : String(messages);
    parts.push(field === "non_field_errors" ? text : `${field}: ${text}`);
  }
  if (!parts.length && body.detail) parts.push(String(body.detail));
  return parts.join(" ") || `Request failed (HTTP ${status}).`;
}

export async function apiRequest(method, url, payload) {
  const init = {
    method,
    credentials: "same-origin",
    headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
  };
  if (payload !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(payload);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    return { ok: false, status: 0, body: null, message: `Network error: ${err.message}` };
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return {
    ok: response.ok,
    status: response.status,
    body,
    message: response.ok ? "" : errorText(body, response.status),
  };
}

export async function getJSON(url) {
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  return response.json();
}
