"""``python -m workers.workloads <name> [--set key=value ...] [--precision P] [--grad-accum-steps N]``

Run under torchrun's environment contract (or alone as one process). Hyperparameters come from
TRAINYARD_HYPERPARAMETERS (JSON) with ``--set`` on top; precision from TRAINYARD_PRECISION and
gradient accumulation from TRAINYARD_GRAD_ACCUM_STEPS unless the flags say otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from workers import protocol
from workers.workloads.catalog import PRECISIONS, WORKLOADS, parse_overrides

if TYPE_CHECKING:
    from workers.workloads.common import Runtime, Task


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.workloads", description=__doc__)
    parser.add_argument("name", nargs="?", choices=sorted(WORKLOADS), help="workload to run")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--precision", choices=PRECISIONS)
    parser.add_argument("--grad-accum-steps", type=int)
    parser.add_argument("--list", action="store_true", help="print the workloads and their hyperparameters")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list or not args.name:
        for info in WORKLOADS.values():
            print(f"{info.name}: {info.description}")
            for key, spec in info.hyperparameters.items():
                print(f"    {key} ({spec.type.__name__}, default {spec.default!r}): {spec.help}")
        return 0 if args.list else 2

    from workers.workloads.common import WorkloadError, load_hyperparameters, shutdown, start_runtime

    try:
        hp = load_hyperparameters(args.name, parse_overrides(args.name, args.overrides))
        runtime = start_runtime(args.precision, args.grad_accum_steps)
    except (WorkloadError, ValueError) as error:
        print(f"{args.name}: {error}", file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.errors import record

    # record: an exception is written to TORCHELASTIC_ERROR_FILE (when the launcher sets one),
    # so the console can show the real error rather than the last lines of stderr.
    try:
        record(_run)(args.name, hp, runtime)
    except WorkloadError as error:
        print(f"{args.name}: {error}", file=sys.stderr)
        return 2
    finally:
        shutdown()
    return 0


def _run(name: str, hp: dict[str, Any], runtime: Runtime) -> None:
    from workers.workloads.common import WorkloadError, train

    if os.environ.get(protocol.ENV_STRATEGY) == "parameter_server":
        if name != "recsys-embedding":
            raise WorkloadError(f"{name} has no parameter_server version; recsys-embedding has")
        from workers.workloads.recsys import train_ps

        train_ps(hp, runtime)
        return
    train(_task(name, hp, runtime), hp, runtime)


def _task(name: str, hp: dict[str, Any], runtime: Runtime) -> Task:
    if name == "digits-mlp":
        from workers.workloads.digits import DigitsTask

        return DigitsTask(hp, runtime)
    if name == "recsys-embedding":
        from workers.workloads.recsys import RecsysTask

        return RecsysTask(hp, runtime)
    from workers.workloads.tiny_lm import TinyLMTask

    return TinyLMTask(hp, runtime)


if __name__ == "__main__":
    sys.exit(main())
