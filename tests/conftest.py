from __future__ import annotations

import os
import secrets
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from tests.support import procs


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM tears fixtures down as Ctrl-C does (pytest's default SIGTERM ends it at once,
    # leaving every process a fixture started running).
    procs.unwind_on_signals()
    # The suite's agents and controllers use the shared node token (the single-machine opt-in,
    # console/cluster/tokens.py) unless a test enrols them; tests/test_node_credentials.py turns it off.
    from django.conf import settings
    from django.test.signals import setting_changed

    # Passwords hashed in this process take 1,000 PBKDF2 iterations, not 1,000,000 (the same
    # algorithm: the console's processes verify them as they are; tests/support/hashers.py).
    settings.PASSWORD_HASHERS = [
        "tests.support.hashers.QuickPBKDF2PasswordHasher",
        *[h for h in settings.PASSWORD_HASHERS if not h.endswith(".PBKDF2PasswordHasher")],
    ]
    setting_changed.send(None, setting="PASSWORD_HASHERS", value=settings.PASSWORD_HASHERS, enter=True)

    # WhiteNoise walks every static directory (the admin's, ReDoc's, the console's) each time a
    # handler loads its middleware, and the test client loads it once per Client: 45 ms a client,
    # minutes over the suite. The suite's own processes (Daphne) serve from the finders as the
    # console does; tests/test_web.py turns them back on where it fetches static files in-process.
    settings.WHITENOISE_USE_FINDERS = False

    if not settings.NODE_TOKEN:
        settings.NODE_TOKEN = os.environ["TRAINYARD_NODE_TOKEN"] = secrets.token_urlsafe(32)
    # Agents the suite starts verify commands with the console's key (workers/signing.py): the
    # controllers it starts read the same key file (settings.COMMAND_KEY_FILE), and so does
    # tests/support/agents.py's ControlQueue, which plays the controller.
    from console.core.transport import command_signer

    os.environ.setdefault("TRAINYARD_COMMAND_KEY_FILE", str(settings.COMMAND_KEY_FILE))
    os.environ.setdefault("TRAINYARD_CONSOLE_KEY", command_signer().public_key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """bin/test runs the suite in two phases: TRAINYARD_TEST_PHASE=parallel (on pytest-xdist
    workers) leaves out the tests marked ``alone``, and TRAINYARD_TEST_PHASE=alone runs only them,
    in one process. Without the variable every test runs."""
    phase = os.environ.get("TRAINYARD_TEST_PHASE", "")
    if phase not in ("parallel", "alone"):
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        alone = item.get_closest_marker("alone") is not None
        (keep if alone == (phase == "alone") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


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
from tests.support.decisions import decide  # noqa: E402, F401  (fixture: in-process decisions)
from tests.support.live import live_console  # noqa: E402, F401  (fixture: console + controller + ingest)
from tests.support.ps import ps_job  # noqa: E402, F401  (fixture: PS-job processes on localhost)
from tests.support.telemetry import stream  # noqa: E402, F401  (fixture: the emptied telemetry stream)
from tests.support.up import consoles  # noqa: E402, F401  (fixture: `manage.py up` consoles)
from tests.support.web import console_url  # noqa: E402, F401  (fixture: the console over HTTP)


@pytest.fixture(autouse=True)
def _fresh_connections(django_db_blocker: Any) -> None:
    """Every test starts on connections that answer, as every request does in the console.

    Django health-checks a connection before reuse once close_old_connections() has run, which
    the console's request and websocket paths do. Channels' test communicator turns that off
    (channels/testing/application.py patches it to a no-op), so the connection of asgiref's
    sync thread, which the websocket tests' database calls share, would stay dead after a test
    that cuts every backend (tests/test_db_wait.py, tests/test_ingest_faults.py) and fail the
    next websocket test. Run it here, on that thread (not on the test's own: its connection is
    inside the test's transaction).

    Likewise each test gets channel layers of its own: a layer keeps asyncio locks per channel,
    bound to the event loop of the test that made them (each websocket test runs its own loop).
    """
    from asgiref.sync import SyncToAsync
    from channels.layers import channel_layers
    from django.db import close_old_connections

    channel_layers.backends = {}
    with django_db_blocker.unblock():  # (a test without the database may hold a connection)
        SyncToAsync.single_thread_executor.submit(close_old_connections).result(timeout=30)
