"""Pre-flight network checks, decided in process: what a node's enrolment asks of the agents,
how their answers become per-pair links, a failed pair keeping a job off it (with the reason in
the queue), a silent node judged unknown rather than failed, and an agent speaking an older
protocol refused with a clear message. (tests/test_network_preflight_e2e.py runs real agents.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.test import Client
from rest_framework.test import APIClient

from console.cluster import network, registry
from console.cluster.models import NetworkCheck, Node, NodeLink
from console.core.states import JobState
from console.jobs import scheduler
from console.web.nodes import pending_queue
from tests.support.decisions import Decide, make_job, make_node, nodes_of
from tests.test_agent_restart import INFO
from workers import protocol


def answer(
    check: NetworkCheck, node: str, *, failing: dict[str, str] | None = None, listening: bool = True
) -> None:
    """``node``'s agent answers ``check``: every peer reached but those in ``failing``."""
    failing = failing or {}
    peers = [p for p in check.nodes if p != node]
    network.record_result(
        node,
        check.pk,
        protocol.PreflightResult(
            listening=listening,
            listen_error="" if listening else "cannot listen: address in use",
            console_ok=True,
            console_ms=3.0,
            console_error="",
            dns_ms=0.4,
            reverse_dns_ms=0.2,
            dns_error="",
            peers=[
                protocol.PeerResult(
                    node=p,
                    ok=p not in failing,
                    latency_ms=None if p in failing else 0.3,
                    bandwidth_mbps=None if p in failing else 900.0,
                    error=failing.get(p, ""),
                )
                for p in peers
            ],
            seconds=0.2,
        ),
    )


def test_enrolment_checks_the_new_node_against_the_others_in_a_star(decide: Decide) -> None:
    make_node("a"), make_node("b")

    enrolled = decide(registry.register_node, "c", "session-c", {**INFO, "address": "10.0.0.9"})

    checks = [s for s in enrolled.all_sent() if s[0] == protocol.AGENT_PREFLIGHT]
    by_node = {queue: kwargs["request"] for _, queue, kwargs in checks}
    assert sorted(by_node) == ["node.a", "node.b", "node.c"]
    check = NetworkCheck.objects.get()
    assert check.reason == NetworkCheck.Reason.ENROLMENT and check.nodes == ["a", "b", "c"]
    # c probes a and b; a and b each probe c only, at c's port on its address
    assert [p["node"] for p in by_node["node.c"]["peers"]] == ["a", "b"]
    assert by_node["node.a"]["peers"] == [{"node": "c", "address": "10.0.0.9", "port": check.ports["c"]}]
    for request in by_node.values():
        assert network.PORT_RANGE[0] <= request["listen_port"] < network.PORT_RANGE[1]
        assert request["check_id"] == check.pk


def test_answers_become_links_and_a_failed_pair_keeps_a_job_off_it(decide: Decide) -> None:
    a, b, c = make_node("a", slots=1), make_node("b", slots=1), make_node("c", slots=1)
    check = network.request_check([a, b, c], NetworkCheck.Reason.OPERATOR)
    answer(check, "a", failing={"b": "cannot connect to 10.0.0.2:21000: timed out"})
    answer(check, "b")
    assert NetworkCheck.objects.get().finished_at is None  # c has not answered yet
    finished = decide(answer, check, "c")

    assert NetworkCheck.objects.get().done
    assert finished.kinds() == ["network.checked"]
    assert "6 link(s) tested, 1 failed" in finished.events[0].message
    links = {(link.source.name, link.target.name): link for link in NodeLink.objects.all()}
    assert len(links) == 6 and not links["a", "b"].ok and links["b", "a"].ok
    assert links["a", "c"].latency_ms == 0.3 and links["a", "c"].bandwidth_mbps == 900.0
    assert set(network.failed_pairs()) == {frozenset((a.pk, b.pk))}

    # A 2-node job is placed on a pair that reaches each other: a and c, not a and b
    job = make_job("pair", nnodes="2")
    decide(scheduler.tick)
    assert nodes_of(job) == ["a", "c"]


def test_a_job_that_only_fits_on_a_failed_pair_waits_and_the_queue_says_why(decide: Decide) -> None:
    a, b = make_node("a", slots=1), make_node("b", slots=1)
    check = network.request_check([a, b], NetworkCheck.Reason.OPERATOR)
    answer(check, "a", failing={"b": "cannot connect to 10.0.0.2:21000: Connection refused"})
    answer(check, "b")
    job = make_job("pair", nnodes="2")

    decide(scheduler.tick)

    job.refresh_from_db()
    assert job.state == JobState.PENDING
    [entry] = pending_queue()
    assert entry.why.startswith(
        "Needs 2 node(s) that reach each other; 2 have room, but the network check failed"
    )
    assert "a → b: cannot connect to 10.0.0.2:21000: Connection refused" in entry.why

    # A later check that passes lets it run
    again = network.request_check([a, b], NetworkCheck.Reason.OPERATOR)
    answer(again, "a")
    answer(again, "b")
    decide(scheduler.tick)
    assert nodes_of(job) == ["a", "b"]


def test_a_node_that_never_listened_is_unknown_not_failed(decide: Decide, settings: Any) -> None:
    a, b, c = make_node("a"), make_node("b"), make_node("c")
    check = network.request_check([a, b, c], NetworkCheck.Reason.OPERATOR)
    # b could not bind its port (its peers fail to reach it), c never answers at all
    answer(check, "a", failing={"b": "refused", "c": "timed out"})
    answer(check, "b", listening=False, failing={"c": "timed out"})
    past = check.created_at - network.ANSWER_GRACE - timedelta(seconds=1)
    NetworkCheck.objects.filter(pk=check.pk).update(deadline_at=past)  # the deadline (and grace) passed

    expired = decide(network.expire_checks)

    assert NetworkCheck.objects.get().done
    assert network.failed_pairs() == {}
    assert {(link.source.name, link.target.name) for link in NodeLink.objects.all()} == {("b", "a")}
    assert "no answer from c" in expired.events[0].message


def test_a_first_round_on_nodes_never_checked_together_checks_them(decide: Decide) -> None:
    make_node("a"), make_node("b")
    job = make_job("pair", nnodes="2")

    started = decide(scheduler.tick)

    assert nodes_of(job) == ["a", "b"]
    check = NetworkCheck.objects.get()
    assert check.reason == NetworkCheck.Reason.FIRST_ROUND and check.nodes == ["a", "b"]
    assert sorted(q for n, q, _ in started.all_sent() if n == protocol.AGENT_PREFLIGHT) == [
        "node.a",
        "node.b",
    ]


def test_the_api_starts_a_check_and_lists_links(decide: Decide, admin_user: Any) -> None:
    a, b = make_node("a"), make_node("b")
    api = APIClient()
    api.force_authenticate(admin_user)

    bad = api.post("/api/v1/nodes/network/", {"nodes": ["a", "nope"]}, format="json")
    assert bad.status_code == 400 and "nope" in str(bad.json())
    assert not NetworkCheck.objects.exists()  # nothing started

    made = api.post("/api/v1/nodes/network/", {"nodes": ["a", "b"]}, format="json")
    assert made.status_code == 202 and made.json()["nodes"] == ["a", "b"]
    check = NetworkCheck.objects.get(pk=made.json()["id"])
    answer(check, "a")
    answer(check, "b")
    shown = api.get(f"/api/v1/nodes/network/?check={check.pk}").json()
    assert shown["checks"][0]["done"] is True
    assert sorted((link["node"], link["peer"], link["ok"]) for link in shown["links"]) == [
        ("a", "b", True),
        ("b", "a", True),
    ]
    node_check = api.post(f"/api/v1/nodes/{a.pk}/check-network/")
    assert node_check.status_code == 202 and node_check.json()["nodes"] == ["a", "b"]
    assert b.pk


def test_an_agent_speaking_an_older_protocol_is_refused_with_a_clear_message(decide: Decide) -> None:
    old = {**INFO, "agent_version": "0.1.0"}
    del old["protocol"]  # agents before the protocol version sent none

    refused = decide(registry.register_node, "old", "session-old", old)

    assert not Node.objects.filter(name="old").exists()
    [(name, queue, kwargs)] = refused.sent()
    assert (name, queue) == (protocol.AGENT_REFUSED, "node.old")
    assert "speaks protocol 1; this console needs protocol 2 or newer: upgrade the agent" in kwargs["reason"]
    assert refused.kinds() == ["node.refused"]

    # The current protocol registers, and the node records what its agent speaks
    decide(registry.register_node, "old", "session-new", INFO)
    node = Node.objects.get(name="old")
    assert node.agent_protocol == protocol.PROTOCOL_VERSION and node.agent_version == "0.2.0"


def test_the_network_and_node_pages_show_links_hosts_and_the_agent_version(
    decide: Decide, admin_user: Any
) -> None:
    a, b = make_node("a"), make_node("b")
    Node.objects.filter(pk=a.pk).update(agent_version="0.2.0", agent_protocol=protocol.PROTOCOL_VERSION)
    check = network.request_check([a, b], NetworkCheck.Reason.OPERATOR)
    answer(check, "a", failing={"b": "cannot connect to 10.0.0.2:21000: No route to host"})
    answer(check, "b")
    client = Client()
    client.force_login(admin_user)

    page = client.get("/network/").content.decode()
    assert 'data-from="a" data-to="b" data-ok="false"' in page
    assert 'data-from="b" data-to="a" data-ok="true"' in page
    assert "No route to host" in page and "1 failed of 2" in page
    assert 'data-host="a"' in page and 'id="check-network-button"' in page

    node_page = client.get("/nodes/a/").content.decode()
    assert "agent 0.2.0 (protocol 2)" in node_page
    assert f'data-check-url="/api/v1/nodes/{a.pk}/check-network/"' in node_page
    assert "No route to host" in node_page
