"""The ``trainyard`` CLI end to end against a live console with real agents: a real Daphne,
controller, ingest and two agents. It logs in, submits a directory whose .gitignored virtualenv
stays behind, follows the job's logs until a known line and its metrics over the websocket,
scales the job down, stops it, parses every --json answer, and produces each exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import IO

import pytest
from django.contrib.auth.models import Group, User

from console.jobs.bundles import bundle_path
from console.jobs.models import Allocation, Job
from tests.support.agents import AgentProcs
from tests.support.controller import wait_for
from tests.support.live import LiveConsole
from workers.cli.live import LiveUnavailable, follow_job, socket_url

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

PASSWORD = "pw-cli-live-1"
TRAIN = """\
import time

from workers import sdk

step = 0
while True:
    step += 1
    sdk.log(step, loss=1.0 / step)
    print(f"step {step} done", flush=True)
    time.sleep(0.1)
"""


@pytest.fixture
def agents(live_console: LiveConsole) -> AgentProcs:
    """The live console's controller (bundle URLs point at it) and ingest, and two agents."""
    live_console.start_agents("cli-a", "cli-b")
    return live_console.agents


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "TRAINYARD_CONFIG": str(home / "config.json"), "TRAINYARD_PASSWORD": PASSWORD}
    env.pop("TRAINYARD_URL", None)
    env.pop("TRAINYARD_TOKEN", None)
    return {**env, **extra}


TRAINYARD = str(Path(sys.executable).parent / "trainyard")


def run_cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRAINYARD, *args], env=cli_env(home, **env), capture_output=True, text=True, timeout=60
    )


def start_cli(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [TRAINYARD, *args],
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def read_until(stream: IO[str], wanted: str, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if wanted in line:
            return lines
    raise AssertionError(f"{wanted!r} not seen in {lines[-5:]}")


def finish(process: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        stdout, stderr = process.communicate()
        raise AssertionError(f"the CLI did not end: {stderr[-500:]}") from None
    return process.returncode, stdout, stderr


def current_world(job: Job) -> int:
    job.refresh_from_db()
    return Allocation.objects.filter(round__job=job, round__number=job.round_number).count()


def test_cli_drives_a_job_on_real_agents(agents: AgentProcs, console_url: str, tmp_path: Path) -> None:
    user = User.objects.create_user("cli-live", password=PASSWORD)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    home = tmp_path / "home"
    login = run_cli(home, "login", "--url", console_url, "--username", "cli-live")
    assert login.returncode == 0, login.stderr

    src = tmp_path / "src"
    (src / "venv" / "lib").mkdir(parents=True)
    (src / "train.py").write_text(TRAIN)
    (src / ".gitignore").write_text("venv/\n")
    (src / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (src / "venv" / "lib" / "torch.so").write_bytes(os.urandom(512 * 1024))
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: cli-live\nentrypoint: train.py\nnnodes: '1:2'\nnproc_per_node: 1\ngrace_period: 5\n"
    )
    submitted = run_cli(home, "submit", str(spec), "--workdir", str(src), "--output", "json")
    assert submitted.returncode == 0, submitted.stderr
    job = Job.objects.get(pk=json.loads(submitted.stdout)["id"])
    assert job.bundle is not None
    with tarfile.open(bundle_path(job.bundle)) as archive:
        assert sorted(archive.getnames()) == [".gitignore", "train.py"]  # no virtualenv

    metrics = start_cli(home, "metrics", str(job.pk), "--follow", "--json", "--name", "loss")
    logs = start_cli(home, "logs", str(job.pk), "-f", "--json")
    try:
        assert logs.stdout is not None
        seen = read_until(logs.stdout, "step 5 done", timeout=90)
        assert all(isinstance(json.loads(line)["text"], str) for line in seen)
        wait_for(lambda: current_world(job) == 2, timeout=30, message="the job on both nodes")

        # Scaling outside the spec's range is a conflict (5); inside it, the job shrinks
        out_of_range = run_cli(home, "scale", str(job.pk), "3")
        assert out_of_range.returncode == 5 and "Traceback" not in out_of_range.stderr, out_of_range.stderr
        scaled = run_cli(home, "scale", str(job.pk), "1", "--json")
        assert scaled.returncode == 0, scaled.stderr
        assert json.loads(scaled.stdout)["id"] == job.pk
        wait_for(
            lambda: current_world(job) == 1 and job.state == "RUNNING",
            timeout=60,
            message="a round on one node",
        )
        shown = json.loads(run_cli(home, "show", str(job.pk), "--json").stdout)
        assert shown["state"] == "RUNNING" and shown["round"] >= 2, shown

        stopped = run_cli(home, "stop", str(job.pk), "-o", "json")
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["state"] in ("STOPPING", "STOPPED")
        wait_for(lambda: Job.objects.get(pk=job.pk).state == "STOPPED", timeout=30, message="STOPPED")

        # Both followers end by themselves once the job has stopped
        code, _, stderr = finish(logs)
        assert code == 0, stderr
        code, stdout, stderr = finish(metrics)
    finally:
        for process in (logs, metrics):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.communicate()
    assert code == 0, stderr
    assert "polling" not in stderr, stderr  # the websocket was had
    points = [json.loads(line) for line in stdout.splitlines()]
    live = [p for p in points if p["count"] == 1 and p["step"] == p["last_step"]]
    assert len(live) >= 5, points[-5:]
    steps = [p["last_step"] for p in points]
    assert steps == sorted(set(steps))  # each step once, in order
    assert all(p["series"] == "loss" and p["mean"] == pytest.approx(1.0 / p["step"]) for p in live)

    # Each exit code, without a traceback
    usage = run_cli(home, "ls", "--output", "yaml")
    missing = run_cli(home, "show", "999999")
    unauthenticated = run_cli(home, "ls", TRAINYARD_URL=console_url, TRAINYARD_TOKEN="ty_not-a-token")
    unreachable = run_cli(home, "ls", TRAINYARD_URL="http://127.0.0.1:9", TRAINYARD_TOKEN="ty_x")
    for result, code in ((usage, 2), (missing, 3), (unauthenticated, 4), (unreachable, 6)):
        assert result.returncode == code, (code, result.stderr)
        assert "Traceback" not in result.stderr and result.stderr.strip(), result.stderr
    listed = json.loads(run_cli(home, "ls", "--json").stdout)
    assert [(j["id"], j["state"]) for j in listed] == [(job.pk, "STOPPED")]

    # What makes metrics --follow fall back to polling: a refused token's close code from the
    # real Daphne (which drops close reasons), and a console that does not answer
    with pytest.raises(LiveUnavailable, match=r"4401: the console refused the token"):
        next(follow_job(console_url, "ty_not-a-token", job.pk))
    with pytest.raises(LiveUnavailable):
        next(follow_job("http://127.0.0.1:9", "ty_x", job.pk))
    assert socket_url("https://console.example/prefix/", 7) == "wss://console.example/prefix/ws/jobs/7/"
