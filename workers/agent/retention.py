"""How long a host keeps the files of past rounds (``<data-dir>/rounds/job-J/round-R/rank-K``:
stdout, stderr, error file, telemetry). They are a local copy: logs and telemetry were shipped to
the console as they were written. Without a limit they grow with every round of every job.

A round's directory goes once nothing in it has changed for ``--keep-rounds-days`` (default 7;
0 keeps everything), unless the round is one the agent still holds (running, pending, or the
last one to end for its job, whose files the heartbeat's progress and a redelivered command may
still need). The agent prunes when it starts and whenever a round ends, off the supervision
thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_KEEP_ROUNDS_DAYS = 7.0
_JOB_DIR = re.compile(r"job-(\d+)")
_ROUND_DIR = re.compile(r"round-(\d+)")


def newest_change(directory: Path) -> float:
    """The latest mtime of the directory and everything under it (a round is three levels)."""
    newest = 0.0
    for root, dirs, files in os.walk(directory):
        for name in (root, *(os.path.join(root, entry) for entry in (*dirs, *files))):
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(name, follow_symlinks=False).st_mtime)
    return newest


def prune_rounds(rounds_dir: Path, keep_days: float, held: Iterable[tuple[int, int]]) -> list[Path]:
    """Removes the round directories under ``rounds_dir`` unchanged for ``keep_days`` and not in
    ``held`` ((job_id, round) pairs), then job directories left empty. Returns what it removed."""
    if keep_days <= 0 or not rounds_dir.is_dir():
        return []
    held = set(held)
    held_jobs = {job_id for job_id, _ in held}
    cutoff = time.time() - keep_days * 86_400
    removed = []
    for job_dir in rounds_dir.iterdir():
        job = _JOB_DIR.fullmatch(job_dir.name)
        if job is None or not job_dir.is_dir():
            continue
        for round_dir in job_dir.iterdir():
            number = _ROUND_DIR.fullmatch(round_dir.name)
            if number is None or (int(job.group(1)), int(number.group(1))) in held:
                continue
            if newest_change(round_dir) < cutoff:
                shutil.rmtree(round_dir, ignore_errors=True)
                removed.append(round_dir)
        if int(job.group(1)) not in held_jobs:
            with contextlib.suppress(OSError):
                job_dir.rmdir()  # only when empty (RankFiles.prepare copes with losing that race)
    if removed:
        logger.info("removed %d round directories unchanged for %g days", len(removed), keep_days)
    return removed
