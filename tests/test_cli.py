"""The ``trainyard`` CLI against a real console over HTTP: login with a password (which mints
an API token), submit a YAML spec, list, show, scale, stop, nodes, and clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from console.api.models import ApiToken
from console.cluster.models import Node
from console.core.states import JobState
from console.jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def run_cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINYARD_CONFIG": str(home / "config.json"), "TRAINYARD_PASSWORD": "pw-cli-user-1"}
    env.pop("TRAINYARD_URL", None)
    env.pop("TRAINYARD_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_round_trip(console_url: str, tmp_path: Path) -> None:
    user = User.objects.create_user("cli-user", password="pw-cli-user-1")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    Node.objects.create(name="gpu-01", address="10.0.0.1", slots=4, last_heartbeat=timezone.now())

    login = run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user")
    assert login.returncode == 0, login.stderr
    assert ApiToken.objects.filter(user=user, revoked=False).count() == 1
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == 0o600

    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: from-cli\nentrypoint: /opt/train.py\nnnodes: '2:4'\nnproc_per_node: 2\nenv:\n  LR: '0.1'\n"
    )
    submitted = run_cli(tmp_path, "submit", str(spec), "--set", "priority=5")
    assert submitted.returncode == 0, submitted.stderr
    job = Job.objects.get(name="from-cli")
    assert (job.min_nodes, job.max_nodes, job.priority, job.env) == (2, 4, 5, {"LR": "0.1"})
    assert f"Submitted job {job.pk}" in submitted.stdout

    listing = run_cli(tmp_path, "ls")
    assert listing.returncode == 0 and "from-cli" in listing.stdout and "PENDING" in listing.stdout
    shown = run_cli(tmp_path, "show", str(job.pk))
    assert shown.returncode == 0 and "2:4" in shown.stdout

    scaled = run_cli(tmp_path, "scale", str(job.pk), "3")
    assert scaled.returncode == 0, scaled.stderr
    job.refresh_from_db()
    assert job.desired_nodes == 3
    refused = run_cli(tmp_path, "scale", str(job.pk), "9")
    assert refused.returncode == 5 and "outside 2..4" in refused.stderr

    stopped = run_cli(tmp_path, "stop", str(job.pk))
    assert stopped.returncode == 0 and "STOPPED" in stopped.stdout
    assert Job.objects.get(pk=job.pk).state == JobState.STOPPED

    nodes = run_cli(tmp_path, "nodes")
    assert nodes.returncode == 0 and "gpu-01" in nodes.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nworkload: digits-mlp\nentrypoint: x.py\n")
    invalid = run_cli(tmp_path, "submit", str(bad))
    assert invalid.returncode == 5 and "workload" in invalid.stderr and "Traceback" not in invalid.stderr
    missing = run_cli(tmp_path, "show", "999999")
    assert missing.returncode == 3 and "404" in missing.stderr and "Traceback" not in missing.stderr


def test_login_again_replaces_the_token_and_logout_revokes_it(console_url: str, tmp_path: Path) -> None:
    user = User.objects.create_user("cli-user", password="pw-cli-user-1")
    assert run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user").returncode == 0
    first = ApiToken.objects.get(user=user, revoked=False)

    again = run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user")
    assert again.returncode == 0, again.stderr
    second = ApiToken.objects.get(user=user, revoked=False)
    assert second.pk != first.pk and second.name == first.name
    first.refresh_from_db()
    assert first.revoked

    out = run_cli(tmp_path, "logout")
    assert out.returncode == 0, out.stderr
    second.refresh_from_db()
    assert second.revoked and not (tmp_path / "config.json").exists()
    assert "trainyard login" in run_cli(tmp_path, "ls").stderr


def test_cli_without_login_says_how_to_log_in(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "ls")
    assert result.returncode == 4
    assert "trainyard login" in result.stderr


def test_wrong_password_is_refused(console_url: str, tmp_path: Path) -> None:
    User.objects.create_user("cli-user", password="something-else-1")
    result = run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user")
    assert result.returncode == 4 and "wrong username or password" in result.stderr
    assert not (tmp_path / "config.json").exists()
