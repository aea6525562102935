"""The node's credential: the secret every message to the controller and every bundle download
carries (the console checks it in console/cluster/tokens.py).

A host enrols once: with a one-time join token an operator made, the agent asks the console
(``POST <console>/api/v1/nodes/enroll/``) for its node's own secret and keeps it in
``<data dir>/node_credential`` (mode 0600); later starts use that file and ignore the join token.
Delete the file to enrol again (after a revocation, with a new join token). Without either, the
shared ``TRAINYARD_NODE_TOKEN`` is used: the opt-in of a single-machine console (``bin/run``).

Enrolment also hands the agent the console's public command key (kept in
``<data dir>/console_key``): the agent runs only commands sealed with it (workers/signing.py).
An agent that did not enrol is given the key by its config (``--console-key``).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from workers.agent.config import AgentConfig
from workers.signing import load_public_key

logger = logging.getLogger(__name__)

CREDENTIAL_FILE = "node_credential"
CONSOLE_URL_FILE = "console_url"
CONSOLE_KEY_FILE = "console_key"
ENROL_PATH = "/api/v1/nodes/enroll/"
ENROL_TIMEOUT_SECONDS = 30.0
ENROL_PATIENCE_SECONDS = 120.0  # an agent started with its console (compose) waits for it this long
ENROL_RETRY_SECONDS = 2.0


class CredentialError(Exception):
    """No credential could be had; the message says what to do."""


def credential_path(config: AgentConfig) -> Path:
    return config.data_dir / CREDENTIAL_FILE


def resolve_credential(config: AgentConfig) -> str:
    """The secret this agent presents: stored, or got now with the join token, or the shared token."""
    path = credential_path(config)
    stored = path.read_text().strip() if path.is_file() else ""
    if stored:
        if config.join_token:
            logger.info("node %s is already enrolled (%s); the join token is not used", config.name, path)
        return stored
    if config.join_token:
        secret, command_key = enrol(
            config.console_url, config.name, config.join_token, ENROL_PATIENCE_SECONDS
        )
        if command_key:
            store_credential(config.data_dir / CONSOLE_KEY_FILE, command_key)
        store_credential(path, secret)
        logger.info("node %s enrolled; its credential is in %s", config.name, path)
        return secret
    if config.token:
        return config.token
    raise CredentialError(
        f"node {config.name} has no credential ({path} does not exist): enrol it with "
        "--join-token TOKEN (or TRAINYARD_JOIN_TOKEN) and --console URL; an operator makes join "
        "tokens in the admin (Join tokens) or with POST /api/v1/nodes/join-tokens/"
    )


def plain_http_warning(url: str) -> str | None:
    """What to warn about when a secret would go to ``url`` in clear text: plain http to a host
    other than this one (loopback is fine). None when there is nothing to warn about."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return None
    host = parts.hostname or ""
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return (
        f"sending this node's secret over plain http to {host}: anyone on the path can read it; "
        "give the console an https:// URL (a TLS reverse proxy: docs/deploy.md)"
    )


def warn_if_plain_http(url: str) -> None:
    warning = plain_http_warning(url)
    if warning is not None:
        logger.warning(warning)


def resolve_console_url(config: AgentConfig) -> str:
    """The console's web address this agent uses (enrolment, code bundles): ``--console``, which
    is remembered in ``<data dir>/console_url``, or the one remembered from an earlier start ("":
    none known; bundles then come from the URL the console names itself)."""
    path = config.data_dir / CONSOLE_URL_FILE
    if config.console_url:
        url = config.console_url.rstrip("/")
        if not path.is_file() or path.read_text().strip() != url:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".partial")
            partial.write_text(url + "\n")
            os.replace(partial, path)
        return url
    return path.read_text().strip() if path.is_file() else ""


def resolve_console_key(config: AgentConfig) -> Ed25519PublicKey:
    """The console's public command key: from the config, else the one learnt at enrolment."""
    path = config.data_dir / CONSOLE_KEY_FILE
    text = config.console_key or (path.read_text().strip() if path.is_file() else "")
    if not text:
        raise CredentialError(
            f"node {config.name} does not know the console's command key, so it would refuse every "
            f"command: give it with --console-key KEY (TRAINYARD_CONSOLE_KEY; `manage.py commandkey` "
            f"on the console prints it), or enrol again with a join token (delete {path.parent / CREDENTIAL_FILE})"
        )
    try:
        return load_public_key(text)
    except ValueError as exc:
        raise CredentialError(f"the console key given to node {config.name} is unusable: {exc}") from None


def enrol(console_url: str, name: str, join_token: str, patience: float = 0.0) -> tuple[str, str]:
    """Trades the join token for the node's own secret and the console's command key. A console that cannot be reached or
    answers 5xx (still starting, say) is asked again for up to ``patience`` seconds; a refusal
    is final."""
    import requests

    if not console_url:
        raise CredentialError(
            "--join-token needs --console URL (TRAINYARD_CONSOLE_URL), the console's web address"
        )
    url = console_url.rstrip("/") + ENROL_PATH
    warn_if_plain_http(url)
    deadline = time.monotonic() + patience
    while True:
        try:
            response = requests.post(
                url, json={"name": name, "join_token": join_token}, timeout=ENROL_TIMEOUT_SECONDS
            )
        except requests.RequestException as exc:
            if time.monotonic() >= deadline:
                raise CredentialError(f"cannot reach the console at {url} to enrol: {exc}") from exc
            logger.warning("cannot reach the console at %s to enrol (%s); trying again", url, exc)
        else:
            if response.status_code < 500 or time.monotonic() >= deadline:
                break
            logger.warning("the console at %s answered HTTP %s; trying again", url, response.status_code)
        time.sleep(ENROL_RETRY_SECONDS)
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 201 or not isinstance(body, dict) or not body.get("secret"):
        detail = body.get("detail") if isinstance(body, dict) else None
        raise CredentialError(
            f"enrolment refused by {url} (HTTP {response.status_code}): {detail or response.text[:200]}"
        )
    return str(body["secret"]), str(body.get("command_key") or "")


def store_credential(path: Path, secret: str) -> None:
    """Written whole (a new file renamed over the old) and readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, path)
