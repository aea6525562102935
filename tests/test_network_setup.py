"""The network set-up of a round, decided without processes: which address and interface an agent
reports (workers/agent/network.py), what its ranks' environment says about them
(workers/agent/launcher.py), where it fetches bundles, and what the console sends (the node's
interface and address, never its host name)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from console.cluster.models import Node
from console.cluster.registry import register_node
from console.jobs import scheduler
from console.jobs.spec import round_spec
from tests.support.agents import round_spec as agent_round_spec
from tests.support.decisions import Decide, make_job, make_node
from workers import protocol
from workers.agent import network
from workers.agent.config import parse_config
from workers.agent.credential import resolve_console_url
from workers.agent.inventory import node_info
from workers.agent.launcher import RankFiles, bundle_url, rank_env


def test_the_address_is_the_route_to_the_broker_and_its_interface_holds_it() -> None:
    reach = network.detect(towards=["redis://127.0.0.1:6379/0"])
    assert reach == network.Reach("127.0.0.1", "lo")


def test_a_given_name_is_resolved_to_an_address_and_a_bad_one_is_refused() -> None:
    assert network.detect(address="localhost").address == "127.0.0.1"
    with pytest.raises(network.AddressError, match="does not resolve"):
        network.detect(address="no-such-host.invalid")


def test_a_given_interface_wins_and_an_unheld_address_has_none() -> None:
    assert network.detect(address="127.0.0.1", interface="eth7").interface == "eth7"
    assert network.detect(address="192.0.2.77").interface == ""


def test_the_interface_is_the_one_holding_the_address() -> None:
    table: dict[str, list[Any]] = {
        "lo": [SimpleNamespace(address="127.0.0.1")],
        "eth0": [SimpleNamespace(address="10.9.0.2"), SimpleNamespace(address="fe80::1%eth0")],
        "eth1": [SimpleNamespace(address="192.168.5.4")],
    }
    assert network.interface_of("10.9.0.2", table) == "eth0"
    assert network.interface_of("fe80::1", table) == "eth0"
    assert network.interface_of("192.168.5.4", table) == "eth1"
    assert network.interface_of("10.9.0.3", table) == ""


def test_the_routes_tried_go_in_order_and_skip_what_does_not_resolve() -> None:
    # The broker's name does not resolve: the console's URL is next.
    reach = network.detect(towards=["redis://no-such-broker.invalid:6379/0", "http://127.0.0.1:8000"])
    assert reach.address == "127.0.0.1"
    assert network.url_host("redis://:secret@10.1.2.3:6379/0") == "10.1.2.3"
    assert network.url_host("http://[fd00::5]:8000/") == "fd00::5"


def test_transports_get_the_interface_unless_the_job_names_one() -> None:
    assert network.transport_env("eth0", {}) == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TP_SOCKET_IFNAME": "eth0",
    }
    assert network.transport_env("eth0", {"NCCL_SOCKET_IFNAME": "ib0,ib1"}) == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "TP_SOCKET_IFNAME": "eth0",
    }
    assert network.transport_env("", {}) == {}


def test_a_rank_gets_the_rounds_interface_and_address(tmp_path: Path) -> None:
    config = parse_config(["--name", "gpu-1", "--data-dir", str(tmp_path / "agent")])
    spec = agent_round_spec(job_id=3, round_=1, node_rank=0, nnodes=2, master_port=29500, args=[])
    spec["master_addr"] = "10.9.0.2"
    spec["interface"] = "eth0"
    spec["env"] = {"GLOO_SOCKET_IFNAME": "eth1"}
    env = rank_env(config, spec, 0, RankFiles.for_rank(config, spec, 0))
    assert env["MASTER_ADDR"] == "10.9.0.2"
    assert env["GLOO_SOCKET_IFNAME"] == "eth1"  # the job's own choice stands
    assert env["NCCL_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "eth0"


def test_bundles_come_from_the_console_the_agent_enrolled_with(tmp_path: Path) -> None:
    data = tmp_path / "agent"
    sha = "AB" * 32
    ref: protocol.BundleRef = {"sha256": sha, "url": f"http://127.0.0.1:8000/api/v1/bundles/{sha}/archive/"}
    first = parse_config(["--name", "gpu-1", "--data-dir", str(data), "--console", "http://10.9.0.1:8000/"])
    assert resolve_console_url(first) == "http://10.9.0.1:8000"
    # A later start without --console remembers it (enrolment happens once).
    later = parse_config(["--name", "gpu-1", "--data-dir", str(data)])
    remembered = resolve_console_url(later)
    assert remembered == "http://10.9.0.1:8000"
    from dataclasses import replace

    assert bundle_url(replace(later, console_url=remembered), ref) == (
        f"http://10.9.0.1:8000/api/v1/bundles/{sha.lower()}/archive/"
    )
    # An agent that never knew a console URL (a shared-token agent beside bin/run) takes the console's.
    lone = parse_config(["--name", "gpu-2", "--data-dir", str(tmp_path / "lone")])
    assert resolve_console_url(lone) == ""
    assert bundle_url(lone, ref) == ref["url"]


def test_a_slow_reverse_lookup_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    assert network.slow_lookup_warning("127.0.0.1") == ""

    def slow(address: tuple[str, int], flags: int) -> tuple[str, str]:
        time.sleep(0.5)
        return address[0], "0"

    monkeypatch.setattr(socket, "getnameinfo", slow)
    warning = network.slow_lookup_warning("10.9.0.2", patience=0.05)
    assert "10.9.0.2" in warning and "/etc/hosts" in warning
    assert network.slow_lookup_warning("10.9.0.2", patience=2.0) == ""


def test_registration_records_the_interface_and_warns_of_slow_dns(decide: Decide) -> None:
    info = node_info(network.Reach("10.9.0.2", "eth0"), 2, dns_warning="a reverse DNS look-up was slow")
    done = decide(register_node, "gpu-9", "session-1", info)
    node = Node.objects.get(name="gpu-9")
    assert (node.address, node.interface) == ("10.9.0.2", "eth0")
    slow = [e for e in done.events if e.kind == "node.slow_dns"]
    assert len(slow) == 1 and "reverse DNS" in slow[0].message


def test_the_round_names_the_nodes_address_and_interface_never_its_host_name(decide: Decide) -> None:
    head = make_node("gpu-a")
    head.hostname, head.interface = "gpu-a.example", "eth0"
    head.save()
    make_node("gpu-b")
    job = make_job("net", nnodes="2")
    decide(scheduler.tick)
    job.refresh_from_db()
    rnd = job.current_round()
    assert rnd is not None
    assert rnd.master_addr == head.address
    for alloc in rnd.allocations.select_related("node"):
        spec = round_spec(job, rnd, alloc)
        assert spec["master_addr"] == head.address
        if alloc.node == head:
            assert spec["interface"] == "eth0"
        else:
            assert "interface" not in spec  # an agent that reported none: the ranks choose
