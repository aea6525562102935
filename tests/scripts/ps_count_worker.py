"""A PS worker whose parameters count how often each gradient was applied.

Table ``examples`` has one row per example (``--dim`` wide) (initially 0) and the dense ``counter`` one
value (initially 0); each batch's loss is the sum of its examples' rows plus the counter, with SGD
at lr 1: every application of a batch's gradient lowers each of its rows by 1 (1/dim per element with --dim) and the counter by 1.
After E epochs with every gradient applied exactly once, every row is -E and the counter is
-(batches per epoch * E), whatever the bookkeeping claims.

Usage: ps_count_worker.py SUMMARY_JSON --examples N --shard-size S --batch-size B [--epochs E]
[--sleep SECONDS] [--hold FILE] [--dim D] ("{index}" in SUMMARY_JSON: the worker's index); SIGTERM leaves after the current batch (its shard goes
back to the queue). After the first push it writes SUMMARY_JSON.first (start and first-push times).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
from torch import nn

from workers import sdk


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("summary")
    parser.add_argument("--examples", type=int, required=True)
    parser.add_argument("--shard-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--dim", type=int, default=1, help="row width (the memory test uses wide rows)")
    parser.add_argument("--hold", help="while this file exists, wait before each batch")
    args = parser.parse_args()
    # Several workers of one console job share the argument: "{index}" is the worker's index.
    args.summary = args.summary.replace("{index}", os.environ.get("TRAINYARD_PS_INDEX", "0"))
    started = time.time()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))

    ps = sdk.ps.connect()
    rows = ps.embedding_bag("examples", dim=args.dim, optimizer=sdk.ps.SGD(lr=1.0), init_std=0.0, mode="sum")
    counter = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(counter.weight)
    ps.dense(counter, sdk.ps.SGD(lr=1.0))
    dataset = sdk.ps.Dataset(args.examples, args.shard_size, args.batch_size, args.epochs)
    for batch in ps.batches(dataset):
        while args.hold and os.path.exists(args.hold) and not stop:
            time.sleep(0.05)
        if stop:
            break
        with ps.step(batch):
            ids = torch.arange(batch.start, batch.end)
            loss = rows(ids[:, None]).sum() / args.dim + counter.weight.sum()
            loss.backward()
        if ps.pushes == 1:
            with open(args.summary + ".first", "w") as handle:
                json.dump(
                    {"started_at": started, "first_push_at": ps.first_push_at, "pid": os.getpid()}, handle
                )
        if args.sleep:
            time.sleep(args.sleep)
        if stop:
            break
    ps.close()
    summary = {
        "worker": ps.worker,
        "pushes": ps.pushes,
        "examples": ps.examples,
        "duplicates": ps.duplicates,
        "started_at": started,
        "first_push_at": ps.first_push_at,
        "left_early": bool(stop),
    }
    with open(args.summary, "w") as handle:
        json.dump(summary, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
