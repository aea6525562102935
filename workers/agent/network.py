"""Where peers reach this host: the address and the network interface a round's ranks use.

The agent reports both at registration; the console hands them back in every round
(``RoundSpec.interface``, ``MASTER_ADDR``), and the launcher puts the interface into the ranks'
environment (:func:`transport_env`), because gloo, NCCL and TensorPipe otherwise pick their
device from what the host name resolves to, which is loopback on a default Debian or Ubuntu
install (``127.0.1.1 HOST`` in /etc/hosts): every connection to another host then fails.

The default address is the source address of the route to the console's broker (then to its
web address): the interface that reaches the console is the one that reaches the other hosts
of a cluster, and it is never what the host name resolves to. ``--address`` / ``--interface``
override it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

logger = logging.getLogger(__name__)

# A documentation address (TEST-NET-1): the route towards it is the host's default route.
PUBLIC_PROBE = "192.0.2.1"
LOOPBACK = "127.0.0.1"
# Variables that name the interface each of torch's transports binds to and connects from: gloo
# (CPU collectives), NCCL's bootstrap and its socket transport, TensorPipe (torch.distributed.rpc).
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
# A reverse look-up slower than this is reported: torch's c10d store looks up each client that
# connects to it, so every round start waits that long per rank.
SLOW_LOOKUP_SECONDS = 1.0


class AddressError(Exception):
    """The address given cannot be used (a name that does not resolve)."""


@dataclass(frozen=True)
class Reach:
    """How peers reach this host."""

    address: str
    interface: str  # "" when no local interface holds the address (NAT, a proxy)


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def url_host(url: str) -> str:
    """The host part of a broker or console URL ("" when it has none)."""
    with contextlib.suppress(ValueError):
        return urlsplit(url).hostname or ""
    return ""


def resolve(host: str) -> str:
    """``host`` as an IP address (itself when it is one already). AddressError when it does not
    resolve."""
    if is_ip(host):
        return host
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise AddressError(f"{host!r} does not resolve: {exc}") from exc
    ipv4 = [str(info[4][0]) for info in infos if info[0] == socket.AF_INET]
    found = ipv4 or [str(info[4][0]) for info in infos]
    if not found:
        raise AddressError(f"{host!r} does not resolve")
    return str(found[0])


def route_source(destination: str) -> str | None:
    """The source address the kernel would use to reach ``destination`` (an IP), or None when no
    route leads there. Connecting a UDP socket sends nothing."""
    family = socket.AF_INET6 if ":" in destination else socket.AF_INET
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((destination, 9))
        address = str(sock.getsockname()[0])
        if address and address not in ("0.0.0.0", "::"):
            return address
    return None


def interface_of(address: str, interfaces: Mapping[str, Iterable[object]] | None = None) -> str:
    """The name of the local interface that holds ``address`` ("" when none does)."""
    table = psutil.net_if_addrs() if interfaces is None else interfaces
    for name, entries in table.items():
        for entry in entries:
            held = str(getattr(entry, "address", "")).split("%")[0]
            if held == address:
                return str(name)
    return ""


def detect(address: str = "", interface: str = "", towards: Iterable[str] = ()) -> Reach:
    """How peers reach this host: ``address`` (resolved when a name) or the source address of the
    route to the first of ``towards`` (URLs or hosts: the broker, the console) that has one, then
    the default route's, then loopback; ``interface`` or the one holding that address."""
    address = resolve(address) if address else _routed_address(towards)
    return Reach(address, interface or interface_of(address))


def _routed_address(towards: Iterable[str]) -> str:
    for target in towards:
        host = url_host(target) if "://" in target else target
        if not host:
            continue
        try:
            destination = resolve(host)
        except AddressError as exc:
            logger.warning("cannot route towards %s: %s", target, exc)
            continue
        source = route_source(destination)
        if source:
            return source
    return route_source(PUBLIC_PROBE) or LOOPBACK


def transport_env(interface: str, job_env: Mapping[str, str]) -> dict[str, str]:
    """The variables that bind torch's transports to ``interface``, but none the job sets itself
    (a job may name another interface, or several: ``eth0,eth1``)."""
    if not interface:
        return {}
    return {name: interface for name in INTERFACE_VARIABLES if not job_env.get(name)}


def reverse_lookup_seconds(address: str, patience: float = SLOW_LOOKUP_SECONDS) -> float | None:
    """How long the resolver takes to name ``address`` (torch's c10d store does it for every
    client that connects); None when it takes longer than ``patience`` (the look-up carries on in
    a daemon thread: it cannot be cut short)."""
    done = threading.Event()

    def look_up() -> None:
        with contextlib.suppress(OSError, UnicodeError):
            socket.getnameinfo((address, 0), 0)
        done.set()

    started = time.monotonic()
    threading.Thread(target=look_up, name="reverse-lookup", daemon=True).start()
    if not done.wait(patience):
        return None
    return time.monotonic() - started


def slow_lookup_warning(address: str, patience: float = SLOW_LOOKUP_SECONDS) -> str:
    """A message for the operator when reverse look-ups of ``address`` are slow, else ""."""
    if is_ip(address) and ipaddress.ip_address(address).is_loopback:
        return ""
    if reverse_lookup_seconds(address, patience) is not None:
        return ""
    return (
        f"a reverse DNS look-up of {address} took over {patience:g} s: torch's c10d store looks up "
        "every rank that connects, so each round start waits that long per rank. Add the cluster's "
        "addresses to /etc/hosts on every host, or give the hosts a DNS server that answers"
    )
