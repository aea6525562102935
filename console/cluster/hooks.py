"""What happened to a node, for the apps that react to it: cluster publishes, jobs subscribes.

cluster knows nodes and their agents; which jobs run where, and what a node's loss means for
them, is jobs' business (console/jobs/node_changes.py, connected in ``JobsConfig.ready``). So
cluster never imports jobs: it sends one of these typed hooks, in the caller's transaction, and
each receiver runs in the order it connected. A hook with no receiver refuses to send: a node
lost with nobody to move its jobs off it must not pass silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from console.cluster.models import Node
from workers import protocol

log = logging.getLogger(__name__)

P = TypeVar("P")


class Hook(Generic[P]):
    """One kind of news and the functions that react to it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._receivers: list[Callable[[P], None]] = []

    def connect(self, receiver: Callable[[P], None]) -> Callable[[P], None]:
        """Adds ``receiver`` (once; usable as a decorator)."""
        if receiver not in self._receivers:
            self._receivers.append(receiver)
        return receiver

    def disconnect(self, receiver: Callable[[P], None]) -> None:
        self._receivers.remove(receiver)

    def send(self, news: P) -> None:
        if not self._receivers:
            raise RuntimeError(f"nothing reacts to {self.name}: is the jobs app installed?")
        for receiver in list(self._receivers):
            receiver(news)


@dataclass(frozen=True)
class NodeGone:
    """``node`` stopped running what it ran: ``how`` says what happened ("was lost", "went
    offline", "restarted"); ``last_seen`` is its last heartbeat before, from when its peers'
    failures are its doing."""

    node: Node
    how: str
    last_seen: datetime | None


@dataclass(frozen=True)
class NodeUp:
    """``node``'s agent registered, or came back from LOST: it should hear every round it is to
    run now (it stops the others)."""

    node: Node


@dataclass(frozen=True)
class RoundsReported:
    """A heartbeat from ``node`` listed these rounds and their states."""

    node: Node
    rounds: list[protocol.RoundStatus]


node_gone: Hook[NodeGone] = Hook("node_gone")
node_up: Hook[NodeUp] = Hook("node_up")
rounds_reported: Hook[RoundsReported] = Hook("rounds_reported")
