"""Protocol-level simulated agents: many of them in one asyncio loop, on the real broker.

Each simulated agent does what workers/agent/app.py does on the wire, without ranks: it
registers (CONTROL_REGISTER), heartbeats every ``interval`` (CONTROL_HEARTBEAT, with the rounds
it was told to run reported RUNNING), and acts on the controller's commands to its queue
``node.<name>`` (start, stop, sync, heartbeat now, register again). Messages are the Celery
messages an agent's ``send_task`` makes (protocol 2, JSON body, base64) pushed to the queue's
Redis list; commands are popped from the node queues' lists, as kombu's Redis transport does.

Each heartbeat's ``cpu_percent`` carries its sequence number, so the bench can tell, reading the
node table, which heartbeat the controller processed last and when (``Node.last_heartbeat``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from workers import protocol
from workers.signing import SEAL, report_key, seal_report

EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def celery_message(task: str, kwargs: dict[str, Any], queue: str) -> str:
    """The message Celery's ``send_task(task, kwargs=kwargs, queue=queue)`` puts on Redis."""
    task_id = str(uuid.uuid4())
    body = base64.b64encode(json.dumps([[], kwargs, EMBED]).encode()).decode()
    return json.dumps(
        {
            "body": body,
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": task,
                "id": task_id,
                "shadow": None,
                "eta": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": task_id,
                "parent_id": None,
                "argsrepr": "()",
                "kwargsrepr": "{}",
                "origin": "bench-scale-sim",
                "ignore_result": True,
            },
            "properties": {
                "correlation_id": task_id,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def decode_command(raw: bytes | str) -> tuple[str, dict[str, Any]]:
    message = json.loads(raw)
    args = json.loads(base64.b64decode(message["body"]))
    return message["headers"]["task"], args[1]


@dataclass
class SimAgent:
    name: str
    token: str
    session: str = field(default_factory=lambda: uuid.uuid4().hex)
    alive: bool = True
    seq: int = 0
    rounds: dict[int, int] = field(default_factory=dict)  # job id -> round number it runs
    due: float = 0.0

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "job_id": job,
                "round": number,
                "state": protocol.RoundState.RUNNING.value,
                "ranks": [],
                "last_step": None,
                "first_step_at": None,
            }
            for job, number in self.rounds.items()
        ]


@dataclass
class Received:
    """A command as a simulated agent got it."""

    node: str
    task: str
    kwargs: dict[str, Any]
    at: float  # time.time()


class Simulator:
    """``agents`` simulated agents heartbeating every ``interval`` seconds, in a thread of their own."""

    def __init__(self, redis_url: str, agents: list[SimAgent], interval: float) -> None:
        self.redis_url = redis_url
        self.agents = {a.name: a for a in agents}
        self.interval = interval
        self.sent: dict[str, dict[int, float]] = {a.name: {} for a in agents}  # node -> seq -> time.time()
        self.received: list[Received] = []
        self.listeners: list[Callable[[Received], None]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sim", daemon=True)
        self._stopping = False
        self._futures: list[Any] = []

    def start(self) -> None:
        self._thread.start()
        self._futures = [
            asyncio.run_coroutine_threadsafe(self._beat(), self._loop),
            asyncio.run_coroutine_threadsafe(self._consume(), self._loop),
        ]

    def stop(self) -> None:
        self._stopping = True
        for future in self._futures:
            with contextlib.suppress(Exception):  # best effort on the way out
                future.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    # --- what agents send -----------------------------------------------------------------
    async def _send(self, client: aioredis.Redis, messages: list[tuple[str, dict[str, Any]]]) -> None:
        if not messages:
            return
        pipe = client.pipeline(transaction=False)
        for task, kwargs in messages:
            # Sealed with the node's credential as workers/agent/control.py does (the console
            # checks the seal, workers/signing.py).
            key = report_key(self.agents[kwargs["node"]].token)
            sealed = {**kwargs, SEAL: seal_report(key, task, kwargs)}
            pipe.lpush(protocol.CONTROL_QUEUE, celery_message(task, sealed, protocol.CONTROL_QUEUE))
        await pipe.execute()

    def _base(self, agent: SimAgent) -> dict[str, Any]:
        return {"node": agent.name, "session": agent.session}

    def _heartbeat(self, agent: SimAgent) -> tuple[str, dict[str, Any]]:
        agent.seq += 1
        with self._lock:
            self.sent[agent.name][agent.seq] = time.time()
        load = {"cpu_percent": float(agent.seq), "memory_percent": 10.0, "gpus": []}
        return protocol.CONTROL_HEARTBEAT, {**self._base(agent), "load": load, "rounds": agent.status()}

    def _register(self, agent: SimAgent) -> tuple[str, dict[str, Any]]:
        index = int(agent.name.rsplit("-", 1)[1])
        info = {
            "hostname": agent.name,
            "address": f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256 + 1}",
            "cpus": 8,
            "memory_bytes": 64 << 30,
            "slots": 4,
            "gpus": [],
            "torch_version": "2.13.0",
            "agent_version": "0.2.0",
            "protocol": protocol.PROTOCOL_VERSION,
        }
        return protocol.CONTROL_REGISTER, {**self._base(agent), "info": info}

    async def register_all(self, batch: int = 100) -> None:
        client = aioredis.from_url(self.redis_url)
        agents = list(self.agents.values())
        for start in range(0, len(agents), batch):
            await self._send(client, [self._register(a) for a in agents[start : start + batch]])
        await client.aclose()

    async def report(self, node: str, task: str, **kwargs: Any) -> None:
        client = aioredis.from_url(self.redis_url)
        await self._send(client, [(task, {**self._base(self.agents[node]), **kwargs})])
        await client.aclose()

    async def _beat(self) -> None:
        client = aioredis.from_url(self.redis_url)
        now = time.monotonic()
        rng = random.Random(7)
        for agent in self.agents.values():
            agent.due = now + rng.uniform(0, self.interval)  # spread, as agents started at random
        while not self._stopping:
            now = time.monotonic()
            batch = []
            for agent in self.agents.values():
                if agent.alive and agent.due <= now:
                    agent.due = now + self.interval
                    batch.append(self._heartbeat(agent))
            await self._send(client, batch)
            await asyncio.sleep(0.02)
        await client.aclose()

    # --- what agents receive --------------------------------------------------------------
    async def _consume(self) -> None:
        client = aioredis.from_url(self.redis_url)
        keys = [protocol.node_queue(name) for name in self.agents]
        while not self._stopping:
            got = await client.brpop(keys, timeout=1)
            if got is None:
                continue
            key, raw = got
            node = (key.decode() if isinstance(key, bytes) else key).split(".", 1)[1]
            task, kwargs = decode_command(raw)
            received = Received(node, task, kwargs, time.time())
            with self._lock:
                self.received.append(received)
            agent = self.agents[node]
            if not agent.alive:
                continue
            await self._act(client, agent, task, kwargs)
            for listener in list(self.listeners):
                listener(received)
        await client.aclose()

    async def _act(self, client: aioredis.Redis, agent: SimAgent, task: str, kwargs: dict[str, Any]) -> None:
        if task == protocol.AGENT_START_ROUND:
            spec = kwargs["spec"]
            if spec["round"] >= agent.rounds.get(spec["job_id"], 0):
                agent.rounds[spec["job_id"]] = spec["round"]
        elif task == protocol.AGENT_STOP_JOB:
            if agent.rounds.get(kwargs["job_id"], 0) <= kwargs["round"]:
                agent.rounds.pop(kwargs["job_id"], None)
        elif task == protocol.AGENT_SYNC:
            agent.rounds = {spec["job_id"]: spec["round"] for spec in kwargs["rounds"]}
        elif task == protocol.AGENT_HEARTBEAT_NOW:
            await self._send(client, [self._heartbeat(agent)])
        elif task == protocol.AGENT_REGISTER_AGAIN:
            await self._send(client, [self._register(agent)])
        # AGENT_PREFLIGHT: a simulated host has no listener; its check expires unanswered.
