"""A warm interpreter handed its launch the instant it was started (the pool gives out one it has
only just started when none is ready) runs the rank at the rank's priority, not at the imports'
nice 19: the launch signal can come before the interpreter has a handler for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from workers.agent.warm import IMPORT_NICENESS
from workers.agent.warmpool import TITLE_PADDING, send_request, warm_request

PROBE = """
import json, os, sys
from workers.agent.warm import read_autogroup_nice
with open(sys.argv[1], "w") as fh:
    json.dump({"nice": os.getpriority(os.PRIO_PROCESS, 0), "autogroup_nice": read_autogroup_nice()}, fh)
"""


def test_a_warm_process_launched_as_it_starts_runs_at_the_ranks_priority(tmp_path: Path) -> None:
    # Given a warm interpreter that has only just been started (no signal handler yet)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = tmp_path / "priority.json"
    warm = subprocess.Popen(
        [sys.executable, "-m", "workers.agent.warm", TITLE_PADDING],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # When it is handed a launch right away, as the pool does with the process it just started
        request = warm_request(
            sys.executable,
            (str(script), str(out)),
            tmp_path,
            dict(os.environ),
            tmp_path / "stdout.log",
            tmp_path / "stderr.log",
        )
        assert request is not None
        send_request(warm, request)
        assert warm.wait(60) == 0, (tmp_path / "stderr.log").read_text()
    finally:
        if warm.poll() is None:
            warm.kill()
            warm.wait()
        for pipe in (warm.stdin, warm.stdout):
            if pipe is not None:
                pipe.close()

    # Then the rank ran at this process's priority, its autogroup's too, not at the imports'
    seen = json.loads(out.read_text())
    assert seen["nice"] == os.getpriority(os.PRIO_PROCESS, 0) != IMPORT_NICENESS
    if seen["autogroup_nice"] is not None:
        # Its session's autogroup started at nice 0, where the imports must have left it.
        assert seen["autogroup_nice"] == 0
