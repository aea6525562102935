"""An SDK script on the in-place path that records what each step saw, for counting.

    TRAINYARD_CONTROL=/tmp/c0.json python tests/scripts/elastic_count.py --record /tmp/r0.jsonl

Trains a small MLP with ``sdk.elastic`` over a data set whose examples carry their index. Before
each step every rank appends one JSON line to ``--record``: pid, round, rank, world, step, the
example indices of its batch and a SHA-1 of its parameters (so a newcomer's parameters can be
compared with a survivor's at the same step); and once per process, when it has first formed, a
``started`` line with ``phases``: when main began, when the optimizer was built (its first call
imports torch._dynamo) and when the SDK had formed. It ends after ``--epochs`` epochs, or when the SDK
says this rank left; a failed re-form exits 3. ``--break-join FILE``: the one process that removes
FILE at its start builds a wider model, so its re-form fails when it loads a survivor's state.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from typing import Any, TextIO

import torch
from torch import nn

from workers.sdk.elastic import elastic
from workers.sdk.elastic_control import ElasticError

FEATURES = 8


class Indexed:
    def __init__(self, size: int) -> None:
        self.size = size
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, FEATURES, generator=generator)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": index, "x": self.x[index]}


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha1()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def main() -> int:
    phases = {"main": time.time()}  # when each phase of this process's start ended
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", required=True)
    parser.add_argument("--examples", type=int, default=240)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--form-timeout", type=float, default=20.0)
    parser.add_argument("--collective-timeout", type=float, default=5.0)
    parser.add_argument("--fast-file", default="", help="no more --step-sleep once this file exists")
    parser.add_argument("--break-join", default="", help="the process that removes this file cannot join")
    args = parser.parse_args()

    hidden = 16
    if args.break_join:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.break_join)
            hidden += 1  # only the process that removed the file gets here
    torch.manual_seed(os.getpid())  # every process starts from different weights: the SDK must align them
    model = nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)  # imports torch._dynamo
    phases["optimizer"] = time.time()
    data = Indexed(args.examples)
    with open(args.record, "a", buffering=1) as record:
        return train(args, model, optimizer, data, record, phases)


def train(
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Indexed,
    record: TextIO,
    phases: dict[str, float],
) -> int:
    try:
        with elastic(
            model, optimizer, form_timeout=args.form_timeout, collective_timeout=args.collective_timeout
        ) as run:
            phases["formed"] = time.time()
            # no "world"/"round"/"step" keys: readers that count steps skip this line
            record.write(
                json.dumps({"started": True, "pid": os.getpid(), "joined": run.joined, "phases": phases})
                + "\n"
            )
            for batch in run.batches(data, batch_size=args.batch_size, epochs=args.epochs):
                indices = [] if batch is None else [int(i) for i in batch["index"]]
                line = {
                    "pid": os.getpid(),
                    "round": run.round,
                    "rank": run.rank,
                    "world": run.world_size,
                    "step": run.step,
                    "epoch": run.epoch,
                    "indices": indices,
                    "checksum": checksum(model),
                    "t": time.time(),
                }
                record.write(json.dumps(line) + "\n")
                if not (args.fast_file and os.path.exists(args.fast_file)):
                    time.sleep(args.step_sleep)  # before the step's all-reduce: a peer killed now breaks it
                x = batch["x"] if batch is not None else torch.zeros(0, FEATURES)
                loss = run.model(x).pow(2).sum()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    except ElasticError as error:
        print(f"elastic: {error}", file=sys.stderr)
        return 3
    record.write(
        json.dumps(
            {
                "pid": os.getpid(),
                "end": True,
                "left": run.left,
                "stopped": run.stopped,
                "step": run.step,
                "recoveries": run.recoveries,
            }
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
