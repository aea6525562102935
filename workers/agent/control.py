"""The agent's messages to the controller: Celery tasks on queue ``control``.

Messages go through an outbox drained by one sender thread, so neither the supervisor loop
nor the heartbeat ever waits on the broker: when it is unreachable, messages wait in order and
are retried every RETRY_SECONDS, and only the newest heartbeat is kept (an old load reading is
worth nothing). Rank exits and round ends are never dropped.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from celery import Celery

from workers.protocol import CONTROL_HEARTBEAT, CONTROL_QUEUE
from workers.signing import SEAL, seal_report

logger = logging.getLogger(__name__)

RETRY_SECONDS = 1.0


class ControlClient:
    """Sends CONTROL_* tasks, each carrying the node name and the session, sealed with an HMAC
    keyed by the node's credential (``report_key``: workers/signing.py) as it leaves: the
    credential itself never goes on the broker."""

    def __init__(self, app: Celery, node: str, report_key: bytes, session: str) -> None:
        self._app = app
        self._key = report_key
        self._base = {"node": node, "session": session}
        self._outbox: collections.deque[tuple[str, dict[str, Any]]] = collections.deque()
        self._changed = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="control-sender", daemon=True)
        self._thread.start()

    def send(self, task: str, **kwargs: Any) -> None:
        message = (task, {**kwargs, **self._base})
        with self._changed:
            if task == CONTROL_HEARTBEAT:
                for index, (queued, _) in enumerate(self._outbox):
                    if queued == CONTROL_HEARTBEAT:
                        self._outbox[index] = message
                        return
            self._outbox.append(message)
            self._changed.notify_all()

    def close(self, timeout: float) -> None:
        """Sends what is queued (for up to ``timeout`` seconds), then stops the sender."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._outbox and time.monotonic() < deadline:
                self._changed.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            if self._outbox:
                logger.warning("%s messages to the controller not sent", len(self._outbox))
            self._closing = True
            self._changed.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        failing = False
        while True:
            with self._changed:
                while not self._outbox and not self._closing:
                    self._changed.wait()
                if self._closing:
                    return
                task, kwargs = self._outbox[0]
            try:
                sealed = {**kwargs, SEAL: seal_report(self._key, task, kwargs)}
                self._app.send_task(task, kwargs=sealed, queue=CONTROL_QUEUE)
            except Exception as exc:
                if not failing:
                    logger.warning("cannot reach the controller's queue (%s); retrying", exc)
                failing = True
                with self._changed:
                    self._changed.wait(RETRY_SECONDS)
                continue
            if failing:
                logger.info("controller queue reachable again")
            failing = False
            with self._changed:
                # send() may have replaced a queued heartbeat with a newer one meanwhile; the
                # item at the front is still the one just sent unless it was such a heartbeat.
                if self._outbox and self._outbox[0][1] is kwargs:
                    self._outbox.popleft()
                self._changed.notify_all()
