// The Progress card: the job's step against its total, and an ETA from the ranks' median step
// time.
import { formatDuration, formatNumber, progressLabel, TERMINAL } from "../format.js";
import { $ } from "./dom.js";

export class ProgressCard {
  constructor(job, total) {
    this.job = job; // the page's live job summary (state, progress)
    this.total = total || null; // the script's own total (sdk.progress), when it gave one
    this.stepTime = null; // seconds, the ranks' median
  }

  setTotal(total) {
    this.total = total;
    this.render();
  }

  setStepTime(seconds) {
    this.stepTime = seconds;
    this.render();
  }

  render() {
    const { job } = this;
    const step = typeof job.progress.step === "number" ? job.progress.step : null;
    const known = this.total || job.progress.total_steps || job.progress.total || null;
    const bar = $("job-progress-bar");
    const label = $("job-progress");
    const eta = $("job-eta");
    if (step !== null && known) {
      const fraction = Math.max(0, Math.min(1, step / known));
      bar.style.width = `${Math.round(fraction * 100)}%`;
      bar.parentElement.setAttribute("aria-valuenow", String(Math.round(fraction * 100)));
      label.textContent = `${step}/${known}`;
      const remaining = known - step;
      eta.textContent = TERMINAL.has(job.state)
        ? job.state.toLowerCase()
        : remaining <= 0
          ? "done"
          : this.stepTime
            ? `ETA ${formatDuration(remaining * this.stepTime)} at ${formatNumber(this.stepTime)} s/step`
            : "ETA: measuring step time…";
    } else {
      label.textContent = progressLabel(job.progress);
      eta.textContent = step === null ? "" : "no total: call sdk.progress(total) or set hyperparameter steps";
    }
  }
}
