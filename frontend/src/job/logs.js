// The Logs panel: history loaded page by page, the live tail (a burst's skipped lines refetched),
// rank and text filters, follow/pause, download, and a failing rank's lines on request.
import { getJSON } from "../api.js";
import { LogView } from "../logview.js";
import { $ } from "./dom.js";

const LOG_PAGE = 5000;

export class LogPanel {
  constructor(jobId) {
    this.jobId = jobId;
    this.dropped = 0;
    this.olderAvailable = false;
    // The rank filter offers every rank seen so far (rounds grow and shrink the world).
    this.rankSelect = $("log-rank");
    this.view = new LogView($("log-viewport"), { onChange: () => this.renderStatus() });
    this.bind();
  }

  ensureRankOption(rank) {
    const value = String(rank);
    const options = [...this.rankSelect.options];
    if (options.some((o) => o.value === value)) return;
    const option = new Option(`Rank ${rank}`, value);
    const after = options.find((o) => o.value !== "" && Number(o.value) > rank);
    this.rankSelect.add(option, after || null);
  }

  renderStatus() {
    const view = this.view;
    if (view.ranks.size !== this.rankSelect.options.length - 1) view.ranks.forEach((r) => this.ensureRankOption(r));
    const follow = $("log-follow");
    follow.setAttribute("aria-pressed", String(view.follow));
    follow.textContent = view.follow ? "Pause" : "Follow";
    const parts = [`${view.visible.length.toLocaleString("en-US")} of ${view.lines.length.toLocaleString("en-US")} lines`];
    parts.push(`${this.dropped.toLocaleString("en-US")} dropped from the live tail${this.dropped ? " (refetched)" : ""}`);
    $("log-status").textContent = parts.join(" · ");
  }

  url(params) {
    return `/api/v1/jobs/${this.jobId}/logs/?${new URLSearchParams(params)}`;
  }

  async loadHistory(limitLines) {
    let before = this.view.firstId || null;
    let loaded = 0;
    while (loaded < limitLines) {
      const params = { limit: String(LOG_PAGE) };
      if (before) params.before = String(before);
      const body = await getJSON(this.url(params));
      this.view.prepend(body.lines);
      loaded += body.lines.length;
      this.olderAvailable = body.lines.length === LOG_PAGE;
      if (!this.olderAvailable) break;
      before = body.lines[0].id;
    }
    $("log-older").hidden = !this.olderAvailable;
  }

  async fetchAfter(after) {
    let cursor = after;
    for (let i = 0; i < 20; i++) {
      const body = await getJSON(this.url({ after: String(cursor), limit: String(LOG_PAGE) }));
      this.view.append(body.lines);
      if (body.lines.length < LOG_PAGE) break;
      cursor = body.last_id;
    }
  }

  // A live frame of log lines.
  onFrame(data) {
    const before = this.view.lastId;
    this.view.append(data.lines || []);
    if (data.skipped) {
      // The live tail keeps the newest lines of a burst; the ones it skipped are in the database.
      this.dropped += data.skipped;
      this.fetchAfter(before).catch(() => {});
      this.renderStatus();
    }
  }

  async showFailure(cause) {
    this.ensureRankOption(cause.rank);
    $("log-rank").value = String(cause.rank);
    $("log-search").value = "";
    this.view.setFilter({ rank: String(cause.rank), query: "" });
    const body = await getJSON(this.url({ rank: String(cause.rank), round: String(cause.round), limit: "400" }));
    this.view.append(body.lines);
    // The failing lines: the rank's lines that make up its error (the traceback or last stderr).
    const error = String(cause.error || "");
    const wanted = body.lines.filter((l) => l.text.trim() && error.includes(l.text.trim()));
    const ids = (wanted.length ? wanted : body.lines.filter((l) => l.stream === "stderr").slice(-20)).map((l) => l.id);
    this.view.focusLines(ids.length ? ids : body.lines.slice(-10).map((l) => l.id));
    $("log-card").scrollIntoView({ block: "start" });
    $("log-viewport").focus();
    $("log-status").textContent += ` · showing rank ${cause.rank}'s failure in round ${cause.round}`;
  }

  bind() {
    const view = this.view;
    $("log-rank").addEventListener("change", (ev) => view.setFilter({ rank: ev.target.value }));
    $("log-search").addEventListener("input", (ev) => view.setFilter({ query: ev.target.value }));
    $("log-follow").addEventListener("click", () => view.setFollow(!view.follow));
    $("log-older").addEventListener("click", async (ev) => {
      const button = ev.currentTarget;
      button.disabled = true;
      try {
        await this.loadHistory(LOG_PAGE * 4);
      } catch {
        // The button stays for another try.
      } finally {
        button.disabled = false;
      }
    });
    $("log-download").addEventListener("click", () => {
      const blob = new Blob([view.text() + "\n"], { type: "text/plain" });
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = `job-${this.jobId}-logs${view.filter.rank !== "" ? `-rank${view.filter.rank}` : ""}.txt`;
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 1000);
    });
  }
}
