"""Node credentials, checked here only: every agent message (registration, heartbeats, reports,
shutdown) goes through ``agent_authorised`` (an HMAC seal keyed by the node's secret, which the
message never carries), every bundle download by an agent through ``identify``, and every
telemetry entry's seal through the keys ``report_keys`` gives ingest.

A host enrols once with a one-time join token an operator made (admin, or
``POST /api/v1/nodes/join-tokens/``) and receives its own secret; the console keeps hashes of
both. A node's secret speaks for that node only, and stops working when revoked in the admin.
The shared ``TRAINYARD_NODE_TOKEN`` (``settings.NODE_TOKEN``) is an opt-in for a single-machine
console (``bin/run`` sets it for its own agent): when set, it speaks for any node.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from console.cluster.models import JoinToken, NodeCredential
from workers import signing

log = logging.getLogger(__name__)

JOIN_TOKEN_PREFIX = "tyj_"
SECRET_PREFIX = "tyn_"
PREFIX_LENGTH = 10
DEFAULT_JOIN_TOKEN_HOURS = 24
MAX_JOIN_TOKEN_HOURS = 24 * 30
# A revoked node keeps sending heartbeats; its credential's last_refused_at is written at most this often.
REFUSAL_NOTE_SECONDS = 60


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class NodeIdentity:
    """Who presented a credential: one node, or (``node`` None) the shared token, any node."""

    node: str | None
    prefix: str = ""

    @property
    def shared(self) -> bool:
        return self.node is None

    def speaks_for(self, node: str) -> bool:
        return self.node is None or self.node == node


@dataclass(frozen=True)
class Verdict:
    identity: NodeIdentity | None
    reason: str = ""  # why there is no identity: "missing", "unknown", "revoked"


def shared_token_ok(raw: str) -> bool:
    """True when the shared node token is enabled (opt-in) and ``raw`` is it (constant time)."""
    expected = str(settings.NODE_TOKEN or "").encode()
    return bool(raw and expected) and hmac.compare_digest(raw.encode(), expected)


def identify(token: str | bytes | None) -> Verdict:
    """Which node a presented credential belongs to, if any."""
    raw = token.decode(errors="replace") if isinstance(token, bytes) else (token or "")
    if not raw:
        return Verdict(None, "missing")
    if shared_token_ok(raw):
        return Verdict(NodeIdentity(None))
    credential = NodeCredential.objects.filter(secret_hash=hash_secret(raw)).first()
    if credential is None:
        return Verdict(None, "unknown")
    if credential.revoked:
        _note_refusal(credential)
        return Verdict(None, "revoked")
    return Verdict(NodeIdentity(credential.node_name, credential.prefix))


def agent_authorised(task: str, message: dict[str, Any]) -> bool:
    """A report from an agent may be acted on: its seal (workers/signing.py) is an HMAC over the
    task and body keyed by the claimed node's secret (by its hash, which is what is stored), or
    by the shared token, when enabled. The secret never travels. Anything else is logged and dropped."""
    node = str(message.get("node", ""))
    credential = NodeCredential.objects.filter(node_name=node).first() if node else None
    if credential is not None:
        check = signing.report_mac_ok(credential.secret_hash.encode(), task, message)
        if check.ok:
            if credential.revoked:
                _note_refusal(credential)
                log.warning("refusing a message from node %r: revoked node credential", node)
                return False
            return True
    if settings.NODE_TOKEN:
        check = signing.report_mac_ok(signing.report_key(str(settings.NODE_TOKEN)), task, message)
        if check.ok:
            return True
    log.warning(
        "refusing %s claiming to be from node %r: %s",
        task,
        node,
        "it is not sealed with that node's credential" if credential else "no such node is enrolled",
    )
    return False


def report_keys(nodes: Collection[str]) -> dict[str, tuple[bytes, ...]]:
    """The keys a seal made by each of ``nodes`` may verify with (workers/signing.py), as
    ``agent_authorised`` accepts them: its own credential's unless revoked, and the shared token's
    when enabled; none for a node that is not enrolled (or revoked) while no shared token is.
    One query for them all: ingest checks every telemetry entry's seal against these."""
    live = dict(
        NodeCredential.objects.filter(node_name__in=list(nodes), revoked=False).values_list(
            "node_name", "secret_hash"
        )
    )
    shared = (signing.report_key(str(settings.NODE_TOKEN)),) if settings.NODE_TOKEN else ()
    return {node: ((live[node].encode(),) if node in live else ()) + shared for node in nodes}


def _note_refusal(credential: NodeCredential) -> None:
    now = timezone.now()
    stale = models.Q(last_refused_at__isnull=True) | models.Q(
        last_refused_at__lt=now - timedelta(seconds=REFUSAL_NOTE_SECONDS)
    )
    if NodeCredential.objects.filter(stale, pk=credential.pk).update(last_refused_at=now):
        log.warning("refused node %r: its credential was revoked", credential.node_name)


class EnrolmentRefused(Exception):
    """A join token that cannot enrol this node; the message says why."""


def issue_join_token(
    user: Any, name: str, node_name: str = "", hours: float = DEFAULT_JOIN_TOKEN_HOURS
) -> tuple[JoinToken, str]:
    """A new join token and its raw value (shown once)."""
    raw = JOIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = JoinToken.objects.create(
        name=name,
        key_hash=hash_secret(raw),
        prefix=raw[:PREFIX_LENGTH],
        node_name=node_name,
        created_by=user if getattr(user, "pk", None) else None,
        expires_at=timezone.now() + timedelta(hours=hours),
    )
    return token, raw


def enrol(node_name: str, join_token: str) -> tuple[NodeCredential, str]:
    """Spends ``join_token`` and gives ``node_name`` a new secret. A node that already has a live
    credential (or that the console knows without one) is replaced only by a join token made for
    its name: a token naming no node enrols new names, and names whose credential was revoked.
    Raises EnrolmentRefused."""
    from console.core.models import AuditEntry

    now = timezone.now()
    with transaction.atomic():
        token = JoinToken.objects.select_for_update().filter(key_hash=hash_secret(join_token or "")).first()
        if token is None:
            raise EnrolmentRefused("Unknown join token.")
        if token.used_at is not None:
            raise EnrolmentRefused(f"This join token was already used (by node {token.used_by!r}).")
        if token.expired:
            raise EnrolmentRefused("This join token has expired; create a new one.")
        if token.node_name and token.node_name != node_name:
            raise EnrolmentRefused(f"This join token is for node {token.node_name!r} only.")
        if not token.node_name and _name_taken(node_name):
            raise EnrolmentRefused(
                f"Node {node_name!r} is already known to this console: only a join token made for "
                f"that node name may replace its credential."
            )
        raw = SECRET_PREFIX + secrets.token_urlsafe(32)
        credential, _ = NodeCredential.objects.update_or_create(
            node_name=node_name,
            defaults={
                "secret_hash": hash_secret(raw),
                "prefix": raw[:PREFIX_LENGTH],
                "created_at": now,
                "join_token": token,
                "revoked": False,
                "revoked_at": None,
                "last_refused_at": None,
            },
        )
        token.used_at, token.used_by = now, node_name
        token.save(update_fields=["used_at", "used_by"])
        AuditEntry.record_raw(
            None,
            "node.enrolled",
            target_type="nodecredential",
            target_id=str(credential.pk),
            actor_name=f"node:{node_name}",
            join_token=token.prefix,
        )
    log.info("node %r enrolled with join token %s", node_name, token.prefix)
    return credential, raw


def _name_taken(node_name: str) -> bool:
    """Whether ``node_name`` belongs to a node that a join token naming no node must not take
    over: one with a live credential, or one the console knows that has no credential at all
    (it speaks with the shared token). A revoked credential may be replaced by any join token:
    the node's own messages are refused already."""
    from console.cluster.models import Node

    credential = NodeCredential.objects.filter(node_name=node_name).first()
    if credential is not None:
        return not credential.revoked
    return Node.objects.filter(name=node_name).exists()


def record_refused_enrolment(node_name: str, join_token: str, reason: str) -> None:
    """Audit a refused enrolment: the node name it claimed, the join token's visible prefix, why."""
    from console.core.models import AuditEntry

    AuditEntry.record_raw(
        None,
        "node.enrol_failed",
        target_type="nodecredential",
        target_id="",
        actor_name=f"node:{node_name}"[:150],
        join_token=(join_token or "")[:PREFIX_LENGTH],
        reason=reason,
    )


def revoke(credential: NodeCredential, user: Any) -> bool:
    """Revoke once; True when this call revoked it. The node's messages are refused from now on."""
    from console.core.models import AuditEntry

    now = timezone.now()
    changed = NodeCredential.objects.filter(pk=credential.pk, revoked=False).update(
        revoked=True, revoked_at=now
    )
    if changed:
        credential.revoked, credential.revoked_at = True, now
        AuditEntry.record(user, "node.credential_revoked", credential, node=credential.node_name)
    return bool(changed)
