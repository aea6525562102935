"""Pre-flight network checks with real agents: three agents on this machine (each its own name,
listening on its own port of the round range at the machine's address), a real controller, and
a small HTTP server standing for the console URL. Their enrolment checks finish; a check asked
through the API reaches every pair both ways with a latency and a bandwidth, reaches the console
URL, times DNS, and finishes within 5 s. (Across network namespaces: tests/support/netns.py.)"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from console.cluster.models import NetworkCheck, NodeLink
from tests.support.cluster import Cluster
from tests.support.controller import wait_for
from workers.net import free_port

CONSOLE_PORT = free_port()
CONTROLLER_ENV = {"TRAINYARD_PUBLIC_URL": f"http://127.0.0.1:{CONSOLE_PORT}/"}


@pytest.fixture
def console_url() -> Iterator[str]:
    """Something that answers HTTP where the agents are told the console is."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", CONSOLE_PORT), http.server.SimpleHTTPRequestHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield CONTROLLER_ENV["TRAINYARD_PUBLIC_URL"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.cluster
def test_three_agents_check_each_other_the_console_and_dns(
    cluster: Cluster, console_url: str, settings: Any
) -> None:
    settings.TRAINYARD_PUBLIC_URL = console_url  # this process plays the web tier (the API call)
    cluster.start_agents("net-a", "net-b", "net-c")
    # Enrolment: b and c were each checked against the nodes up before them
    wait_for(
        lambda: (
            NetworkCheck.objects.filter(reason="enrolment").count() >= 2
            and not NetworkCheck.objects.filter(finished_at__isnull=True).exists()
        ),
        timeout=60,
        message="the enrolment checks to finish",
    )

    made = cluster.api.post("/api/v1/nodes/network/", {}, format="json")
    assert made.status_code == 202, made.content
    check_id = made.json()["id"]
    check = wait_for(
        lambda: NetworkCheck.objects.filter(pk=check_id, finished_at__isnull=False).first(),
        timeout=30,
        message="the check to finish",
    )

    assert check.nodes == ["net-a", "net-b", "net-c"] and not check.silent
    links = list(NodeLink.objects.filter(check_run=check).select_related("source", "target"))
    assert sorted((link.source.name, link.target.name) for link in links) == [
        (a, b) for a in ("net-a", "net-b", "net-c") for b in ("net-a", "net-b", "net-c") if a != b
    ]
    for link in links:
        assert link.ok, link.error
        assert link.latency_ms is not None and 0 < link.latency_ms < 1000
        assert link.bandwidth_mbps is not None and link.bandwidth_mbps > 10
    for name, result in check.results.items():
        assert result["listening"], (name, result["listen_error"])
        assert result["console_ok"], (name, result["console_error"])
        assert result["dns_ms"] is not None and result["reverse_dns_ms"] is not None
    shown = cluster.api.get(f"/api/v1/nodes/network/?check={check_id}").json()
    assert shown["checks"][0]["done"] and len([x for x in shown["links"] if x["check_id"] == check_id]) == 6
