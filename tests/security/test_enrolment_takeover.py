"""Attack: a join token made with only a name (no node) enrols as a node that is already enrolled,
to replace its credential and speak for it. Refused; the real node keeps its credential; the
refusal is in the audit log. A password change is in the audit log too."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from console.cluster import tokens
from console.cluster.models import Node, NodeCredential
from console.core.models import AuditEntry
from tests.support.reports import sealed
from workers import protocol

pytestmark = pytest.mark.django_db


def speaks_for(secret: str, node: str) -> bool:
    """A report sealed with ``secret`` and claiming ``node`` is accepted (console/cluster/tokens.py)."""
    task = protocol.CONTROL_OFFLINE
    return tokens.agent_authorised(task, sealed(secret, task, node=node, session="s"))


@pytest.fixture(autouse=True)
def no_shared_token(settings: Any) -> None:
    settings.NODE_TOKEN = ""
    settings.AXES_FAILURE_LIMIT = 1_000_000


def test_a_token_naming_no_node_cannot_take_over_an_enrolled_node() -> None:
    _, named = tokens.issue_join_token(None, "for tyh1", node_name="tyh1")
    real_secret = tokens.enrol("tyh1", named)[1]
    _, anyone = tokens.issue_join_token(None, "just a name")

    answer = APIClient().post("/api/v1/nodes/enroll/", {"name": "tyh1", "join_token": anyone}, format="json")

    assert answer.status_code == 403, answer.content
    assert "only a join token made for that node name" in answer.json()["detail"]
    assert speaks_for(real_secret, "tyh1"), "the real node keeps speaking for itself"
    assert NodeCredential.objects.get(node_name="tyh1").secret_hash == tokens.hash_secret(real_secret)
    refused = AuditEntry.objects.get(action="node.enrol_failed")
    assert refused.actor_name == "node:tyh1" and refused.data["join_token"] == anyone[:10]
    # The token is not spent by the refusal: it still enrols a new host.
    assert tokens.enrol("tyh9", anyone)[0].node_name == "tyh9"


def test_a_node_known_without_a_credential_is_not_taken_over_either() -> None:
    Node.objects.create(name="local", state="ONLINE")  # speaks with the shared token (bin/run)
    _, anyone = tokens.issue_join_token(None, "just a name")
    with pytest.raises(tokens.EnrolmentRefused, match="already known"):
        tokens.enrol("local", anyone)
    assert not NodeCredential.objects.filter(node_name="local").exists()


def test_a_token_made_for_the_node_replaces_its_credential() -> None:
    old = tokens.enrol("tyh1", tokens.issue_join_token(None, "first", node_name="tyh1")[1])[1]
    new = tokens.enrol("tyh1", tokens.issue_join_token(None, "again", node_name="tyh1")[1])[1]
    assert speaks_for(new, "tyh1") and not speaks_for(old, "tyh1")


def test_every_failed_enrolment_is_audited() -> None:
    answer = APIClient().post(
        "/api/v1/nodes/enroll/", {"name": "n1", "join_token": "tyj_guess"}, format="json"
    )
    assert answer.status_code == 403
    entry = AuditEntry.objects.get(action="node.enrol_failed")
    assert entry.data["reason"] == "Unknown join token." and entry.actor_name == "node:n1"


def test_password_changes_are_audited(operator: User, staff: User) -> None:
    browser = Client()
    browser.force_login(operator)
    changed = browser.post(
        "/accounts/password_change/",
        {"old_password": "pw-operator-1", "new_password1": "N3w-pass-123", "new_password2": "N3w-pass-123"},
    )
    assert changed.status_code == 302, changed.content[:500]
    own = AuditEntry.objects.get(action="auth.password_changed")
    assert own.actor == operator and own.data == {"user": "olivia", "by_self": True}
    assert own.auth_method == "session"

    admin = Client()
    admin.force_login(staff)
    reset = admin.post(
        f"/admin/auth/user/{operator.pk}/password/",
        {"password1": "An0ther-pass-1", "password2": "An0ther-pass-1", "usable_password": "true"},
    )
    assert reset.status_code == 302, reset.content[:500]
    by_admin = AuditEntry.objects.filter(action="auth.password_changed").latest("id")
    assert by_admin.actor == staff and by_admin.data == {"user": "olivia", "by_self": False}
    # Other edits of a user are not password changes.
    operator.refresh_from_db()
    operator.first_name = "Olivia"
    operator.save()
    assert AuditEntry.objects.filter(action="auth.password_changed").count() == 2
