"""bin/test's workers each get a Redis database of their own (tests/support/xdist_env.py)."""

from __future__ import annotations

import pytest

from tests.support.xdist_env import redis_url_for


def test_each_worker_moves_the_database_number_up() -> None:
    assert redis_url_for("redis://127.0.0.1:6379/9", 0) == "redis://127.0.0.1:6379/9"
    assert redis_url_for("redis://127.0.0.1:6379/9", 1) == "redis://127.0.0.1:6379/10"
    assert redis_url_for("redis://:pw@127.0.0.1:6379", 1) == "redis://:pw@127.0.0.1:6379/1"
    assert redis_url_for("rediss://h:6380/2?ssl_cert_reqs=none", 1) == "rediss://h:6380/3?ssl_cert_reqs=none"


def test_a_url_it_cannot_move_is_refused() -> None:
    with pytest.raises(ValueError, match="not a redis:// URL"):
        redis_url_for("unix:///run/redis.sock", 1)
    with pytest.raises(ValueError, match="database 16"):
        redis_url_for("redis://127.0.0.1:6379/15", 1)
