// A small line chart on <canvas>: a few series of [step, value] points, auto-scaled axes.

const COLORS = ["#4aa3ff", "#3fb950", "#d29922", "#a371f7", "#f85149"];

function niceTicks(min, max, count) {
  if (min === max) {
    const pad = Math.abs(min) * 0.1 || 1;
    return niceTicks(min - pad, max + pad, count);
  }
  const raw = (max - min) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  // The axis runs from a tick below the data to a tick above it, so both ends are labelled.
  const lo = Math.floor(min / step) * step;
  const hi = Math.ceil(max / step) * step;
  const ticks = [];
  for (let i = 0; lo + i * step <= hi + step * 1e-9; i++) ticks.push(lo + i * step);
  return { ticks, lo, hi };
}

function formatNumber(v) {
  const a = Math.abs(v);
  if (a >= 1e4 || (a > 0 && a < 1e-3)) return v.toExponential(1).replace(".0e", "e");
  return Number(v.toPrecision(3)).toString();
}

export class LineChart {
  constructor(canvas, legend) {
    this.canvas = canvas;
    this.legend = legend;
    this.series = {};
    this.maxPoints = 2000;
    window.addEventListener("resize", () => this.draw());
  }

  setSeries(series) {
    this.series = {};
    for (const [name, points] of Object.entries(series || {})) this.series[name] = points.slice(-this.maxPoints);
    this.draw();
  }

  // Appends points newer than what the chart has (websocket frames may repeat a tail).
  append(series) {
    for (const [name, points] of Object.entries(series || {})) {
      const current = this.series[name] || [];
      const last = current.length ? current[current.length - 1][0] : -Infinity;
      for (const p of points) if (p[0] > last) current.push(p);
      this.series[name] = current.slice(-this.maxPoints);
    }
    this.draw();
  }

  hasData() {
    return Object.values(this.series).some((points) => points.some((p) => Number.isFinite(p[1])));
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 640;
    const height = canvas.clientHeight || 240;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);

    const names = Object.keys(this.series).filter((n) => this.series[n].some((p) => Number.isFinite(p[1])));
    if (this.legend) {
      this.legend.innerHTML = "";
      names.forEach((name, i) => {
        const item = document.createElement("span");
        item.style.color = COLORS[i % COLORS.length];
        item.style.marginLeft = "12px";
        const finite = this.series[name].filter((p) => Number.isFinite(p[1]));
        const last = finite[finite.length - 1];
        item.textContent = last ? `● ${name} ${formatNumber(last[1])} @ ${last[0]}` : `● ${name}`;
        this.legend.appendChild(item);
      });
    }
    if (!names.length) return;

    let xMin = Infinity, xMax = -Infinity, yMin = Infinity, yMax = -Infinity;
    for (const name of names) {
      for (const [x, y] of this.series[name]) {
        if (!Number.isFinite(y)) continue;
        xMin = Math.min(xMin, x); xMax = Math.max(xMax, x);
        yMin = Math.min(yMin, y); yMax = Math.max(yMax, y);
      }
    }
    if (!Number.isFinite(xMin)) return;
    const left = 52, right = 28, top = 10, bottom = 26;
    const plotW = width - left - right, plotH = height - top - bottom;
    // Losses often fall by orders of magnitude; a log axis keeps the tail readable.
    const logScale = yMin > 0 && yMax / yMin > 100;
    const ty = logScale ? (v) => Math.log10(v) : (v) => v;
    let yt;
    if (logScale) {
      const lo = Math.floor(Math.log10(yMin)), hi = Math.ceil(Math.log10(yMax));
      const stride = Math.max(1, Math.ceil((hi - lo) / 5));
      const ticks = [];
      for (let t = lo; t <= hi; t += stride) ticks.push(t);
      yt = { ticks, lo, hi: Math.max(hi, ticks[ticks.length - 1]) };
    } else {
      yt = niceTicks(yMin, yMax, 4);
    }
    const xt = niceTicks(Math.max(0, xMin), xMax === xMin ? xMin + 1 : xMax, 6);
    const sx = (x) => left + ((x - xt.lo) / (xt.hi - xt.lo || 1)) * plotW;
    const sy = (y) => top + plotH - ((ty(y) - yt.lo) / (yt.hi - yt.lo || 1)) * plotH;

    ctx.font = "11px system-ui, sans-serif";
    if (logScale) {
      ctx.fillStyle = "#8791a0";
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      ctx.fillText("log scale", left + 6, top + 2);
    }
    ctx.strokeStyle = "#2a313c";
    ctx.fillStyle = "#8791a0";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const t of yt.ticks) {
      const value = logScale ? Math.pow(10, t) : t;
      const y = Math.round(sy(value)) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(width - right, y); ctx.stroke();
      ctx.fillText(formatNumber(value), left - 6, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const t of xt.ticks) ctx.fillText(formatNumber(t), sx(t), height - bottom + 6);

    names.forEach((name, i) => {
      ctx.strokeStyle = COLORS[i % COLORS.length];
      ctx.lineWidth = 1.6;
      ctx.beginPath();
      let started = false;
      for (const [x, y] of this.series[name]) {
        if (!Number.isFinite(y)) continue;
        if (started) ctx.lineTo(sx(x), sy(y));
        else { ctx.moveTo(sx(x), sy(y)); started = true; }
      }
      ctx.stroke();
    });
  }
}
