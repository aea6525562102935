"""A pre-flight network check of 3 real agents: API call to every result in.

    .venv/bin/python bench/preflight/run.py [--reps 5] [--agents 3]

A console (controller, web) on its own database and Redis, and ``agents`` real agents on this
machine, each with its own name, all on loopback (the address this machine's agents report; across
network namespaces see tests/support/netns.py when it is on main). Each rep asks for a check of
every node over HTTP (``POST /api/v1/nodes/network/``) and times it until the check is finished
(every agent answered: links probed both ways with latency and bandwidth, console URL, DNS). The
last line is JSON with ``preflight_s`` (median over the reps).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402


def call(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        f"{url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def main(args: argparse.Namespace) -> None:
    env = {"TRAINYARD_NODE_TOKEN": secrets.token_urlsafe(32)}  # one machine: the shared node token
    with harness.Bench("preflight", database="trainyard_preflight_bench", env=env, warm_pool=0) as bench:
        from django.contrib.auth.models import Group, User

        from console.api.models import ApiToken
        from console.cluster.models import Node

        console = bench.console
        url = console.start_web()
        console.start_controller(TRAINYARD_PUBLIC_URL=url + "/")
        user = User.objects.create_user("preflight-operator", password="unused-Pw-1")
        user.groups.add(Group.objects.get_or_create(name="operator")[0])
        _, token = ApiToken.issue(user, "bench", scopes=["read", "nodes:write"])
        names = [f"pf-{i}" for i in range(args.agents)]
        for name in names:
            console.agents.start(name, heartbeat=1.0, extra_args=["--console", url])
        deadline = time.monotonic() + 120
        while Node.objects.filter(name__in=names, state="ONLINE").count() < len(names):
            if time.monotonic() > deadline:
                raise TimeoutError("agents did not register")
            time.sleep(0.2)
        time.sleep(3)  # the enrolment checks finish
        took, links = [], []
        for _ in range(args.reps):
            began = time.monotonic()
            check = call(url, token, "POST", "/api/v1/nodes/network/", {"nodes": names})
            while True:
                view = call(url, token, "GET", f"/api/v1/nodes/network/?check={check['id']}")
                if view["checks"][0]["done"]:
                    break
                time.sleep(0.05)
            took.append(time.monotonic() - began)
            links.append([x for x in view["links"] if x["check_id"] == check["id"]])
    ok = all(link["ok"] for rep in links for link in rep)
    latency = [link["latency_ms"] for rep in links for link in rep if link["latency_ms"] is not None]
    bandwidth = [
        link["bandwidth_mbps"] for rep in links for link in rep if link["bandwidth_mbps"] is not None
    ]
    load = os.getloadavg()
    print()
    print(f"{'figure':<32}{'median (range) over ' + str(args.reps) + ' reps':>32}")
    print(
        f"{'pre-flight of ' + str(args.agents) + ' hosts, s':<32}{statistics.median(took):>14.2f} ({min(took):.2f}-{max(took):.2f})"
    )
    print(
        f"{'link latency, ms':<32}{statistics.median(latency):>14.2f} ({min(latency):.2f}-{max(latency):.2f})"
    )
    print(
        f"{'link bandwidth, Mbit/s':<32}{statistics.median(bandwidth):>14.0f} ({min(bandwidth):.0f}-{max(bandwidth):.0f})"
    )
    print(
        f"every link reached: {ok}; agents on loopback; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    harness.print_json(
        {
            "preflight_s": round(statistics.median(took), 2),
            "preflight_s_range": [round(min(took), 2), round(max(took), 2)],
            "all_links_ok": ok,
            "load_average": [round(x, 1) for x in load],
        }
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--agents", type=int, default=3)
    harness.run(main, parser.parse_args())
