"""A bench on bench/harness.py, for tests/test_processes_stop.py: a database of its own, a private
Redis, Daphne and an agent-like process whose "rank" runs in a session of its own. It prints
``ready`` once all run, then waits to be signalled.

    python tests/scripts/harness_like.py DATABASE_NAME
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from tests.scripts.bench_like import AGENT, wait_for_ranks  # noqa: E402


def main(database: str) -> None:
    with harness.Bench("harness-test", database=database, redis="private", django=False) as bench:
        bench.console.start_web()
        bench.console.spawn([sys.executable, "-c", AGENT], "agent.log")
        wait_for_ranks(1)
        print("ready", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    harness.run(main, sys.argv[1])
