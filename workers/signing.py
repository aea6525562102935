"""Authenticated messages both ways between the console and its agents.

Commands (console → agent, the ``AGENT_*`` tasks on ``node.<name>``) are signed with the
console's Ed25519 key: the seal covers the node, the job, the round, the command's name, its
expiry, a nonce and the whole body. An agent knows only the public key (learnt at enrolment, or
given by its config) and runs nothing that does not verify, is for another node, has expired or
repeats a nonce it has seen (``CommandVerifier``). Anyone who can write to the broker can still
queue a message; it is refused.

Reports (agent → console, the ``CONTROL_*`` tasks) carry an HMAC-SHA256 over the task's name,
a timestamp and the body, keyed by the hash of the node's secret (the hash the console keeps), so
the secret itself never crosses the broker (``seal_report`` / ``report_mac_ok``).

Telemetry (agent → ingest, entries of the Redis stream ``TELEMETRY_STREAM``) is sealed with the
same key: each entry names its node and carries an HMAC-SHA256 over that name and the exact bytes
of its batch (``telemetry_entry`` / ``telemetry_mac_ok``), so ingest can tell which node sent it
and that nobody else wrote or altered it.

Both sides serialise a body the same way (``canonical``): JSON with sorted keys, so what the
Celery JSON round trip hands the receiver is what was signed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SEAL = "seal"  # the keyword argument every signed message carries its seal in
VERSION = 1
NODE_QUEUE_PREFIX = "node."
# A report older than this is refused (a replay captured from the broker); the agents' outbox
# signs when it sends, so a report waits at most as long as the controller's queue holds it.
REPORT_MAX_AGE_SECONDS = 3600.0
REPORT_MAX_AHEAD_SECONDS = 300.0  # clocks of hosts differ a little


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def command_scope(kwargs: dict[str, Any]) -> tuple[int | None, int | None]:
    """The (job, round) a command is about, when it is about one (a sync lists many)."""
    spec = kwargs.get("spec")
    source = spec if isinstance(spec, dict) else kwargs
    job, round_ = source.get("job_id"), source.get("round")
    return (int(job) if job is not None else None, int(round_) if round_ is not None else None)


def _command_payload(command: str, node: str, seal: dict[str, Any], body: dict[str, Any]) -> bytes:
    return canonical(
        {
            "v": VERSION,
            "command": command,
            "node": node,
            "job": seal.get("job"),
            "round": seal.get("round"),
            "expires": seal.get("expires"),
            "nonce": seal.get("nonce"),
            "body": body,
        }
    )


def public_key_text(key: Ed25519PublicKey) -> str:
    """The public key as agents are given it: base64 of its 32 raw bytes (not a secret)."""
    return _b64(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def load_public_key(text: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(_unb64(text.strip()))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not an Ed25519 public key (base64 of 32 bytes): {exc}") from None


def load_or_create_private_key(path: Path) -> Ed25519PrivateKey:
    """The console's signing key from ``path`` (PEM, PKCS#8), made there (mode 0600) when
    missing. Processes starting side by side agree on one key: the file appears whole, once."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        partial = path.with_name(f"{path.name}.{secrets.token_hex(6)}.partial")
        fd = _open_private(partial)
        with open(fd, "wb") as fh:
            fh.write(pem)
        try:
            _link_once(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds no Ed25519 private key")
    return key


def _open_private(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


def _link_once(source: Path, target: Path) -> None:
    with contextlib.suppress(FileExistsError):  # another process made it first: theirs stands
        os.link(source, target)


class CommandSigner:
    """The console's side: seals a command for one node."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public_key = public_key_text(key.public_key())

    def seal(self, command: str, node: str, kwargs: dict[str, Any], expires_in: float) -> dict[str, Any]:
        body = json.loads(canonical(kwargs))  # what the receiver will see after the JSON round trip
        job, round_ = command_scope(body)
        seal: dict[str, Any] = {
            "job": job,
            "round": round_,
            "expires": round(time.time() + expires_in, 3),
            "nonce": secrets.token_hex(16),
        }
        seal["sig"] = _b64(self._key.sign(_command_payload(command, node, seal, body)))
        return seal


class CommandVerifier:
    """An agent's side: accepts a command only once, for this node, unexpired, signed by the console."""

    def __init__(self, key: Ed25519PublicKey, node: str) -> None:
        self._key = key
        self._node = node
        self._seen: dict[str, float] = {}  # nonce -> expiry; forgotten once expired
        self._lock = threading.Lock()

    def refusal(self, command: str, kwargs: dict[str, Any], now: float | None = None) -> str:
        """Why ``command`` with ``kwargs`` must not run ("" when it may). Records its nonce."""
        now = time.time() if now is None else now
        body = dict(kwargs)
        seal = body.pop(SEAL, None)
        if not isinstance(seal, dict):
            return "it carries no seal"
        try:
            signature = _unb64(str(seal.get("sig", "")))
            self._key.verify(signature, _command_payload(command, self._node, seal, body))
        except (InvalidSignature, ValueError, TypeError):
            return "its signature does not verify (forged, altered, or sealed for another node)"
        if command_scope(body) != (seal.get("job"), seal.get("round")):
            return "its seal names another job or round"
        expires = seal.get("expires")
        if not isinstance(expires, (int, float)) or now > expires:
            return "it has expired"
        nonce = str(seal.get("nonce", ""))
        with self._lock:
            if nonce in self._seen:
                return "its nonce was seen before (a replay)"
            if len(self._seen) > 1024:
                self._seen = {n: e for n, e in self._seen.items() if e >= now}
            self._seen[nonce] = float(expires)
        return ""


def report_key(secret: str) -> bytes:
    """The HMAC key of a node's reports: the SHA-256 of its secret (what the console stores)."""
    return hashlib.sha256(secret.encode()).hexdigest().encode()


def _report_payload(task: str, ts: float, body: dict[str, Any]) -> bytes:
    return canonical({"v": VERSION, "task": task, "ts": ts, "body": body})


def seal_report(key: bytes, task: str, kwargs: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The seal an agent's report carries (kwargs must hold the node's name)."""
    ts = round(time.time() if now is None else now, 3)
    body = json.loads(canonical(kwargs))
    return {"ts": ts, "mac": hmac.new(key, _report_payload(task, ts, body), hashlib.sha256).hexdigest()}


@dataclass(frozen=True)
class ReportCheck:
    ok: bool
    reason: str = ""


def report_mac_ok(key: bytes, task: str, kwargs: dict[str, Any], now: float | None = None) -> ReportCheck:
    """Whether a report's seal was made with ``key`` over this task and body, recently."""
    now = time.time() if now is None else now
    body = dict(kwargs)
    seal = body.pop(SEAL, None)
    if not isinstance(seal, dict) or not isinstance(seal.get("ts"), (int, float)):
        return ReportCheck(False, "no seal")
    expected = hmac.new(key, _report_payload(task, seal["ts"], body), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, str(seal.get("mac", ""))):
        return ReportCheck(False, "bad seal")
    if now - seal["ts"] > REPORT_MAX_AGE_SECONDS or seal["ts"] - now > REPORT_MAX_AHEAD_SECONDS:
        return ReportCheck(False, "stale seal")
    return ReportCheck(True)


TELEMETRY_DOMAIN = b"trainyard.telemetry.v1\n"  # no report's canonical JSON starts so


def _telemetry_payload(node: str, batch: bytes) -> bytes:
    # A node name is a slug (no newline): the name and the batch cannot be split another way.
    return TELEMETRY_DOMAIN + node.encode() + b"\n" + batch


def telemetry_entry(key: bytes, node: str, batch: str | bytes) -> dict[Any, Any]:
    """A telemetry stream entry as agents XADD it: the batch (its UTF-8 bytes, which are what
    the MAC covers and what ingest reads back), the node's name and the MAC (hex), made with
    the node's report key. (Typed loosely: redis-py's ``xadd`` wants a dict of its own unions.)"""
    raw = batch.encode() if isinstance(batch, str) else batch
    mac = hmac.new(key, _telemetry_payload(node, raw), hashlib.sha256).hexdigest()
    return {"batch": raw, "node": node, "mac": mac}


def telemetry_mac_ok(key: bytes, node: str, batch: bytes, mac: bytes | str) -> bool:
    """Whether ``mac`` was made with ``key`` over this node's name and exactly these batch bytes."""
    expected = hmac.digest(key, _telemetry_payload(node, batch), "sha256").hex().encode()
    return hmac.compare_digest(expected, mac.encode() if isinstance(mac, str) else mac)


def node_of_queue(queue: str) -> str | None:
    return queue[len(NODE_QUEUE_PREFIX) :] if queue.startswith(NODE_QUEUE_PREFIX) else None
