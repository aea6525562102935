"""The node token: the shared secret every agent presents (tasks, bundle downloads), checked here only."""

from __future__ import annotations

import hmac
import logging

from django.conf import settings

log = logging.getLogger(__name__)


def node_token_ok(token: str | bytes | None) -> bool:
    """True when ``token`` is the console's node token (compared in constant time)."""
    expected = str(settings.NODE_TOKEN).encode()
    if not token or not expected:
        return False
    given = token.encode() if isinstance(token, str) else token
    return hmac.compare_digest(given, expected)


def agent_authorised(token: str | None, node: str) -> bool:
    """A report from an agent may be acted on; one with a bad token is logged and dropped."""
    if node_token_ok(token):
        return True
    log.warning("dropping a report from %r with a bad node token", node)
    return False
