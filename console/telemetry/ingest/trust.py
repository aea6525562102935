"""Which stream entries ingest believes: those sealed by a node for a rank that node runs.

Anyone who can write to the Redis stream can XADD an entry, so an entry is admitted only when
(``Gate.admit``, before anything of it is decoded into rows):

- it is sealed: it names a node and carries a MAC (workers/signing.py ``telemetry_entry``);
- the MAC verifies with a key that speaks for that node (``tokens.report_keys``: its credential,
  unless revoked, or the shared token where the console opted in to one);
- its batch's (job, round, rank) is allocated to that node: the round's ``Allocation`` of the
  node holds that rank, numbered as the agents number them (``rank_nodes``). A rank carried into
  an in-place round ships under the new round's key, which that round's allocation holds.

Anything else is refused: dropped unwritten, acked with its read (it must not come back),
counted by ``Refusal`` (``trainyard_ingest_refused_entries_total``) and logged, at most once per
WARN_EVERY seconds for each reason. A replayed entry (copied from the stream and added again) is
the node's own data under the same identities, which storage stores once.

Nothing here costs a query per entry: the keys of the nodes in a read are read in one query and
kept NODE_KEY_TTL seconds (a revoked node is refused within that long), each round's members in
one query and kept ROUND_TTL seconds, read again at once when a rank is missing from them (a
parameter-server round gains worker processes), at most once per read.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.db.models import Q

from console.cluster.tokens import report_keys
from console.jobs.models import Allocation, Strategy
from console.telemetry.ingest.decoding import Opened, open_entry
from workers.signing import telemetry_mac_ok

log = logging.getLogger(__name__)

NODE_KEY_TTL = 5.0
ROUND_TTL = 300.0
WARN_EVERY = 10.0
MAX_NODE_NAME = 64  # Node.name: a longer name is nobody's, and is not looked up

RoundKey = tuple[int, int]  # (job, round)
Entry = tuple[bytes, dict[bytes, bytes]]


class Refusal(StrEnum):
    """Why an entry was refused: the label of ``trainyard_ingest_refused_entries_total``."""

    UNSIGNED = "unsigned"  # no node or no MAC
    UNKNOWN_NODE = "unknown_node"  # no key speaks for the node: not enrolled, or revoked
    BAD_MAC = "bad_mac"  # the MAC verifies with none of the node's keys
    NOT_ALLOCATED = "not_allocated"  # the batch's rank is not the node's in that round


@dataclass
class Admitted:
    """What one read keeps, opened, and how many entries it refused for each reason."""

    batches: list[Opened] = field(default_factory=list)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)


@dataclass(frozen=True)
class Sealed:
    """An entry whose seal verified: the node that sealed it, and its batch opened."""

    entry_id: bytes
    node: str
    opened: Opened


class Gate:
    """One ingest consumer's check of every entry it reads, with its caches."""

    def __init__(self) -> None:
        self.keys = NodeKeys()
        self.rounds = RoundMembers()
        self.warnings = RefusalLog()

    def admit(self, entries: Iterable[Entry]) -> Admitted:
        """The batches of ``entries`` to store; the others are counted and logged."""
        admitted = Admitted()
        sealed = self._sealed(list(entries), admitted)
        members, fetched = self.rounds.of({_round_of(item) for item in sealed})
        missing = {_round_of(item) for item in sealed if not _runs(members, item)} - fetched
        if missing:
            members.update(self.rounds.of(missing, again=True)[0])
        for item in sealed:
            if _runs(members, item):
                admitted.batches.append(item.opened)
            else:
                head = item.opened[0]
                self._refuse(
                    admitted,
                    Refusal.NOT_ALLOCATED,
                    item.entry_id,
                    f"node {item.node!r} does not run job {head.job_id} round {head.round_number} "
                    f"rank {head.rank}",
                )
        return admitted

    def _sealed(self, entries: list[Entry], admitted: Admitted) -> list[Sealed]:
        """The entries whose seal verifies, opened (malformed ones are logged and dropped)."""
        names = {_node(fields) for _, fields in entries} - {""}
        keys = self.keys.of({name for name in names if len(name) <= MAX_NODE_NAME})
        sealed = []
        for entry_id, fields in entries:
            node, mac, raw = _node(fields), fields.get(b"mac"), fields.get(b"batch")
            if not node or mac is None or raw is None:
                self._refuse(admitted, Refusal.UNSIGNED, entry_id, "it carries no seal")
            elif not keys.get(node):
                self._refuse(
                    admitted, Refusal.UNKNOWN_NODE, entry_id, f"node {node!r} has no live credential"
                )
            elif not any(telemetry_mac_ok(key, node, raw, mac) for key in keys[node]):
                self._refuse(admitted, Refusal.BAD_MAC, entry_id, f"its MAC is not node {node!r}'s")
            elif (opened := open_entry(entry_id, raw)) is not None:
                sealed.append(Sealed(entry_id, node, opened))
        return sealed

    def _refuse(self, admitted: Admitted, reason: Refusal, entry_id: bytes, why: str) -> None:
        admitted.refused[reason.value] += 1
        self.warnings.note(reason, entry_id, why)


def _node(fields: dict[bytes, bytes]) -> str:
    return fields.get(b"node", b"").decode(errors="replace")


def _round_of(sealed: Sealed) -> RoundKey:
    head = sealed.opened[0]
    return head.job_id, head.round_number


def _runs(members: dict[RoundKey, dict[int, str]], sealed: Sealed) -> bool:
    return members.get(_round_of(sealed), {}).get(sealed.opened[0].rank) == sealed.node


class NodeKeys:
    """Each node's keys, read for every node of a read that has none fresh, in one query."""

    def __init__(self, ttl: float = NODE_KEY_TTL) -> None:
        self.ttl = ttl
        self.known: dict[str, tuple[float, tuple[bytes, ...]]] = {}

    def of(self, nodes: Collection[str]) -> dict[str, tuple[bytes, ...]]:
        now = time.monotonic()
        stale = [node for node in nodes if now - self.known.get(node, (-math.inf, ()))[0] > self.ttl]
        if stale:
            self.known = {node: found for node, found in self.known.items() if now - found[0] <= self.ttl}
            self.known.update((node, (now, keys)) for node, keys in report_keys(stale).items())
        return {node: self.known[node][1] for node in nodes}


class RoundMembers:
    """Each round's ranks and the node each runs on, read for every round of a read that has
    none fresh (or, ``again``, for the rounds given), in one query."""

    def __init__(self, ttl: float = ROUND_TTL) -> None:
        self.ttl = ttl
        self.known: dict[RoundKey, tuple[float, dict[int, str]]] = {}

    def of(
        self, rounds: Collection[RoundKey], *, again: bool = False
    ) -> tuple[dict[RoundKey, dict[int, str]], set[RoundKey]]:
        """The members of ``rounds``, and which of them were read now."""
        now = time.monotonic()
        stale = {key for key in rounds if again or now - self.known.get(key, (-math.inf, {}))[0] > self.ttl}
        if stale:
            self.known = {key: found for key, found in self.known.items() if now - found[0] <= self.ttl}
            self.known.update((key, (now, ranks)) for key, ranks in rank_nodes(stale).items())
        return {key: self.known[key][1] for key in rounds}, stale


def rank_nodes(rounds: Collection[RoundKey]) -> dict[RoundKey, dict[int, str]]:
    """The node each rank of ``rounds`` runs on, numbered as the console numbers them in its
    round commands (jobs/spec.py ``round_spec``) and the agent its ranks (``global_rank``): a
    parameter-server host's processes by their ranks, else node_rank x nproc_per_node + local rank."""
    which = Q()
    for job_id, number in rounds:
        which |= Q(round__job_id=job_id, round__number=number)
    members: dict[RoundKey, dict[int, str]] = {key: {} for key in rounds}
    rows = Allocation.objects.filter(which).values_list(
        "round__job_id",
        "round__number",
        "round__job__strategy",
        "round__job__nproc_per_node",
        "node__name",
        "node_rank",
        "processes",
    )
    for job_id, number, strategy, nproc, node, node_rank, processes in rows:
        ranks = members[(job_id, number)]
        for rank in _ranks(strategy, nproc, node_rank, processes):
            ranks[rank] = node
    return members


def _ranks(strategy: str, nproc: int, node_rank: int, processes: list[dict[str, Any]]) -> list[int]:
    if strategy == Strategy.PARAMETER_SERVER and processes:
        return [int(process["rank"]) for process in processes]
    return list(range(node_rank * nproc, (node_rank + 1) * nproc))


class RefusalLog:
    """A warning per refused entry, at most one per reason every WARN_EVERY seconds: a flood of
    forged entries must not flood the log. The next warning says how many went unmentioned."""

    def __init__(self, every: float = WARN_EVERY) -> None:
        self.every = every
        self.last: dict[Refusal, float] = {}
        self.unmentioned: collections.Counter[Refusal] = collections.Counter()

    def note(self, reason: Refusal, entry_id: bytes, why: str) -> None:
        now = time.monotonic()
        if now - self.last.get(reason, -math.inf) < self.every:
            self.unmentioned[reason] += 1
            return
        self.last[reason] = now
        more = self.unmentioned.pop(reason, 0)
        log.warning(
            "dropping telemetry entry %s (%s): %s%s",
            entry_id.decode(errors="replace"),
            reason.value,
            why,
            f"; {more} more refused so since the last warning" if more else "",
        )
