// The Progress card: how far the job is (console/jobs/progress.py: steps, or a parameter-server
// job's examples or shards) with an ETA.
//
// The job's progress comes with every state message (the controller records it from heartbeats).
// A step-counted job's live metric frames carry newer steps between heartbeats, so the card
// follows them too (within the recorded round or a later one), and the script's own total
// (sdk.progress, the total_steps metric) arrives with them.
import { formatDuration, formatNumber, progressParts, readProgress, TERMINAL } from "../format.js";
import { $ } from "./dom.js";

// Weight of the newest rate in the examples/s estimate (an exponential moving average).
const RATE_WEIGHT = 0.3;

export class ProgressCard {
  // unit: "steps" for allreduce jobs, "examples" for parameter-server jobs (from the page config).
  constructor(job, { total, unit }) {
    this.job = job; // the page's live job summary (state, progress)
    this.unit = unit || "steps";
    this.total = total || null; // the script's own total (sdk.progress), when it gave one
    this.live = null; // {round, step}: the newest step seen in live frames
    this.stepTime = null; // seconds, the ranks' median
    this.rate = null; // units per second, from successive readings (examples, shards)
    this.last = null; // {step, at} of the previous reading
  }

  setTotal(total) {
    this.total = total;
    this.render();
  }

  setStepTime(seconds) {
    this.stepTime = seconds;
    this.render();
  }

  // A live frame's newest step in ``round`` (step-counted jobs only).
  noteStep(round, step) {
    if (this.unit !== "steps" || !Number.isFinite(step)) return;
    if (!this.live || round > this.live.round || (round === this.live.round && step > this.live.step)) {
      this.live = { round, step };
      this.render();
    }
  }

  // What the card shows: the recorded progress, moved on by live frames of its round or later.
  current() {
    const recorded = readProgress(this.job.progress);
    const unit = recorded ? recorded.unit : this.unit;
    let step = recorded ? recorded.step : null;
    let total = recorded ? recorded.total : null;
    if (unit === "steps") {
      total = this.total || total;
      const live = this.live;
      if (live && (!recorded || live.round > recorded.round || (live.round === recorded.round && live.step > step))) {
        step = live.step;
      }
    }
    return step === null ? null : { step, total, unit };
  }

  measureRate(progress) {
    const now = performance.now() / 1000;
    if (this.last && progress.step > this.last.step && now > this.last.at) {
      const rate = (progress.step - this.last.step) / (now - this.last.at);
      this.rate = this.rate === null ? rate : RATE_WEIGHT * rate + (1 - RATE_WEIGHT) * this.rate;
    }
    if (!this.last || progress.step !== this.last.step) this.last = { step: progress.step, at: now };
  }

  eta(progress) {
    const { step, total, unit } = progress;
    if (TERMINAL.has(this.job.state)) return this.job.state.toLowerCase();
    if (step >= total) return "done";
    const remaining = total - step;
    if (unit === "steps") {
      return this.stepTime
        ? `ETA ${formatDuration(remaining * this.stepTime)} at ${formatNumber(this.stepTime)} s/step`
        : "ETA: measuring step time…";
    }
    return this.rate
      ? `ETA ${formatDuration(remaining / this.rate)} at ${formatNumber(this.rate)} ${unit}/s`
      : `ETA: measuring ${unit}/s…`;
  }

  render() {
    const progress = this.current();
    const bar = $("job-progress-bar");
    const label = $("job-progress");
    const eta = $("job-eta");
    if (progress && progress.unit !== "steps") this.measureRate(progress);
    const [value, unit] = progressParts(progress || this.job.progress);
    const small = document.createElement("span");
    small.className = "stat-unit";
    small.textContent = unit;
    label.replaceChildren(value, unit ? " " : "", small);
    if (progress && progress.total) {
      const percent = Math.round(Math.max(0, Math.min(1, progress.step / progress.total)) * 100);
      bar.style.width = `${percent}%`;
      bar.parentElement.setAttribute("aria-valuenow", String(percent));
      eta.textContent = this.eta(progress);
    } else if (progress && progress.unit === "steps") {
      eta.textContent = "no total: call sdk.progress(total) or set hyperparameter steps";
    } else {
      eta.textContent = "";
    }
  }
}
