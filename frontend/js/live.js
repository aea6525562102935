// A websocket subscription that falls back to polling when the socket cannot be used.
//
// subscribe({path, onMessage, onOpen, poll, intervalMs, status}) opens ws(s)://host{path}; if it
// fails to open or drops, poll() is called every intervalMs until a reconnect attempt succeeds.
// onOpen(socket) runs on every (re)connect, e.g. to ask for what was missed meanwhile.

const RECONNECT_MS = 30000;

export function subscribe({ path, onMessage, onOpen, poll, intervalMs = 3000, status }) {
  let socket = null;
  let pollTimer = null;
  let reconnectTimer = null;
  let opened = false;

  const setStatus = (state, text) => {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  };

  const startPolling = () => {
    if (pollTimer) return;
    setStatus("polling", `polling every ${Math.round(intervalMs / 1000)}s`);
    const tick = async () => {
      try {
        await poll();
      } catch (err) {
        setStatus("polling", `poll failed (${err.message}); retrying`);
      }
    };
    tick();
    pollTimer = setInterval(tick, intervalMs);
    if (!reconnectTimer) reconnectTimer = setTimeout(connect, RECONNECT_MS);
  };

  const stopPolling = () => {
    if (pollTimer) clearInterval(pollTimer);
    pollTimer = null;
  };

  function connect() {
    reconnectTimer = null;
    if (!("WebSocket" in window)) {
      startPolling();
      return;
    }
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    try {
      socket = new WebSocket(`${scheme}//${location.host}${path}`);
    } catch {
      startPolling();
      return;
    }
    opened = false;
    socket.addEventListener("open", () => {
      opened = true;
      stopPolling();
      setStatus("live", "live");
      if (onOpen) onOpen(socket);
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
    socket.addEventListener("close", () => {
      socket = null;
      // A socket that was live and then dropped gets one quick retry before polling.
      if (opened) {
        opened = false;
        setStatus("connecting", "reconnecting…");
        reconnectTimer = setTimeout(connect, 2000);
        setTimeout(() => { if (!socket || socket.readyState !== WebSocket.OPEN) startPolling(); }, 4000);
      } else {
        startPolling();
      }
    });
  }

  connect();
  return {
    send(data) {
      if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(data));
    },
  };
}
