"""A round's store for an in-place run (:mod:`workers.sdk.elastic`): where its ranks meet.

The round's rank 0 hosts a TCPStore at the round's address; keys are per round
(``trainyard/<job>/<round>/...``) so a store left over from an earlier round cannot mix in.
Joiners (ranks that start afresh in the round) check in there, so the survivors know when every
joiner is up before they leave the old round; and every rank waits there until all have arrived,
so the process group itself (whose timeout is the short collective timeout) forms without waiting.
"""

from __future__ import annotations

import datetime
import time

import torch.distributed as dist

from workers.net import wait_listening
from workers.sdk.elastic_control import Control

STORE_POLL_SECONDS = 0.005
"""How often a round's store clients look whether its rank 0 listens yet (see open_store)."""


def round_key(control: Control, name: str) -> str:
    return f"{round_prefix(control)}/{name}"


def round_prefix(control: Control) -> str:
    return f"trainyard/{control.job_id}/{control.round}"


def open_store(control: Control, timeout: float) -> dist.TCPStore:
    """The round's store; rank 0 hosts it. A TCPStore client that finds its server not
    listening yet retries with an exponential backoff (a server up 0.6 s after the client's
    first try was reached 0.57 s later still), and at a round change the new rank 0 opens
    the store at the same boundary the others connect: so the clients first wait for it."""
    if control.rank != 0:
        wait_listening(control.master_addr, control.master_port, timeout, poll=STORE_POLL_SECONDS)
    return dist.TCPStore(
        control.master_addr,
        control.master_port,
        control.world_size,
        is_master=control.rank == 0,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
    )


def check_in(store: dist.Store, control: Control) -> None:
    """A joiner is up and at the round's store."""
    store.add(round_key(control, "joined"), 1)


def joined(store: dist.Store, control: Control) -> int:
    """How many joiners have checked in."""
    return int(store.add(round_key(control, "joined"), 0))


def wait_for_joiners(store: dist.Store, control: Control, timeout: float) -> None:
    """Until every joiner of the round has checked in; TimeoutError past ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while joined(store, control) < control.joiners:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{control.joiners} newcomer(s) did not check in")
        time.sleep(0.01)


def gather(store: dist.Store, control: Control, timeout: float) -> None:
    """Until every rank of the round reached its store (``store`` is the round's prefixed one);
    TimeoutError past ``timeout`` seconds."""
    store.add("arrived", 1)
    deadline = time.monotonic() + timeout
    while store.add("arrived", 0) < control.world_size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"round {control.round}: not every rank reached the store")
        time.sleep(0.005)
