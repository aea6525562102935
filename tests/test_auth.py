"""Anonymous users are refused everywhere; roles decide who may change jobs; createadmin."""

from __future__ import annotations

import re
from collections.abc import Iterator
from io import StringIO

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from console.jobs.models import Job

pytestmark = pytest.mark.django_db

# Public on purpose: signing in (the form, and the API's password-for-token exchange) and
# resetting a forgotten password.
# Enrolment's proof is the join token in its body (tests/test_node_credentials.py refuses bad ones).
PUBLIC_PREFIXES = ("accounts/", "api/v1/auth/", "api/v1/nodes/enroll/")
# The admin has its own login and is covered by test_admin.py.
OWN_LOGIN_PREFIXES = ("admin/",)


_CANDIDATES = ("1", "json", "x", "a" * 64, "0" * 32)


def _fill(name: str, group: str) -> str:
    """A value the group's own pattern accepts, so the request reaches the view."""
    for candidate in (*_CANDIDATES, group.split("|")[0]):
        if re.fullmatch(group, candidate):
            return candidate
    raise AssertionError(f"no sample value for URL group {name!r} ({group})")


def _sample(regex: str) -> str:
    """A concrete path for a URL regex: every named group filled with a value it accepts."""
    out, i = [], 0
    while i < len(regex):
        if regex.startswith("(?P<", i):
            close = regex.index(">", i)
            name = regex[i + 4 : close]
            depth, j = 0, i
            while True:
                if regex[j] == "\\":
                    j += 2
                    continue
                depth += {"(": 1, ")": -1}.get(regex[j], 0)
                j += 1
                if depth == 0:
                    break
            out.append(_fill(name, regex[close + 1 : j - 1]))
            i = j
        elif regex[i] == "\\":
            out.append(regex[i + 1])
            i += 2
        else:
            out.append(regex[i])
            i += 1
    return "".join(out).lstrip("^").rstrip("$").replace("/?", "/")


def _route_sample(route: str) -> str:
    return re.sub(r"<(?:(\w+):)?(\w+)>", lambda m: "1" if m.group(1) in (None, "int") else "x", route)


def every_url(resolver: URLResolver | None = None, prefix: str = "") -> Iterator[str]:
    for entry in (resolver or get_resolver()).url_patterns:
        pattern = entry.pattern
        raw = str(pattern)
        part = _route_sample(raw) if hasattr(pattern, "_route") else _sample(raw)
        if isinstance(entry, URLResolver):
            yield from every_url(entry, prefix + part)
        elif isinstance(entry, URLPattern):
            yield prefix + part


def guarded_urls() -> list[str]:
    urls = sorted({u for u in every_url() if not u.startswith(PUBLIC_PREFIXES + OWN_LOGIN_PREFIXES)})
    return ["/" + u for u in urls]


def test_the_url_walk_finds_pages_and_api_endpoints() -> None:
    urls = guarded_urls()
    assert "/" in urls
    assert "/jobs/1/" in urls
    assert "/api/schema/" in urls
    assert any(u.startswith("/api/v1/jobs/") for u in urls)
    assert "/api/v1/bundles/" + "a" * 64 + "/archive/" in urls


@pytest.mark.parametrize("method", ["get", "post"])
def test_anonymous_users_are_refused_everywhere(client: Client, method: str) -> None:
    Job.objects.create(pk=1, name="j", workload="mlp")
    allowed = []
    for url in guarded_urls():
        response = getattr(client, method)(url)
        if url.startswith("/api/"):
            if response.status_code not in (401, 403):
                allowed.append((url, response.status_code))
        elif response.status_code not in (401, 403) and not (
            # Pages send people to the login form; machine endpoints (/metrics) answer 401.
            response.status_code == 302 and response["Location"].startswith("/accounts/login/")
        ):
            allowed.append((url, response.status_code))
    assert allowed == []


def test_api_refusal_says_why(client: Client) -> None:
    response = client.get("/api/v1/jobs/")
    assert response.status_code in (401, 403)
    assert "credentials" in response.json()["detail"].lower()


def test_viewer_cannot_submit_from_the_page_or_the_api(client: Client, viewer: User) -> None:
    client.force_login(viewer)
    assert client.get("/jobs/new/").status_code == 403
    response = client.post("/api/v1/jobs/", {"name": "x", "workload": "mlp"}, content_type="application/json")
    assert response.status_code == 403
    assert Job.objects.count() == 0


def test_viewer_cannot_stop_a_job_through_the_api(client: Client, viewer: User) -> None:
    job = Job.objects.create(name="j", workload="mlp")
    client.force_login(viewer)
    assert client.post(f"/api/v1/jobs/{job.pk}/stop/").status_code == 403
    job.refresh_from_db()
    assert job.state == "PENDING"


def test_roles_exist_after_migrate() -> None:
    assert set(Group.objects.filter(name__in=["operator", "viewer"]).values_list("name", flat=True)) == {
        "operator",
        "viewer",
    }


def test_roles_and_the_default_workspace_come_back_after_a_flush(staff: User) -> None:
    """What `manage.py flush` (and a transactional test's teardown) leaves: no rows, and the
    post_migrate signal. The role groups and the default workspace are made again on that signal,
    so a site admin's roles include the default workspace."""
    from django.core.management.sql import emit_post_migrate_signal

    from console.teams import access
    from console.teams.models import DEFAULT_WORKSPACE, Workspace

    Group.objects.all().delete()
    Workspace.objects.all().delete()
    emit_post_migrate_signal(verbosity=0, interactive=False, db="default")
    assert set(Group.objects.values_list("name", flat=True)) >= {"operator", "viewer"}
    default = access.roles(staff)
    assert list(default) == [Workspace.objects.get(name=DEFAULT_WORKSPACE).pk]
    assert access.editable_workspaces(staff) == list(default)


def test_createadmin_generates_a_password_once_and_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINYARD_ADMIN_PASSWORD", raising=False)
    out = StringIO()
    call_command("createadmin", stdout=out)
    match = re.search(r"username=admin password=(\S+)", out.getvalue())
    assert match, out.getvalue()
    admin = User.objects.get(username="admin")
    assert admin.is_staff and admin.is_superuser
    assert admin.check_password(match.group(1))
    assert admin.groups.filter(name="operator").exists()

    again = StringIO()
    call_command("createadmin", stdout=again)
    assert "already exists" in again.getvalue()
    assert "password=" not in again.getvalue()
    admin.refresh_from_db()
    assert admin.check_password(match.group(1))
    assert User.objects.filter(username="admin").count() == 1


def test_createadmin_takes_username_and_password(monkeypatch: pytest.MonkeyPatch) -> None:
    out = StringIO()
    call_command("createadmin", "--username", "root", "--password", "s3cret-pass", stdout=out)
    assert "s3cret-pass" not in out.getvalue()
    assert User.objects.get(username="root").check_password("s3cret-pass")

    monkeypatch.setenv("TRAINYARD_ADMIN_PASSWORD", "from-env-pass")
    call_command("createadmin", "--username", "envadmin", stdout=StringIO())
    assert User.objects.get(username="envadmin").check_password("from-env-pass")


def test_login_page_signs_in_and_out(client: Client, operator: User) -> None:
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    response = client.post("/accounts/login/", {"username": "olivia", "password": "pw-operator-1"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200
    bad = Client().post("/accounts/login/", {"username": "olivia", "password": "wrong"})
    assert "Wrong username or password" in bad.content.decode()
    client.post("/accounts/logout/")
    assert client.get("/").status_code == 302
