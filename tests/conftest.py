from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User


@pytest.fixture
def operator(db: None) -> User:
    user = User.objects.create_user("olivia", password="pw-operator-1")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    return user


@pytest.fixture
def viewer(db: None) -> User:
    user = User.objects.create_user("victor", password="pw-viewer-1")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    return user


@pytest.fixture
def staff(db: None) -> User:
    return User.objects.create_superuser("ada", password="pw-admin-1")


from tests.support.cluster import cluster  # noqa: E402, F401  (fixture for end-to-end tests)
from tests.support.ps import ps_job  # noqa: E402, F401  (fixture: PS-job processes on localhost)
from tests.support.web import console_url  # noqa: E402, F401  (fixture: the console over HTTP)
