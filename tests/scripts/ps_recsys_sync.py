"""recsys-embedding's PS worker that also records which batches each synchronous step held.

Usage: ps_recsys_sync.py RECORD_JSON HYPERPARAMETERS_JSON (under the PS environment contract).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from workers.workloads.common import load_hyperparameters, start_runtime
from workers.workloads.recsys import train_ps


def main() -> int:
    record: list[list[int]] = []

    def on_batch(session: Any, batch: Any) -> None:
        record.append([session.step_info.step, batch.start, batch.end])

    hp = load_hyperparameters("recsys-embedding", json.loads(sys.argv[2]))
    train_ps(hp, start_runtime("fp32", 1), on_batch)
    with open(sys.argv[1], "w") as handle:
        json.dump(record, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
