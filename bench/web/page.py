"""The web bench's browser side: timing hooks added to the job page, its first chart, its live
updates under frames published at 10/s, and scrolling the log view (bench/web/run.py)."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

LOSS_POINTS = 1_000_000
LOG_LINES = 100_000
FRAME_INTERVAL = 0.1
SCROLL_FRAMES = 300

# Timing hooks the bench adds to the page before its scripts run (the console ships none).
INSTRUMENT = """
(() => {
  const stats = { longTasks: [], longTaskSpans: [], handlers: [], frames: [], loaf: [], spans: [] };
  window.__bench = stats;
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        stats.longTasks.push(e.duration);
        stats.longTaskSpans.push([e.startTime, e.duration]);
      }
    }).observe({ type: "longtask", buffered: true });
  } catch (e) {}
  // Long animation frames (>= 50 ms) split into script time, style/layout/paint, and the rest
  // (time the main thread was not running this page's work: another process had the core).
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        const script = e.scripts.reduce((sum, s) => sum + s.duration, 0);
        const render = e.renderStart ? e.startTime + e.duration - e.renderStart : 0;
        const top = e.scripts.reduce((a, b) => (b.duration > (a ? a.duration : -1) ? b : a), null);
        const what = top ? `${top.invoker} ${top.sourceFunctionName || ""}`.trim() : "";
        stats.loaf.push({ duration: e.duration, script, render, what, topMs: top ? top.duration : 0 });
      }
    }).observe({ type: "long-animation-frame", buffered: true });
  } catch (e) {}
  const raf = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (cb) => raf((ts) => {
    const t0 = performance.now();
    try { cb(ts); } finally { const dt = performance.now() - t0; stats.frames.push(dt); stats.spans.push([t0, dt]); }
  });
  const add = EventTarget.prototype.addEventListener;
  EventTarget.prototype.addEventListener = function (type, listener, options) {
    if (type === "message" && this instanceof WebSocket && typeof listener === "function") {
      const timed = function (ev) {
        const t0 = performance.now();
        try { return listener.call(this, ev); } finally {
          const dt = performance.now() - t0;
          stats.handlers.push(dt);
          stats.spans.push([t0, dt]);
        }
      };
      return add.call(this, type, timed, options);
    }
    return add.call(this, type, listener, options);
  };
})();
"""

SCROLL = """
async (frames) => {
  const view = window.trainyardLogView;
  const vp = document.getElementById("log-viewport");
  view.setFollow(false);
  const next = () => new Promise((r) => requestAnimationFrame(r));
  await next();
  const costs = [];
  let y = 0;
  const max = vp.scrollHeight - vp.clientHeight;
  for (let i = 0; i < frames; i++) {
    await next();
    const t0 = performance.now();
    y = (y + 1371) % max;   // large jumps: every frame shows rows it has not shown
    vp.scrollTop = y;
    view.render();
    vp.getBoundingClientRect();
    document.body.offsetHeight;
    costs.push(performance.now() - t0);
  }
  return costs;
}
"""


class FramePublisher(threading.Thread):
    """Publishes metric frames for the job at 10/s on its Redis channel, shaped as ingest's."""

    def __init__(self, redis_url: str, job_id: int) -> None:
        super().__init__(daemon=True)
        import redis

        from console.telemetry.fanout import frame_channel

        self.client = redis.Redis.from_url(redis_url)
        self.channel = frame_channel(
            job_id, int(self.client.connection_pool.connection_kwargs.get("db") or 0)
        )
        self.step = LOSS_POINTS
        self.frame = 0
        self.running = threading.Event()
        self.sent = 0

    def run(self) -> None:
        rng = random.Random(2)
        next_at = time.monotonic()
        while True:
            next_at += FRAME_INTERVAL
            if self.running.is_set():
                self.frame += 1
                steps = range(self.step + 1, self.step + 11)
                self.step += 10
                series = {
                    "loss": [[s, 4.0 / (1 + s / 20_000) + rng.random() * 0.05] for s in steps],
                    "lr": [[steps[-1], 3e-4]],
                    "grad_norm": [[steps[-1], 0.5 + rng.random() * 0.1]],
                    "samples_per_s": [[steps[-1], 2500 + rng.random() * 50]],
                    "step_time_s": [[steps[-1], 0.1 + rng.random() * 0.01]],
                }
                self.client.publish(
                    self.channel,
                    json.dumps({"type": "metrics", "series": series, "round": 1, "frame": self.frame}),
                )
                self.sent += 1
            time.sleep(max(0.0, next_at - time.monotonic()))


def describe_loaf(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "none"
    other = entry["duration"] - entry["script"] - entry["render"]
    return (
        f"{entry['duration']:.0f} ms = script {entry['script']:.0f} + render {entry['render']:.0f} "
        f"+ not running {max(0.0, other):.0f} (longest script {entry['topMs']:.0f} ms: {entry['what']})"
    )


def new_context(browser: Any, base: str, cookie: str) -> Any:
    name, value = cookie.split("=", 1)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": name, "value": value, "url": base}])
    context.add_init_script(INSTRUMENT)
    return context


def first_chart_ms(browser: Any, base: str, cookie: str, job_id: int) -> float:
    context = new_context(browser, base, cookie)
    try:
        page = context.new_page()
        page.goto(f"{base}/jobs/{job_id}/")
        page.wait_for_function(
            "() => performance.getEntriesByName('chart-drawn:loss').length > 0", timeout=30000
        )
        return float(page.evaluate("() => performance.getEntriesByName('chart-drawn:loss')[0].startTime"))
    finally:
        context.close()


def live_longest_task(
    browser: Any,
    base: str,
    cookie: str,
    job_id: int,
    publisher: FramePublisher,
    seconds: float,
    idle_seconds: float,
) -> dict[str, Any]:
    """The live phase, after an idle phase of the same page with no frames arriving: the
    baseline of what the machine alone costs (long tasks while the page does next to nothing)."""
    context = new_context(browser, base, cookie)
    try:
        page = context.new_page()
        page.goto(f"{base}/jobs/{job_id}/")
        page.wait_for_function(
            "() => document.getElementById('live-status').dataset.state === 'live'", timeout=30000
        )
        page.wait_for_function(
            "() => performance.getEntriesByName('chart-drawn:loss').length > 0", timeout=30000
        )
        page.wait_for_timeout(3000)  # history and ranks loaded: measure the live phase alone
        reset = (
            "() => { const s = window.__bench; s.longTasks = []; s.longTaskSpans = []; s.handlers = [];"
            " s.frames = []; s.loaf = []; s.spans = []; }"
        )
        page.evaluate(reset)
        time.sleep(idle_seconds)
        idle = page.evaluate("() => window.__bench.longTasks")
        page.evaluate(reset)
        before = publisher.sent
        publisher.running.set()
        time.sleep(seconds)
        publisher.running.clear()
        page.wait_for_timeout(500)
        stats = page.evaluate("() => window.__bench")
        legend = page.locator('[data-chart="loss"] .legend-item').first.text_content() or ""
        # The script this page ran (message handlers, animation frames) inside the worst long
        # task: when it is a small part, the task was long because the main thread did not get
        # the CPU (other processes on the machine), not because of the page's code.
        worst_task = max(stats["longTaskSpans"], key=lambda span: span[1], default=None)
        script_in_worst = (
            sum(dt for t0, dt in stats["spans"] if worst_task[0] - 1 <= t0 <= worst_task[0] + worst_task[1])
            if worst_task
            else 0.0
        )
        heap = page.evaluate("() => (performance.memory ? performance.memory.usedJSHeapSize : 0)")
        return {
            "idle_longest_ms": max([0.0, *idle]),
            "idle_long_tasks_per_min": len(idle) * 60 / idle_seconds,
            "long_tasks_per_min": len(stats["longTasks"]) * 60 / seconds,
            "heap_mb": heap / 2**20,
            "script_in_worst_task_ms": script_in_worst,
            "longest_ms": max([0.0, *stats["longTasks"], *stats["handlers"], *stats["frames"]]),
            "longest_handler_ms": max([0.0, *stats["handlers"]]),
            "longest_frame_ms": max([0.0, *stats["frames"]]),
            "worst_loaf": max(stats["loaf"], key=lambda e: e["duration"], default=None),
            "long_tasks": len(stats["longTasks"]),
            "messages": len(stats["handlers"]),
            "published": publisher.sent - before,
            "last_step_shown": int(legend.rsplit("@ ", 1)[1]) if "@ " in legend else None,
            "last_step_sent": publisher.step,
        }
    finally:
        context.close()


def log_scroll(browser: Any, base: str, cookie: str, job_id: int, reps: int) -> list[list[float]]:
    """Loads all 100,000 lines once, then scrolls ``reps`` times: per-frame costs of each run."""
    context = new_context(browser, base, cookie)
    try:
        page = context.new_page()
        page.goto(f"{base}/jobs/{job_id}/")
        page.wait_for_function(
            "() => window.trainyardLogView && window.trainyardLogView.lines.length >= 20000", timeout=60000
        )
        while page.locator("#log-older").is_visible():
            page.click("#log-older")
            page.wait_for_timeout(200)
            page.wait_for_function("() => !document.getElementById('log-older').disabled", timeout=60000)
        loaded = page.evaluate("() => window.trainyardLogView.lines.length")
        assert loaded == LOG_LINES, f"log view holds {loaded} lines"
        return [page.evaluate(SCROLL, SCROLL_FRAMES) for _ in range(reps)]
    finally:
        context.close()
