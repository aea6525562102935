"""Where a webhook may go: SSRF-safe targets.

A target is an http(s) URL whose host resolves only to public addresses: loopback, private,
link-local (cloud metadata at 169.254.169.254), multicast, reserved and unspecified addresses are
refused unless ``ALERTS_ALLOW_PRIVATE_TARGETS`` is on. The check runs when a channel is saved and
again before every request, and the request goes to the address that was checked (the URL's host
stays in the Host header and TLS's server name), so a name that resolves elsewhere the second time
(DNS rebinding) does not reach an internal address. Redirects are not followed.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings


class TargetRefused(ValueError):
    """The URL may not be a webhook target; the message says why."""


@dataclass(frozen=True)
class Target:
    url: str  # with the checked address in place of the host name
    host: str  # the name, for TLS's server name
    host_header: str  # the name (and a port that is not the scheme's), for the Host header


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return _public(address.ipv4_mapped)
    return address.is_global and not address.is_multicast


def resolve(url: str, *, allow_private: bool | None = None) -> Target:
    allow = settings.ALERTS_ALLOW_PRIVATE_TARGETS if allow_private is None else allow_private
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("a webhook URL is http:// or https:// with a host")
    if parts.username or parts.password:
        raise TargetRefused("a webhook URL carries no credentials (use the signature)")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as error:
        raise TargetRefused(f"the webhook host {host!r} does not resolve") from error
    addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
    refused = [str(a) for a in addresses if not _public(a)]
    if refused and not allow:
        raise TargetRefused(
            f"the webhook host {host!r} resolves to a non-public address ({', '.join(refused)}); "
            "an admin may allow those with TRAINYARD_ALERTS_ALLOW_PRIVATE_TARGETS"
        )
    chosen = addresses[0]
    netloc = f"[{chosen}]" if chosen.version == 6 else str(chosen)
    if parts.port:
        netloc += f":{parts.port}"
    return Target(
        url=urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")),
        host=host,
        host_header=f"{host}:{parts.port}" if parts.port else host,
    )
