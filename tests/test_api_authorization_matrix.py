"""Who may do what: every API endpoint x method x kind of caller, with the status each one gets.

The table below is the contract. Columns are kinds of caller; a new kind is one line in
``DERIVED`` (a column that answers like an existing one except for the cells it names), e.g. a
per-node credential that answers like ``node`` everywhere but may download its own bundles.
Every cell runs in its own savepoint, so a revoke or a stop in one cell does not change the next.

Token columns are tokens of a staff superuser, so their answers show the scopes alone at work;
``admin`` implies every scope, so its column answers like the staff session's (but for
``tokens/current/``, which only a token has).
The job lives in a closed workspace ("m-team": viewer a viewer, oper an editor there); "outsider"
is a site operator who is no member of it: every job of it is 404 to them (another workspace's
job does not exist), where the operator's answer is not a 405.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from console.alerts.models import Alert, Channel, Rule
from console.api.models import ApiToken
from console.cluster import tokens
from console.cluster.models import Node
from console.experiments.models import Sweep
from console.jobs.bundles import store_bundle
from console.jobs.models import Allocation, Job, Round
from console.teams.models import Membership, Role, Workspace

pytestmark = pytest.mark.django_db

NODE_TOKEN = "node-secret-for-the-matrix-0123456789"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

COLUMNS = ("anon", "viewer", "oper", "staff", "read", "jobs", "nodes", "admin", "expired", "revoked", "node")

# Paths use {job}, {node}, {bundle}, {sha}, {token}: ids of objects each row creates.
# Rows: "METHOD path  status per column, in the order of COLUMNS"; method "*" stands for every
# method of GET, POST, PUT, PATCH, DELETE that the path has no row of its own for.
MATRIX = """
GET    /api/schema/                        401 200 200 200  200 403 403 200  401 401 401
*      /api/schema/                        401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/audit/                      401 403 403 200  403 403 403 200  401 401 401
*      /api/v1/audit/                      401 403 403 405  403 403 403 405  401 401 401
POST   /api/v1/auth/token/                 201 201 201 201  201 201 201 201  201 201 201
*      /api/v1/auth/token/                 405 405 405 405  405 405 405 405  405 405 405
GET    /api/v1/bundles/                    401 200 200 200  200 403 403 200  401 401 401
POST   /api/v1/bundles/                    401 403 201 201  403 201 403 201  401 401 401
*      /api/v1/bundles/                    401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/bundles/{bundle}/           401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/bundles/{bundle}/           401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/bundles/limits/             401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/bundles/limits/             401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/bundles/{sha}/archive/      401 403 200 200  200 403 403 200  401 401 200
*      /api/v1/bundles/{sha}/archive/      401 405 405 405  403 403 403 405  401 401 405
GET    /api/v1/jobs/                       401 200 200 200  200 403 403 200  401 401 401
POST   /api/v1/jobs/                       401 403 201 201  403 201 403 201  401 401 401
*      /api/v1/jobs/                       401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/jobs/{job}/                 401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/                 401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/jobs/{job}/resize/          401 405 405 405  405 403 403 405  401 401 401
POST   /api/v1/jobs/{job}/resize/          401 403 200 200  403 200 403 200  401 401 401
*      /api/v1/jobs/{job}/resize/          401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/jobs/{job}/restart/         401 405 405 405  405 403 403 405  401 401 401
POST   /api/v1/jobs/{job}/restart/         401 403 409 409  403 409 403 409  401 401 401
*      /api/v1/jobs/{job}/restart/         401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/jobs/{job}/stop/            401 405 405 405  405 403 403 405  401 401 401
POST   /api/v1/jobs/{job}/stop/            401 403 200 200  403 200 403 200  401 401 401
*      /api/v1/jobs/{job}/stop/            401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/jobs/{job}/rounds/          401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/rounds/          401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/jobs/{job}/checkpoints/     401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/checkpoints/     401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/events/          401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/events/          401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/logs/            401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/logs/            401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/logs/stream/     401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/logs/stream/     401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/hangs/           401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/hangs/           401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/goodput/         401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/goodput/         401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/goodput/                    401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/goodput/                    401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/alerts/                     401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/alerts/                     401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/alerts/{alert}/             401 404 404 200  200 403 403 200  401 401 401
*      /api/v1/alerts/{alert}/             401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/alerts/channels/            401 200 200 200  200 403 403 200  401 401 401
POST   /api/v1/alerts/channels/            401 201 201 201  403 403 403 201  401 401 401
*      /api/v1/alerts/channels/            401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/alerts/channels/{channel}/  401 404 404 200  200 403 403 200  401 401 401
PATCH  /api/v1/alerts/channels/{channel}/  401 404 404 200  403 403 403 200  401 401 401
DELETE /api/v1/alerts/channels/{channel}/  401 404 404 204  403 403 403 204  401 401 401
PUT    /api/v1/alerts/channels/{channel}/  401 404 404 400  403 403 403 400  401 401 401
*      /api/v1/alerts/channels/{channel}/  401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/alerts/rules/               401 200 200 200  200 403 403 200  401 401 401
POST   /api/v1/alerts/rules/               401 400 400 400  403 403 403 400  401 401 401
*      /api/v1/alerts/rules/               401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/alerts/rules/{rule}/        401 404 404 200  200 403 403 200  401 401 401
PATCH  /api/v1/alerts/rules/{rule}/        401 404 404 200  403 403 403 200  401 401 401
DELETE /api/v1/alerts/rules/{rule}/        401 404 404 204  403 403 403 204  401 401 401
PUT    /api/v1/alerts/rules/{rule}/        401 404 404 400  403 403 403 400  401 401 401
*      /api/v1/alerts/rules/{rule}/        401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/metrics/         401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/metrics/         401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/metrics/ranks/   401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/metrics/ranks/   401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/metrics/roles/   401 400 400 400  400 403 403 400  401 401 401
*      /api/v1/jobs/{job}/metrics/roles/   401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/metrics/roles/series/  401 400 400 400  400 403 403 400  401 401 401
*      /api/v1/jobs/{job}/metrics/roles/series/  401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/sweeps/                     401 200 200 200  200 403 403 200  401 401 401
POST   /api/v1/sweeps/                     401 403 201 201  403 201 403 201  401 401 401
*      /api/v1/sweeps/                     401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/sweeps/{sweep}/             401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/sweeps/{sweep}/             401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/sweeps/{sweep}/stop/        401 405 405 405  405 403 403 405  401 401 401
POST   /api/v1/sweeps/{sweep}/stop/        401 403 200 200  403 200 403 200  401 401 401
*      /api/v1/sweeps/{sweep}/stop/        401 403 405 405  403 405 403 405  401 401 401
GET    /api/v1/compare/                    401 400 400 400  400 403 403 400  401 401 401
*      /api/v1/compare/                    401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/compare/series/             401 400 400 400  400 403 403 400  401 401 401
*      /api/v1/compare/series/             401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/jobs/{job}/metrics/export/  401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/jobs/{job}/metrics/export/  401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/nodes/                      401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/nodes/                      401 403 405 405  403 403 405 405  401 401 401
GET    /api/v1/nodes/join-tokens/          401 403 200 200  200 403 403 200  401 401 401
POST   /api/v1/nodes/join-tokens/          401 403 201 201  403 403 201 201  401 401 401
*      /api/v1/nodes/join-tokens/          401 403 405 405  403 403 405 405  401 401 401
POST   /api/v1/nodes/enroll/               400 400 400 400  400 400 400 400  400 400 400
*      /api/v1/nodes/enroll/               405 405 405 405  405 405 405 405  405 405 405
GET    /api/v1/nodes/network/              401 200 200 200  200 403 403 200  401 401 401
POST   /api/v1/nodes/network/              401 403 202 202  403 403 202 202  401 401 401
*      /api/v1/nodes/network/              401 403 405 405  403 403 405 405  401 401 401
GET    /api/v1/nodes/{node}/check-network/ 401 405 405 405  405 403 403 405  401 401 401
POST   /api/v1/nodes/{node}/check-network/ 401 403 202 202  403 403 202 202  401 401 401
*      /api/v1/nodes/{node}/check-network/ 401 403 405 405  403 403 405 405  401 401 401
GET    /api/v1/nodes/{node}/               401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/nodes/{node}/               401 403 405 405  403 403 405 405  401 401 401
GET    /api/v1/nodes/{node}/drain/         401 405 405 405  405 403 403 405  401 401 401
POST   /api/v1/nodes/{node}/drain/         401 403 200 200  403 403 200 200  401 401 401
*      /api/v1/nodes/{node}/drain/         401 403 405 405  403 403 405 405  401 401 401
GET    /api/v1/nodes/{node}/undrain/       401 405 405 405  405 403 403 405  401 401 401
POST   /api/v1/nodes/{node}/undrain/       401 403 200 200  403 403 200 200  401 401 401
*      /api/v1/nodes/{node}/undrain/       401 403 405 405  403 403 405 405  401 401 401
GET    /api/v1/tokens/                     401 200 200 200  200 403 403 200  401 401 401
POST   /api/v1/tokens/                     401 201 201 201  403 403 403 201  401 401 401
*      /api/v1/tokens/                     401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/tokens/{token}/             401 404 404 200  200 403 403 200  401 401 401
DELETE /api/v1/tokens/{token}/             401 404 404 204  403 403 403 204  401 401 401
*      /api/v1/tokens/{token}/             401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/tokens/current/             401 404 404 404  200 200 200 200  401 401 401
DELETE /api/v1/tokens/current/             401 404 404 404  204 204 204 204  401 401 401
*      /api/v1/tokens/current/             401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/no-such-endpoint/           401 404 404 404  404 403 403 404  401 401 401
*      /api/v1/no-such-endpoint/           401 404 404 404  403 403 403 404  401 401 401
GET    /metrics                            401 200 200 200  200 403 403 200  401 401 401
GET    /api/v1/workspaces/                 401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/workspaces/                 401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/workspaces/{ws}/members/    401 405 405 405  405 403 403 405  401 401 401
POST   /api/v1/workspaces/{ws}/members/    401 403 403 201  403 403 403 201  401 401 401
*      /api/v1/workspaces/{ws}/members/    401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/workspaces/{ws}/members/{member}/  401 405 405 405  405 403 403 405  401 401 401
DELETE /api/v1/workspaces/{ws}/members/{member}/  401 403 403 204  403 403 403 204  401 401 401
*      /api/v1/workspaces/{ws}/members/{member}/  401 405 405 405  403 403 403 405  401 401 401
GET    /api/v1/quotas/                     401 200 200 200  200 403 403 200  401 401 401
*      /api/v1/quotas/                     401 405 405 405  403 403 403 405  401 401 401
*      /metrics                            401 405 405 405  403 403 403 405  401 401 401
"""


@dataclass(frozen=True)
class Derived:
    """A column that answers like ``like`` except in the cells it names ("METHOD path": status)."""

    like: str
    make: Callable[[Any], Callable[[APIClient], None]]
    overrides: dict[str, int] = field(default_factory=dict)


def bearer(raw: str) -> Callable[[APIClient], None]:
    return lambda client: client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")


# New kinds of caller go here, one line each. "node" is the shared node token (opted in here);
# a node's own credential answers like it except that it may download only its own jobs' bundles.
ARCHIVE = "GET /api/v1/bundles/{sha}/archive/"


def session(user: Callable[[Any], User]) -> Callable[[Any], Callable[[APIClient], None]]:
    return lambda w: lambda client: client.force_login(user(w))


def outsider_cells() -> dict[str, int]:
    """Every cell of a job path that the operator does not get 405 for, and changing the
    workspace's members (which the operator may see, as an editor): 404."""
    listed = {}
    for line in MATRIX.strip().splitlines():
        method, path, *codes = line.split()
        listed[(method, path)] = int(codes[COLUMNS.index("oper")])
    cells = {
        "POST /api/v1/workspaces/{ws}/members/": 404,
        "DELETE /api/v1/workspaces/{ws}/members/{member}/": 404,
    }
    for (method, path), oper in listed.items():
        if "{job}" not in path or oper == 405:
            continue
        verbs = [method] if method != "*" else [m for m in METHODS if (m, path) not in listed]
        cells.update({f"{verb} {path}": 404 for verb in verbs})
    return cells


DERIVED: dict[str, Derived] = {
    "own_node": Derived("node", lambda w: bearer(w.node_secret), {ARCHIVE: 200}),
    "other_node": Derived("node", lambda w: bearer(w.other_node_secret), {ARCHIVE: 403}),
    "outsider": Derived("oper", session(lambda w: w.outsider), outsider_cells()),
}


def parse_matrix() -> dict[tuple[str, str], dict[str, int]]:
    listed: dict[tuple[str, str], dict[str, int]] = {}
    for line in MATRIX.strip().splitlines():
        method, path, *codes = line.split()
        assert len(codes) == len(COLUMNS), line
        listed[(method, path)] = dict(zip(COLUMNS, map(int, codes), strict=True))
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for path in sorted({p for _, p in listed}):
        for method in METHODS:
            cells = listed.get((method, path)) or listed.get(("*", path))
            assert cells is not None, f"no row for {method} {path} and no '*' row"
            cells = dict(cells)
            for name, column in DERIVED.items():
                cells[name] = column.overrides.get(f"{method} {path}", cells[column.like])
            rows[(method, path)] = cells
    return rows


ROWS = parse_matrix()


def small_archive() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        payload = b"print('hello')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    return data.getvalue()


class World:
    """The objects one row works on, and a way to sign in as each kind of caller."""

    def __init__(self, tmp_path: Path) -> None:
        operators = Group.objects.get_or_create(name="operator")[0]
        self.viewer = User.objects.create_user("m-viewer", password="pw-viewer-1")
        self.viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
        self.operator = User.objects.create_user("m-operator", password="pw-operator-1")
        self.operator.groups.add(operators)
        self.staff = User.objects.create_superuser("m-staff", password="pw-staff-1")
        self.raw: dict[str, str] = {}
        for scope in ("read", "jobs:write", "nodes:write", "admin"):
            self.raw[scope.split(":")[0]] = ApiToken.issue(self.staff, f"only-{scope}", [scope])[1]
        expired, self.raw["expired"] = ApiToken.issue(self.staff, "expired", ["read", "jobs:write", "admin"])
        ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
        revoked, self.raw["revoked"] = ApiToken.issue(self.staff, "revoked", ["read", "jobs:write", "admin"])
        revoked.revoke()
        self.probe_token = ApiToken.issue(self.staff, "probe", ["read"])[0]
        self.team = Workspace.objects.create(name="m-team")
        Membership.objects.create(workspace=self.team, user=self.viewer, role=Role.VIEWER)
        Membership.objects.create(workspace=self.team, user=self.operator, role=Role.EDITOR)
        self.outsider = User.objects.create_user("m-outsider", password="pw-outsider-1")
        self.outsider.groups.add(operators)
        User.objects.create_user("m-newcomer", password="pw-newcomer-1")
        self.job = Job.objects.create(
            name="m-job",
            workload="digits-mlp",
            min_nodes=1,
            max_nodes=2,
            desired_nodes=2,
            workspace=self.team,
        )
        self.node = Node.objects.create(name="m-node", state="ONLINE")
        self.sweep = Sweep.objects.create(
            name="m-sweep",
            owner=self.operator,
            spec={"workload": "digits-mlp"},
            space={"lr": [0.1]},
            objective="loss",
            max_trials=1,
        )
        self.bundle = store_bundle(SimpleUploadedFile("b.tar.gz", small_archive()), self.operator)
        # m-node runs a job of the bundle; m-other runs nothing.
        bundled = Job.objects.create(name="m-bundled", bundle=self.bundle, entrypoint="train.py")
        place = Round.objects.create(job=bundled, number=1, world_size=1, master_port=29500)
        Allocation.objects.create(round=place, node=self.node, node_rank=0, nproc=1)
        self.channel = Channel.objects.create(
            owner=self.staff, name="m-hook", kind="email", email="a@example.com"
        )
        self.rule = Rule.objects.create(
            owner=self.staff, name="m-rule", kind="event", event_kinds=["job.failed"]
        )
        self.alert = Alert.objects.create(
            rule=self.rule, key="m-key", subject="m", title="m", state="sent", happened_at=timezone.now()
        )
        self.node_secret = tokens.enrol(
            "m-node", tokens.issue_join_token(None, "m-node", node_name="m-node")[1]
        )[1]
        self.other_node_secret = tokens.enrol("m-other", tokens.issue_join_token(None, "m-other")[1])[1]

    def path(self, template: str) -> str:
        return template.format(
            job=self.job.pk,
            node=self.node.pk,
            bundle=self.bundle.pk,
            sha=self.bundle.sha256,
            token=self.probe_token.pk,
            sweep=self.sweep.pk,
            ws=self.team.name,
            member=self.viewer.username,
            alert=self.alert.pk,
            channel=self.channel.pk,
            rule=self.rule.pk,
        )

    def client_for(self, column: str) -> APIClient:
        client = APIClient()
        sessions = {"viewer": self.viewer, "oper": self.operator, "staff": self.staff}
        if column in sessions:
            client.force_login(sessions[column])
        elif column == "node":
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {NODE_TOKEN}")
        elif column in self.raw:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.raw[column]}")
        elif column in DERIVED:
            DERIVED[column].make(self)(client)
        return client


def body_for(method: str, path: str, world: World) -> dict[str, Any]:
    """A valid body, so that a caller who may do it gets the success status."""
    if method != "POST":
        return {}
    if path == "/api/v1/jobs/":
        return {"data": {"name": "m-new", "workload": "digits-mlp"}, "format": "json"}
    if path.endswith("/resize/"):
        return {"data": {"nodes": 1}, "format": "json"}
    if path == "/api/v1/sweeps/":
        sweep = {
            "name": "m-new",
            "job": {"workload": "digits-mlp"},
            "space": {"lr": [0.1]},
            "objective": "loss",
            "max_trials": 1,
        }
        return {"data": sweep, "format": "json"}
    if path.endswith("/members/"):
        return {"data": {"user": "m-newcomer", "role": "editor"}, "format": "json"}
    if path == "/api/v1/alerts/channels/":
        return {"data": {"name": "m-mail", "kind": "email", "email": "ops@example.com"}, "format": "json"}
    if path == "/api/v1/alerts/rules/":
        # a rule needs a channel of the caller's own, which no one body names: every caller allowed
        # to make one gets past authorization to the 400 that says so
        return {"data": {"name": "m-rule", "kind": "event", "event_kinds": ["job.failed"]}, "format": "json"}
    if path == "/api/v1/nodes/join-tokens/":
        return {"data": {"name": "m-join"}, "format": "json"}
    if path == "/api/v1/tokens/":
        return {"data": {"name": "m-new", "scopes": ["admin"]}, "format": "json"}
    if path == "/api/v1/auth/token/":
        return {
            "data": {"username": "m-staff", "password": "pw-staff-1", "name": "m-login"},
            "format": "json",
        }
    if path == "/api/v1/bundles/":
        upload = SimpleUploadedFile("new.tar.gz", small_archive() + b"", content_type="application/gzip")
        return {"data": {"file": upload}, "format": "multipart"}
    return {}


@pytest.fixture
def world(settings: Any, tmp_path: Path) -> World:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed, not security
    settings.BUNDLE_ROOT = tmp_path / "bundles"
    settings.NODE_TOKEN = NODE_TOKEN
    # The matrix presents wrong tokens hundreds of times from one address; lockout has its own test.
    settings.AXES_FAILURE_LIMIT = 1_000_000
    return World(tmp_path)


def test_the_matrix_covers_every_api_endpoint() -> None:
    """A new endpoint without rows fails here, not silently."""
    covered = {path for _, path in ROWS}

    def walk(resolver: URLResolver, prefix: str) -> list[str]:
        found = []
        for entry in resolver.url_patterns:
            if isinstance(entry, URLResolver):
                found += walk(entry, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern) and entry.name not in (None, "api-not-found"):
                found.append(entry.name)
        return found

    api = next(e for e in get_resolver().url_patterns if str(e.pattern) == "api/")
    assert isinstance(api, URLResolver)
    names = set(walk(api, "/api/"))
    # Each named API route is reached by some row (reverse the row's path and compare names).
    from django.urls import resolve

    reached = set()
    for path in covered:
        if path.startswith("/api/"):
            sample = path.format(
                job=1,
                node=1,
                bundle=1,
                sha="a" * 64,
                token=1,
                sweep=1,
                ws="w",
                member="u",
                alert=1,
                channel=1,
                rule=1,
            )
            reached.add(resolve(sample).url_name)
    assert names - reached == set()


PATHS = sorted({path for _, path in ROWS})


@pytest.mark.parametrize("path", PATHS)
def test_each_caller_gets_the_expected_status(world: World, path: str) -> None:
    """Given the objects of the path, when each caller calls each method, then each gets the
    status of its cell (and an API error is JSON)."""
    wrong = []
    for method in METHODS:
        expected = ROWS[(method, path)]
        got: dict[str, int] = {}
        for column in expected:
            with transaction.atomic():
                client = world.client_for(column)
                response = getattr(client, method.lower())(world.path(path), **body_for(method, path, world))
                got[column] = response.status_code
                if path.startswith("/api/") and response.status_code >= 400:
                    assert response["Content-Type"].startswith("application/json"), (method, column)
                transaction.set_rollback(True)
        wrong += [
            f"{method} {path} as {c}: expected {expected[c]}, got {got[c]}"
            for c in expected
            if got[c] != expected[c]
        ]
    assert wrong == []
