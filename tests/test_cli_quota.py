"""``trainyard quota`` and ``trainyard ls --workspace`` against a real console over HTTP: the
quota rows of the API, and only the named workspace's jobs (of those the user sees)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from console.jobs.models import Job
from console.teams.models import Membership, NodePool, Quota, Resource, Role, Workspace
from tests.test_cli import run_cli

pytestmark = pytest.mark.django_db(transaction=True)


def test_quota_and_ls_by_workspace(console_url: str, tmp_path: Path) -> None:
    user = User.objects.create_user("cli-user", password="pw-cli-user-1")
    red, blue = Workspace.objects.create(name="red", weight=2), Workspace.objects.create(name="blue")
    Membership.objects.create(workspace=red, user=user, role=Role.EDITOR)
    pool = NodePool.objects.create(name="a100", selector={"gpu": "a100"}, resource=Resource.GPU)
    Quota.objects.create(workspace=red, pool=pool, nominal=8, borrowing_limit=4)
    Quota.objects.create(workspace=blue, pool=pool, nominal=8)
    Job.objects.create(name="red-1", workload="digits-mlp", workspace=red, pool=pool)
    Job.objects.create(name="blue-1", workload="digits-mlp", workspace=blue, pool=pool)
    Job.objects.create(name="everyone-1", workload="digits-mlp")
    assert run_cli(tmp_path, "login", "--url", console_url, "--username", "cli-user").returncode == 0

    quota = run_cli(tmp_path, "quota", "--json")
    assert quota.returncode == 0, quota.stderr
    rows = {(r["pool"], r["workspace"]): r for r in json.loads(quota.stdout)}
    assert set(rows) == {("a100", "red"), ("a100", "blue")}
    assert rows[("a100", "red")]["nominal"] == 8 and rows[("a100", "red")]["borrowing_limit"] == 4
    assert rows[("a100", "red")]["pending"] == 1 and rows[("a100", "red")]["mine"] is True
    readable = run_cli(tmp_path, "quota")
    assert "MAY BORROW" in readable.stdout and "red *" in readable.stdout

    listed = run_cli(tmp_path, "ls", "--workspace", "red", "--json")
    assert [j["name"] for j in json.loads(listed.stdout)] == ["red-1"]
    theirs = run_cli(tmp_path, "ls", "--workspace", "blue", "--json")
    assert json.loads(theirs.stdout) == []  # not a workspace this user sees
