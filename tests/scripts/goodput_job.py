"""A scripted SDK job whose badput is known, for goodput's tests and bench/ops.

Each step sleeps ``--sleep`` seconds inside ``sdk.step`` and ``--data-wait`` outside it (the SDK
counts that as a data wait); rank 0 logs the loss and saves a checkpoint every ``--checkpoint-every``
steps (``sdk.save``: its blocking time is recorded) and every rank resumes from the latest one.
``--fail-at-step S`` makes rank 0 exit 1 at step S on the first attempt only
(TORCHELASTIC_RESTART_COUNT == "0"), so the steps since the checkpoint are redone.

    python tests/scripts/goodput_job.py --steps 60 --sleep 0.1 --data-wait 0.02 --fail-at-step 35
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from workers import sdk


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sleep", type=float, default=0.1)
    parser.add_argument("--data-wait", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--fail-at-step", type=int, default=0)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    sdk.progress(args.steps)
    sdk.install_stop_handler()
    resumed = sdk.load_latest()
    start = resumed[1] if resumed is not None else 0
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.data_wait)
        with sdk.step(step, samples=32):
            time.sleep(args.sleep)
        if rank == 0:
            sdk.log(step, loss=1.0 / step)
        if first_attempt and rank == 0 and step == args.fail_at_step:
            sdk.flush()
            print(f"failing at step {step}", flush=True)
            return 1
        stop = sdk.stop_requested()
        if rank == 0 and (stop or step % args.checkpoint_every == 0):
            sdk.save({"step": step}, step)
        if stop:
            break
    sdk.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
