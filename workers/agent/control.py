"""The agent's messages to the controller: Celery tasks on queue ``control``."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery

from workers.protocol import CONTROL_QUEUE

logger = logging.getLogger(__name__)


class ControlClient:
    """Sends CONTROL_* tasks, each carrying the node token, the node name and the session."""

    def __init__(self, app: Celery, node: str, token: str, session: str) -> None:
        self._app = app
        self._base = {"token": token, "node": node, "session": session}
        # Several threads send (heartbeat, supervisor, shutdown); one producer at a time keeps
        # kombu's connection handling simple.
        self._lock = threading.Lock()

    def send(self, task: str, **kwargs: Any) -> bool:
        payload = {**kwargs, **self._base}
        try:
            with self._lock:
                self._app.send_task(task, kwargs=payload, queue=CONTROL_QUEUE)
        except Exception:
            logger.exception("could not send %s to the controller", task)
            return False
        return True
