// Display helpers shared by the pages; they mirror console/web/templatetags/console_ui.py.

const TOTAL_KEYS = ["total_steps", "max_steps", "steps_total", "total"];

export function progressFraction(progress) {
  if (!progress || typeof progress !== "object") return null;
  if (typeof progress.fraction === "number") return Math.max(0, Math.min(1, progress.fraction));
  const total = TOTAL_KEYS.map((k) => progress[k]).find((v) => typeof v === "number");
  if (typeof progress.step === "number" && total) return Math.max(0, Math.min(1, progress.step / total));
  return null;
}

export function progressLabel(progress) {
  if (!progress || typeof progress !== "object" || !Object.keys(progress).length) return "—";
  const total = TOTAL_KEYS.map((k) => progress[k]).find((v) => v !== undefined && v !== null);
  if (progress.step !== undefined && total !== undefined) return `${progress.step}/${total}`;
  if (progress.step !== undefined) return `step ${progress.step}`;
  const f = progressFraction(progress);
  return f === null ? "—" : `${Math.round(f * 100)}%`;
}

export function setBadge(el, state) {
  if (!el || !state) return;
  el.textContent = state;
  el.className = `badge badge-${String(state).toLowerCase()}`;
}

export function age(iso) {
  if (!iso) return "never";
  const seconds = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
  for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "m"]]) {
    if (seconds >= size) return `${Math.floor(seconds / size)}${unit}`;
  }
  return `${seconds}s`;
}

export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "STOPPED"]);
