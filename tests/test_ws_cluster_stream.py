"""/ws/cluster/ relays node, job and event broadcasts from the real channel layer."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from console.asgi import application
from console.cluster.models import Gpu, Node
from console.jobs.models import Job
from console.telemetry.events import emit, job_changed, node_changed
from tests.support.telemetry import session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_cluster_viewer_gets_nodes_jobs_and_events(viewer: User) -> None:
    cookie = session_cookie(viewer)
    node = Node.objects.create(name="host-a", state="ONLINE", cpu_percent=12.5)
    Gpu.objects.create(node=node, index=0, name="L4", utilization=42.0)
    job = Job.objects.create(name="cl", workload="mlp", state="RUNNING", round_number=3)

    def broadcast_all() -> int:
        node_changed(Node.objects.get(pk=node.pk))
        job_changed(job)
        return emit("node_lost", "host-b stopped answering", severity="warning").pk

    async def scenario() -> None:
        comm = WebsocketCommunicator(
            application,
            "/ws/cluster/",
            headers=[(b"origin", b"http://localhost"), (b"cookie", cookie.encode())],
        )
        assert (await comm.connect())[0]
        seq = await database_sync_to_async(broadcast_all)()
        got = [json.loads(await comm.receive_from(5)) for _ in range(3)]
        by_type = {m["type"]: m for m in got}
        assert by_type["node"]["node"]["name"] == "host-a"
        assert by_type["node"]["node"]["gpus"][0]["utilization"] == 42.0
        assert (by_type["job"]["job"]["id"], by_type["job"]["job"]["round"]) == (job.pk, 3)
        assert by_type["event"]["seq"] == seq and by_type["event"]["event"]["kind"] == "node_lost"
        await comm.send_json_to({"type": "resume", "after": 1})
        assert (await comm.receive_output(5))["code"] == 4400
        await comm.disconnect()

    asyncio.run(scenario())
