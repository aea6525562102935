// Display helpers shared by the pages; they mirror console/web/templatetags/console_ui.py.

// A job's progress (console/jobs/progress.py): {step, total, unit: "steps" | "examples" |
// "shards", round}; records older than units hold a step and a total (under one of these keys).
const TOTAL_KEYS = ["total", "total_steps", "max_steps", "steps_total"];
const UNITS = ["steps", "examples", "shards"];
const whole = (v) => (typeof v === "number" && Number.isFinite(v) ? Math.trunc(v) : null);

export function readProgress(progress) {
  if (!progress || typeof progress !== "object") return null;
  const step = whole(progress.step);
  if (step === null) return null;
  const total = TOTAL_KEYS.map((k) => whole(progress[k])).find((v) => v) || null;
  const unit = UNITS.includes(progress.unit) ? progress.unit : "steps";
  return { step, total: total && total > 0 ? total : null, unit, round: whole(progress.round) || 0 };
}

export function progressFraction(progress) {
  if (progress && typeof progress.fraction === "number") return Math.max(0, Math.min(1, progress.fraction));
  const p = readProgress(progress);
  if (!p || !p.total) return null;
  return Math.max(0, Math.min(1, p.step / p.total));
}

const count = (n) => n.toLocaleString("en-US");

// The label's number part and its unit: ["1,200/4,000", "steps"], ["step 1,200", ""].
export function progressParts(progress) {
  const p = readProgress(progress);
  if (!p) {
    const f = progressFraction(progress);
    return [f === null ? "—" : `${Math.round(f * 100)}%`, ""];
  }
  if (p.total) return [`${count(p.step)}/${count(p.total)}`, p.unit];
  return p.unit === "steps" ? [`step ${count(p.step)}`, ""] : [count(p.step), p.unit];
}

// "1,200/4,000 steps", "3,072,000/4,608,000 examples", "step 1,200" (no total).
export function progressLabel(progress) {
  const [value, unit] = progressParts(progress);
  return unit ? `${value} ${unit}` : value;
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

export function formatNumber(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2).replace(/\.?0+e/, "e");
  if (a >= 1000) return Math.round(v).toLocaleString("en-US");
  return Number(v.toPrecision(4)).toString();
}

export function formatBytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${i ? v.toFixed(v >= 100 ? 0 : 1) : Math.round(v)} ${units[i]}`;
}

export function formatDuration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "–";
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

export function timeOf(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return d.toISOString().slice(11, 19);
}
