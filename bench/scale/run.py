"""One console, 1,000 simulated agents: heartbeat processing, resize decisions, loss detection.

    .venv/bin/python bench/scale/run.py [--agents 1000] [--jobs 5] [--reps 5] [--interval 10]
                                        [--window 8]

A real console (controller with its beat, ingest, web, as bench/harness.py starts them) on its
own database and Redis, and ``agents`` protocol-level simulated agents (bench/scale/sim.py: one
asyncio loop; registrations, heartbeats every ``interval`` seconds, round starts and stops,
rank exits, through the real broker; no ranks), each with its own node credential.

Once every node is ONLINE and ``jobs`` elastic jobs (2:4 nodes, 2 wanted) run on them:
1. Heartbeats, ``reps`` windows of ``window`` s: a heartbeat's processing time is from the
   simulated agent's send to the controller's ``Node.last_heartbeat`` for it (the heartbeat's
   ``cpu_percent`` carries its sequence number; the node table is read every 0.2 s). Per window:
   p95 over every heartbeat seen, and the controller's CPU (user + system, % of one core).
2. Resize decisions, ``reps`` times: each job resized 2 -> 3 and back over HTTP
   (``POST /api/v1/jobs/<id>/resize/`` with an API token); the time from the call to the last
   command of the new round reaching its simulated agents' queues. Per rep: p95 of its calls.
3. Loss detection, ``reps`` times: a job's second host stops (no heartbeats, no answers) and its
   first reports a rank failure (the collective broke); the time from that report to the
   stopped host shown LOST (the controller pings it and declares it lost after PING_DEADLINE).

The figures are medians (with ranges) over the reps; the machine's load is printed. The last
line is JSON with ``heartbeat_p95_ms``, ``resize_decision_p95_ms``, ``loss_detect_s`` and
``controller_cpu_percent``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from bench.scale.sim import Received, SimAgent, Simulator  # noqa: E402

KEYS = ["heartbeat_p95_ms", "resize_decision_p95_ms", "loss_detect_s", "controller_cpu_percent"]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--interval", type=float, default=10.0, help="heartbeat interval, seconds")
    parser.add_argument("--window", type=float, default=8.0, help="seconds per heartbeat window")
    parser.add_argument("--keep", action="store_true", help="keep the console's logs")
    return parser.parse_args(argv)


def wait(predicate: Any, timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


class HeartbeatWatch:
    """Reads the node table every 0.2 s; each newly processed heartbeat's latency is kept."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.latencies: list[float] = []
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def take(self) -> list[float]:
        taken, self.latencies = self.latencies, []
        return taken

    def _run(self) -> None:
        from django.db import connection

        from console.cluster.models import Node

        while not self._stop.wait(0.2):
            rows = Node.objects.values_list("name", "cpu_percent", "last_heartbeat")
            for name, seq_float, at in rows:
                seq = int(seq_float)
                if at is None or seq <= self._seen.get(name, 0) or name not in self.sim.sent:
                    continue
                self._seen[name] = seq
                sent = self.sim.sent[name].get(seq)
                if sent is not None:
                    self.latencies.append((at.timestamp() - sent) * 1000)
        connection.close()


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def make_credentials(count: int) -> list[SimAgent]:
    from console.cluster.models import NodeCredential
    from console.cluster.tokens import hash_secret

    agents = []
    rows = []
    for i in range(count):
        secret = secrets.token_urlsafe(24)
        name = f"sim-{i:04d}"
        agents.append(SimAgent(name, secret))
        rows.append(NodeCredential(node_name=name, secret_hash=hash_secret(secret), prefix=secret[:8]))
    NodeCredential.objects.bulk_create(rows, batch_size=500)
    return agents


def submit_jobs(count: int) -> list[int]:
    from console.jobs import actions
    from console.jobs.models import Job

    ids = []
    for i in range(count):
        job = Job(
            name=f"scale-{i}",
            entrypoint="/bin/true",
            min_nodes=2,
            max_nodes=4,
            desired_nodes=2,
            nproc_per_node=4,  # a whole simulated host (4 slots): each job has hosts of its own
            max_restarts=10,
        )
        ids.append(actions.submit_job(job, None).pk)
    return ids


def api_token() -> str:
    from django.contrib.auth.models import Group, User

    from console.api.models import ApiToken

    user = User.objects.create_user("scale-operator", password=secrets.token_urlsafe(12))
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    _, raw = ApiToken.issue(user, "scale-bench", scopes=["read", "jobs:write"])
    return raw


def resize(url: str, token: str, job_id: int, nodes: int) -> None:
    request = urllib.request.Request(
        f"{url}/api/v1/jobs/{job_id}/resize/",
        data=json.dumps({"nodes": nodes}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def measure_resize(sim: Simulator, url: str, token: str, job_id: int, nodes: int) -> float:
    """Seconds from the API call to the last start of the job's new round reaching its hosts."""
    from console.jobs.models import Job

    before = Job.objects.get(pk=job_id).round_number
    starts: list[Received] = []
    got = threading.Event()

    def listen(received: Received) -> None:
        spec = received.kwargs.get("spec") or {}
        if (
            received.task == "trainyard.agent.start_round"
            and spec.get("job_id") == job_id
            and spec.get("round", 0) > before
        ):
            starts.append(received)
            if len(starts) >= spec["nnodes"]:
                got.set()

    sim.listeners.append(listen)
    try:
        began = time.time()
        resize(url, token, job_id, nodes)
        if not got.wait(30):
            raise TimeoutError(f"job {job_id}: no new round on its hosts")
        return max(r.at for r in starts) - began
    finally:
        sim.listeners.remove(listen)


def measure_loss(sim: Simulator, job_id: int) -> float:
    """A host of ``job_id`` stops; its peer reports a rank failure: seconds until it is LOST."""
    from console.cluster.models import Node
    from console.jobs.models import Allocation, Job

    job = Job.objects.get(pk=job_id)
    allocs = list(
        Allocation.objects.filter(round__job=job, round__number=job.round_number)
        .order_by("node_rank")
        .select_related("node")
    )
    survivor, victim = allocs[0].node.name, allocs[1].node.name
    sim.agents[victim].alive = False
    exit = {
        "local_rank": 0,
        "rank": 0,
        "pid": 1,
        "exit_code": 1,
        "signal": None,
        "error": "peer gone",
        "at": time.time(),
    }
    began = time.time()
    sim.call(
        sim.report(
            survivor, "trainyard.control.rank_exited", job_id=job_id, round=job.round_number, exit=exit
        )
    )
    wait(lambda: Node.objects.get(name=victim).state == "LOST", 60, f"{victim} LOST", every=0.02)
    return time.time() - began


def main(args: argparse.Namespace) -> None:
    env = {
        "TRAINYARD_HEARTBEAT_INTERVAL": str(args.interval),
        "TRAINYARD_PING_DEADLINE": "1.5",
        "LOG_LEVEL": "WARNING",
    }
    figures: dict[str, Any] = {}
    with harness.Bench("scale", database="trainyard_scale_bench", env=env, keep=args.keep) as bench:
        agents = make_credentials(args.agents)
        console = bench.console
        url = console.start_web()
        controller = console.start_controller()
        console.start_ingest("scale")
        token = api_token()
        sim = Simulator(bench.redis_url, agents, args.interval)
        sim.start()
        try:
            from console.cluster.models import Node
            from console.jobs.models import Job

            began = time.monotonic()
            sim.call(sim.register_all())
            wait(
                lambda: Node.objects.filter(state="ONLINE").count() >= args.agents,
                900,
                "every node ONLINE",
                0.5,
            )
            print(
                f"{args.agents} simulated agents registered in {time.monotonic() - began:.1f} s", flush=True
            )
            jobs = submit_jobs(args.jobs)
            wait(
                lambda: Job.objects.filter(pk__in=jobs, state="RUNNING").count() == len(jobs),
                120,
                "jobs RUNNING",
                0.5,
            )
            time.sleep(args.interval)  # the registration's work (pre-flight checks expiring) settles

            watch = HeartbeatWatch(sim)
            watch.start()
            heartbeat_p95, cpu = [], []
            time.sleep(1)
            watch.take()
            for _ in range(args.reps):
                pid = controller.pid
                assert pid is not None
                cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
                time.sleep(args.window)
                cpu.append(100 * (cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before))
                heartbeat_p95.append(harness.percentile(watch.take(), 95))

            resize_p95 = []
            for _ in range(args.reps):
                calls = []
                for job_id in jobs:
                    calls.append(measure_resize(sim, url, token, job_id, 3) * 1000)
                for job_id in jobs:
                    calls.append(measure_resize(sim, url, token, job_id, 2) * 1000)
                resize_p95.append(harness.percentile(calls, 95))
            watch.stop()

            loss = [measure_loss(sim, jobs[i % len(jobs)]) for i in range(args.reps)]
        finally:
            sim.stop()
    load = os.getloadavg()
    print()
    print(f"{'figure':<28}{'median (range) over ' + str(args.reps) + ' reps':>36}")
    print(f"{'heartbeat p95, ms':<28}{summary(heartbeat_p95):>36}")
    print(f"{'resize decision p95, ms':<28}{summary(resize_p95):>36}")
    print(f"{'loss detection, s':<28}{summary(loss):>36}")
    print(f"{'controller CPU, % of a core':<28}{summary(cpu):>36}")
    print(
        f"agents {args.agents}, heartbeat every {args.interval:g} s, jobs {args.jobs}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    figures = {
        "heartbeat_p95_ms": round(statistics.median(heartbeat_p95), 1),
        "heartbeat_p95_ms_range": [round(min(heartbeat_p95), 1), round(max(heartbeat_p95), 1)],
        "resize_decision_p95_ms": round(statistics.median(resize_p95), 1),
        "resize_decision_p95_ms_range": [round(min(resize_p95), 1), round(max(resize_p95), 1)],
        "loss_detect_s": round(statistics.median(loss), 2),
        "loss_detect_s_range": [round(min(loss), 2), round(max(loss), 2)],
        "controller_cpu_percent": round(statistics.median(cpu), 1),
        "agents": args.agents,
        "heartbeat_interval_s": args.interval,
        "load_average": [round(x, 1) for x in load],
    }
    harness.print_json(figures)


if __name__ == "__main__":
    harness.run(main, parse())
