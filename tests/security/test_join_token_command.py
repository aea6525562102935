"""The compose file's agent enrols with a join token `manage.py jointoken` prints, not with the
shared node token (which speaks for any node)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from console.cluster import tokens
from console.core.models import AuditEntry

pytestmark = pytest.mark.django_db


def test_jointoken_prints_a_token_that_enrols_only_its_node_once() -> None:
    out = StringIO()
    call_command("jointoken", node="gpu-1", hours=1, stdout=out)
    raw = out.getvalue().strip()
    assert raw.startswith(tokens.JOIN_TOKEN_PREFIX)
    with pytest.raises(tokens.EnrolmentRefused, match="for node 'gpu-1' only"):
        tokens.enrol("gpu-2", raw)
    credential, secret = tokens.enrol("gpu-1", raw)
    assert credential.node_name == "gpu-1" and secret
    with pytest.raises(tokens.EnrolmentRefused, match="already used"):
        tokens.enrol("gpu-1", raw)
    assert AuditEntry.objects.filter(action="node.join_token_created").count() == 1
