"""Websocket consumers: ``/ws/jobs/<id>/`` and ``/ws/cluster/``.

Close codes: 4401 not signed in (or not allowed, or a refused bearer token), 4403 a token
without the ``read`` scope (console/api/ws_auth.py),
4404 no such job, 4400 malformed client message. A job viewer that sends ``{"type": "resume", "after": N}`` gets every event with
seq > N from the database and then live ones: the consumer joins the group before it queries,
so nothing falls between the two, and drops live events it already sent from the backlog.

Every open socket re-checks its credential every WS_CREDENTIAL_RECHECK_SECONDS (at most 60) and
closes with 4401 once its token is revoked or expired, or its session signed out.

Live metric frames do not come through the channel layer: the process's FrameHub
(console.telemetry.fanout) subscribes once per job and hands each frame to every local viewer.
A viewer that fell too far behind gets ``{"type": "gap", "dropped": n}`` before its next frame
(frames also carry their number); it can fetch the range it missed from the metrics API.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from console.api.ws_auth import credential_still_valid
from console.core.roles import can_view
from console.jobs.models import Job, job_summary
from console.teams import access
from console.telemetry.downsample import finite_or_none, thin_points
from console.telemetry.events import CLUSTER_GROUP, event_payload, job_group
from console.telemetry.fanout import Viewer, get_hub
from console.telemetry.models import Event, Metric

log = logging.getLogger(__name__)

CLOSE_MALFORMED = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
MAX_JOB_ID = 2**63 - 1  # the URL accepts any digits; larger ids cannot exist (bigint keys)
# Client messages are tiny ({"type": "resume", "after": 123}); anything larger is abuse.
MAX_CLIENT_MESSAGE = 1024
# Backlog events are sent in pages so a long-lived job's history does not sit in memory at once.
BACKLOG_PAGE = 500
# Points per series in the frame sent on resume (display-sized and thinned as live frames are).
RESUME_FRAME_POINTS = 100


class Malformed(ValueError):
    pass


def parse_client_message(text: str | None, bytes_data: bytes | None, allowed: set[str]) -> dict[str, Any]:
    if bytes_data is not None or text is None:
        raise Malformed("binary messages are not accepted")
    if len(text) > MAX_CLIENT_MESSAGE:
        raise Malformed("message too large")
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise Malformed("not JSON") from exc
    if not isinstance(message, dict) or message.get("type") not in allowed:
        raise Malformed("unknown message type")
    if message["type"] == "resume":
        after = message.get("after", 0)
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise Malformed("after must be a non-negative integer")
        message["after"] = after
    return message


class TelemetryConsumer(AsyncWebsocketConsumer):
    """What both endpoints share: authentication, ping, and closing on malformed input."""

    allowed_messages: set[str] = {"ping"}
    groups_to_join: list[str]

    async def connect(self) -> None:
        await self.accept()
        refusal = self.scope.get("ws_refusal")
        if refusal is not None:  # a bearer token that console.api.ws_auth refused
            code, reason = refusal
            await self.close(code=code, reason=reason)
            return
        # AuthMiddlewareStack (or the bearer token) has already loaded the user; can_view reads only its flags.
        if not can_view(self.scope.get("user")):
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        if not await self.authorize():
            return
        for group in self.groups_to_join:
            await self.channel_layer.group_add(group, self.channel_name)
        self.joined = True
        self.recheck = asyncio.ensure_future(self.recheck_credential())
        await self.joined_groups()
        await self.welcome()

    async def recheck_credential(self) -> None:
        """Close the socket once its credential no longer holds (revoked, expired, signed out)."""
        while True:
            await asyncio.sleep(settings.WS_CREDENTIAL_RECHECK_SECONDS)
            try:
                valid = await database_sync_to_async(credential_still_valid)(self.scope)
            except Exception:  # the database is away: keep the socket, check again next time
                log.exception("re-checking a websocket's credential failed")
                continue
            if not valid:
                log.info("closing websocket %s: its credential no longer holds", self.scope.get("path"))
                await self.close(code=CLOSE_UNAUTHORIZED, reason="Signed out, or the token was revoked.")
                return

    async def authorize(self) -> bool:
        return True

    async def joined_groups(self) -> None:
        return None

    async def left_groups(self) -> None:
        return None

    async def welcome(self) -> None:
        return None

    async def disconnect(self, code: int) -> None:
        recheck = getattr(self, "recheck", None)
        if recheck is not None:
            recheck.cancel()
        if getattr(self, "joined", False):
            await self.left_groups()
            for group in self.groups_to_join:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = parse_client_message(text_data, bytes_data, self.allowed_messages)
        except Malformed as exc:
            log.info("closing websocket %s: %s", self.scope.get("path"), exc)
            await self.close(code=CLOSE_MALFORMED)
            return
        if message["type"] == "ping":
            await self.send_json({"type": "pong"})
        else:
            await self.handle_message(message)

    async def handle_message(self, message: dict[str, Any]) -> None:
        return None

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, allow_nan=False))


class JobConsumer(TelemetryConsumer):
    allowed_messages = {"ping", "resume"}

    async def authorize(self) -> bool:
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        self.sent_seqs: set[int] = set()
        # Seqs below this were either sent or are older than what the client asked for.
        self.seq_floor = 0
        job = None
        if self.job_id <= MAX_JOB_ID:
            job = await database_sync_to_async(visible_job)(self.scope.get("user"), self.job_id)
        if job is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return False
        self.groups_to_join = [job_group(self.job_id)]
        self.job = job
        return True

    async def joined_groups(self) -> None:
        self.viewer: Viewer | None = await get_hub().join(self.job_id, self._send_frame)

    async def _send_frame(self, text: str) -> None:
        await self.send(text_data=text)

    async def left_groups(self) -> None:
        viewer = getattr(self, "viewer", None)
        if viewer is not None:
            self.viewer = None
            await get_hub().leave(self.job_id, viewer)

    async def welcome(self) -> None:
        await self.send_json({"type": "state", "job": job_summary(self.job)})

    async def handle_message(self, message: dict[str, Any]) -> None:
        if message["type"] == "resume":
            await self.resume(message["after"])

    async def resume(self, after: int) -> None:
        # Live events for this consumer queue up in its channel while this handler runs, and are
        # then checked against sent_seqs: the backlog query and the live stream overlap, never gap.
        cursor = after
        while True:
            page = await database_sync_to_async(self._events_after)(cursor)
            for payload in page:
                await self._send_event(payload)
            if len(page) < BACKLOG_PAGE:
                break
            cursor = page[-1]["seq"]
        self.seq_floor = max(self.seq_floor, after)
        frame = await database_sync_to_async(self._recent_frame)()
        if frame is not None:
            await self.send_json(frame)

    def _events_after(self, after: int) -> list[dict[str, Any]]:
        events = Event.objects.filter(job_id=self.job_id, pk__gt=after).select_related("node")
        return [event_payload(e) for e in events.order_by("pk")[:BACKLOG_PAGE]]

    def _recent_frame(self) -> dict[str, Any] | None:
        rows = (
            Metric.objects.filter(job_id=self.job_id, rank=0)
            .order_by("-id")
            .values_list("name", "step", "value", "round_number")[: RESUME_FRAME_POINTS * 10]
        )
        series: dict[str, list[tuple[int, float]]] = {}
        round_number = 0
        for name, step, value, rnd in reversed(rows):
            series.setdefault(name, []).append((step, value))
            round_number = max(round_number, rnd)
        if not series:
            return None
        thinned = {
            name: [[step, finite_or_none(value)] for step, value in thin_points(points, RESUME_FRAME_POINTS)]
            for name, points in series.items()
        }
        return {"type": "metrics", "series": thinned, "round": round_number, "recent": True}

    async def _send_event(self, payload: dict[str, Any]) -> None:
        seq = payload["seq"]
        if seq in self.sent_seqs:
            return
        self.sent_seqs.add(seq)
        await self.send_json({"type": "event", "seq": seq, "event": payload})

    # --- channel-layer handlers (message type "job.x" → job_x) --------------------------------
    async def job_event(self, message: dict[str, Any]) -> None:
        payload = message["event"]
        if payload["seq"] <= self.seq_floor and payload["seq"] not in self.sent_seqs:
            # Older than what a resuming client already has.
            return
        await self._send_event(payload)

    async def job_state(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "state", "job": message["job"]})

    async def job_frame(self, message: dict[str, Any]) -> None:
        # A log tail, already client JSON (ingest serialises a frame once for all viewers).
        # Metric frames arrive through the FrameHub instead.
        await self.send(text_data=message["log"])


def visible_job(user: Any, job_id: int) -> Job | None:
    """The job if ``user`` may see its workspace (None: as if it did not exist)."""
    return access.visible(user, Job.objects.all()).filter(pk=job_id).first()


class ClusterConsumer(TelemetryConsumer):
    """Nodes for everyone signed in; jobs' states and events only of the workspaces the viewer
    sees (as of connecting), so another workspace's job names and events never reach it."""

    groups_to_join = [CLUSTER_GROUP]

    async def authorize(self) -> bool:
        user = self.scope.get("user")
        self.sees_all = access.is_site_admin(user)
        self.workspaces = set(await database_sync_to_async(access.roles)(user))
        self.seen_jobs: dict[int, bool] = {}
        return True

    async def _may_see(self, job_id: int | None) -> bool:
        if job_id is None or self.sees_all:
            return True
        if job_id not in self.seen_jobs:
            query = Job.objects.filter(pk=job_id, workspace_id__in=self.workspaces).exists
            self.seen_jobs[job_id] = await database_sync_to_async(query)()
        return self.seen_jobs[job_id]

    async def cluster_node(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "node", "node": message["node"]})

    async def cluster_job(self, message: dict[str, Any]) -> None:
        job = message["job"]
        if self.sees_all or job.get("workspace") in self.workspaces:
            await self.send_json({"type": "job", "job": job})

    async def cluster_event(self, message: dict[str, Any]) -> None:
        payload = message["event"]
        if await self._may_see(payload.get("job")):
            await self.send_json({"type": "event", "seq": payload["seq"], "event": payload})
