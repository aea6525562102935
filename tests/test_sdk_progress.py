"""sdk.progress(total): a script's own step total reaches the console as the total_steps metric,
which the job page reads for its progress bar and ETA (console/web/job_page.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workers import sdk

REPO = Path(__file__).resolve().parent.parent


def test_progress_is_recorded_as_the_total_steps_metric(tmp_path: Path) -> None:
    # Given a script that announces its total inside the console (the agent sets TRAINYARD_TELEMETRY)
    script = textwrap.dedent(
        """
        from workers import sdk
        sdk.progress(1200)
        sdk.log(1, loss=0.5)
        """
    )
    path = tmp_path / "telemetry-{rank}.jsonl"
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env = {**base, "TRAINYARD_TELEMETRY": str(path), "RANK": "0"}
    # When it runs to the end
    subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, timeout=120)
    # Then its telemetry holds the total as a metric, before the first step's values
    records = [json.loads(line) for line in (tmp_path / "telemetry-0.jsonl").read_text().splitlines()]
    metrics = [r for r in records if r["kind"] == "metric"]
    assert metrics[0]["values"] == {"total_steps": 1200}
    assert metrics[1]["values"] == {"loss": 0.5}


@pytest.mark.parametrize("bad", [0, -5, 2.5, "300", True])
def test_progress_refuses_a_total_that_is_not_a_positive_whole_number(bad: object) -> None:
    with pytest.raises(ValueError, match="positive whole number"):
        sdk.progress(bad)  # type: ignore[arg-type]
