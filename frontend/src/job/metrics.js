// The Metrics card: the job's charts (jobcharts.js) with the zoom form, the round boundaries as
// text, and live frames appended (a frame that skipped some, or a reconnect, refetches the gap).
import { JobCharts } from "../jobcharts.js";
import { $ } from "./dom.js";

export class MetricsPanel {
  // onTotal(total): the script's total_steps arrived live; onNewRound(): a new round's first
  // points; onStep(round, step): a frame's newest step.
  // skip(name): a series charted elsewhere (a parameter-server job's role series).
  constructor(config, { onTotal, onNewRound, onStep, skip }) {
    this.lastFrame = 0;
    this.liveRound = config.round;
    this.gapPending = false;
    this.onNewRound = onNewRound;
    this.onStep = onStep;
    this.charts = new JobCharts(config.id, $("charts"), { names: config.names, onTotal, skip });
    const group = this.charts.group;
    // The boundaries drawn on the charts, also as text (for screen readers, and to read exact steps).
    group.onBoundaries = (list) => {
      $("round-boundaries").textContent = list.length
        ? `Round boundaries: ${list.map((b) => `round ${b.round} (${b.reason}${b.world ? `, world ${b.world}` : ""}) from step ${b.step}`).join("; ")}.`
        : "";
    };
    group.setBoundaries(config.boundaries);
    $("layers-toggle")?.addEventListener("change", (ev) => this.charts.setLayers(ev.target.checked).catch(() => {}));
    $("zoom-reset").addEventListener("click", () => group.resetZoom());
    $("zoom-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const from = Number($("zoom-from").value), to = Number($("zoom-to").value);
      if (Number.isFinite(from) && Number.isFinite(to) && to > from) group.setZoom(from, to);
    });
    group.onZoom((zoom) => {
      $("zoom-state").textContent = zoom ? `steps ${zoom.min}–${zoom.max}` : "all steps";
      if (zoom) {
        $("zoom-from").value = zoom.min;
        $("zoom-to").value = zoom.max;
      }
    });
  }

  // The job's rounds (from its detail): a boundary drawn before the detail said why takes its reason.
  updateBoundaries(rounds) {
    const group = this.charts.group;
    for (const r of rounds) {
      const b = group.boundaries.find((x) => x.round === r.number);
      if (b && (b.reason !== r.reason || b.world !== r.world_size)) {
        b.reason = r.reason;
        b.world = r.world_size;
        group.setBoundaries([...group.boundaries]);
      }
    }
  }

  load(firstUrl, afterFirst) {
    return this.charts.load(firstUrl, afterFirst).catch((err) => {
      $("charts-error").textContent = `Charts could not load: ${err.message}`;
    });
  }

  // A live frame: {"series": {name: [[step, value], ...]}, "round": R, "frame": N}.
  onFrame(data) {
    if (data.frame && this.lastFrame && data.frame > this.lastFrame + 1) this.refetchGap();
    if (data.frame) this.lastFrame = data.frame;
    // total_steps is logged at step 0 whatever the step: it is no step taken; nor are the agent's
    // resource samples (res_*: a plain script's are at its seconds running).
    const steps = Object.entries(data.series || {})
      .filter(([name]) => name !== "total_steps" && !name.startsWith("res_"))
      .flatMap(([, pts]) => pts.map((p) => p[0]));
    if (data.round && steps.length) this.onStep(data.round, Math.max(...steps));
    if (data.round && data.round > this.liveRound) {
      // A new round's first points: its boundary goes where they start. The first round has
      // nothing before it.
      if (steps.length) {
        if (this.liveRound >= 1) {
          this.charts.group.addBoundary({ round: data.round, step: Math.min(...steps), reason: "new round", world: null });
        }
        this.liveRound = data.round;
        this.onNewRound();
      }
    }
    this.charts.appendFrame(data.series);
  }

  async refetchGap() {
    if (this.gapPending) return;
    this.gapPending = true;
    try {
      await this.charts.refetchSince(this.charts.minLastStep());
    } finally {
      this.gapPending = false;
    }
  }
}
