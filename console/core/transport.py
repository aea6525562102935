"""How the controller's messages leave the console: Celery tasks sent once the decision commits.

Commands to agents (workers/protocol.py's AGENT_*) and requests for an early controller tick
all go through ``send_on_commit``, which hands them to the current transport after the
surrounding transaction commits (never before the rows they refer to exist; never at all if it
rolls back). Commands to agents leave sealed with the console's key (``sealed``). Tests swap the transport for a recorder with ``use()`` and read exactly what was sent.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery import current_app
from django.conf import settings
from django.db import transaction

from workers import protocol
from workers.signing import SEAL, CommandSigner, load_or_create_private_key, node_of_queue

log = logging.getLogger(__name__)

# Commands expire so an agent that was down does not act on an old decision.
COMMAND_EXPIRES = 120.0
# The controller's periodic pass (console/jobs/scheduler.py), also asked for early after a change.
CONTROL_TICK = "trainyard.control.tick"
TICK_EXPIRES = 30.0


@dataclass(frozen=True)
class Command:
    """One Celery task: its name, the queue it goes to, its keyword arguments."""

    name: str
    queue: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    expires: float = COMMAND_EXPIRES


class Transport(Protocol):
    def send(self, command: Command) -> None: ...


@functools.cache
def command_signer() -> CommandSigner:
    """The console's Ed25519 key (settings.COMMAND_KEY_FILE, made on first use): every command
    to an agent is sealed with it (workers/signing.py); agents hold its public half."""
    return CommandSigner(load_or_create_private_key(settings.COMMAND_KEY_FILE))


def sealed(command: Command) -> dict[str, Any]:
    """The command's kwargs with its seal, when it goes to an agent (node.<name>)."""
    node = node_of_queue(command.queue)
    if node is None:
        return command.kwargs
    seal = command_signer().seal(command.name, node, command.kwargs, command.expires)
    return {**command.kwargs, SEAL: seal}


class CeleryTransport:
    """The production transport: the controller's Celery app on the shared broker. Commands to
    agents are sealed here, as they leave, so their expiry counts from the send."""

    def send(self, command: Command) -> None:
        current_app.send_task(
            command.name, kwargs=sealed(command), queue=command.queue, expires=command.expires
        )


_transport: Transport = CeleryTransport()


@contextlib.contextmanager
def use(transport: Transport) -> Iterator[Transport]:
    """Send through ``transport`` inside the block (tests record what the controller sends)."""
    global _transport
    previous, _transport = _transport, transport
    try:
        yield transport
    finally:
        _transport = previous


def send_on_commit(name: str, queue: str, *, expires: float = COMMAND_EXPIRES, **kwargs: Any) -> None:
    """Send a task once the current transaction commits (at once outside a transaction)."""
    command = Command(name, queue, kwargs, expires)

    def send() -> None:
        try:
            _transport.send(command)
        except Exception:  # the heartbeat repair loop re-sends what is missing
            log.warning("sending %s to %s failed", name, queue, exc_info=True)

    transaction.on_commit(send)


def request_tick() -> None:
    """Ask for a controller tick now rather than at the next beat (after a change that frees
    capacity or queues a job)."""
    send_on_commit(CONTROL_TICK, protocol.CONTROL_QUEUE, expires=TICK_EXPIRES)
