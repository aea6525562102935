// A websocket subscription that never gives up: reconnects with backoff forever, polls while the
// socket is down, and says which of the three it is doing (live / reconnecting / polling) in a
// status element that screen readers announce (role="status").
//
// subscribe({path, onMessage, onOpen, poll, intervalMs, status}) opens ws(s)://host{path}.
// onOpen(socket, reconnected) runs on every (re)connect, e.g. to ask for what was missed.

const BACKOFF_MIN_MS = 1000;
const BACKOFF_MAX_MS = 30000;
// A socket that stays down this long gets the polling fallback meanwhile (a quick blip does not).
const POLL_AFTER_MS = 3000;

export function backoffDelay(attempt) {
  // Exponential with full jitter, so many tabs coming back after an outage do not reconnect at once.
  const cap = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** Math.min(attempt, 10));
  return Math.round(cap / 2 + Math.random() * (cap / 2));
}

export function subscribe({ path, onMessage, onOpen, poll, intervalMs = 3000, status }) {
  let socket = null;
  let pollTimer = null;
  let pollSoon = null;
  let attempt = 0;
  let everOpened = false;
  let state = "";

  const setStatus = (next, text) => {
    if (!status || state === `${next}:${text}`) return;
    state = `${next}:${text}`;
    status.dataset.state = next;
    status.textContent = text;
  };

  const tick = async () => {
    if (!poll) return;
    try {
      await poll();
      if (pollTimer) setStatus("polling", `polling every ${Math.round(intervalMs / 1000)} s; reconnecting`);
    } catch (err) {
      setStatus("polling", `poll failed (${err.message}); retrying`);
    }
  };

  const startPolling = () => {
    if (pollTimer || !poll) return;
    setStatus("polling", `polling every ${Math.round(intervalMs / 1000)} s; reconnecting`);
    tick();
    pollTimer = setInterval(tick, intervalMs);
  };

  const stopPolling = () => {
    if (pollTimer) clearInterval(pollTimer);
    if (pollSoon) clearTimeout(pollSoon);
    pollTimer = null;
    pollSoon = null;
  };

  const retry = () => {
    const delay = backoffDelay(attempt++);
    if (!pollTimer) setStatus("reconnecting", `reconnecting in ${Math.ceil(delay / 1000)} s`);
    if (!pollSoon && !pollTimer) pollSoon = setTimeout(() => { pollSoon = null; startPolling(); }, POLL_AFTER_MS);
    setTimeout(connect, delay);
  };

  function connect() {
    if (!("WebSocket" in window)) {
      startPolling();
      return;
    }
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    try {
      socket = new WebSocket(`${scheme}//${location.host}${path}`);
    } catch {
      retry();
      return;
    }
    let opened = false;
    socket.addEventListener("open", () => {
      opened = true;
      const reconnected = everOpened;
      everOpened = true;
      attempt = 0;
      stopPolling();
      setStatus("live", "live");
      if (onOpen) onOpen(socket, reconnected);
    });
    socket.addEventListener("message", (msg) => {
      let data;
      try {
        data = JSON.parse(msg.data);
      } catch {
        return;
      }
      onMessage(data);
    });
    socket.addEventListener("close", (ev) => {
      socket = null;
      // 4401/4404: not allowed or no such job. Retrying cannot help; polling shows the error.
      if (ev.code === 4401 || ev.code === 4404) {
        startPolling();
        return;
      }
      if (opened) attempt = 0;
      retry();
    });
  }

  setStatus("connecting", "connecting…");
  connect();
  return {
    send(data) {
      if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(data));
    },
    // For tests and the bench: drop the socket as a network outage would.
    drop() {
      if (socket) socket.close();
    },
  };
}
