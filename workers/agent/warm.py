"""A warm rank interpreter: ``python -m workers.agent.warm``, started ahead of time by the
agent's warm pool (workers/agent/warmpool.py), becomes one rank process on request.

It imports torch (and torch.distributed, torch.nn, the DDP wrapper and the ``@record`` error
machinery) and then blocks reading ONE JSON line on stdin::

    {"mode": "script" | "module", "target": "train.py" | "pkg.mod", "args": [...],
     "cwd": "/dir" | null, "env": {...}, "stdout": "/path", "stderr": "/path"}

On that line it turns itself into what ``python train.py args`` (or ``python -m pkg.mod args``)
would have been, started with ``env`` in ``cwd`` with stdout/stderr on those files: stdin
becomes /dev/null, the files are dup2()ed onto fds 1 and 2, os.environ is replaced by ``env``
exactly, the working directory, sys.argv and sys.path[0] are set as the interpreter sets them,
OMP_NUM_THREADS is applied through torch.set_num_threads (OpenMP read the variable when torch
was imported), and the entrypoint runs through runpy as ``__main__``. Exceptions and SystemExit
are not caught here: they reach the interpreter, which prints the traceback / exits with the
code exactly as for a cold ``python train.py``. torch's ``@record`` reads
TORCHELASTIC_ERROR_FILE from os.environ when the exception happens, so it finds the rank's file.

On EOF (the agent closed the pipe, or died) it exits without running anything. Nothing here
initialises CUDA: CUDA_VISIBLE_DEVICES is read when the rank first touches CUDA.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
from typing import Any


def preload() -> None:
    """The imports that dominate a rank's start-up; their cost is paid before the launch."""
    import torch
    import torch.distributed
    import torch.distributed.elastic.multiprocessing.errors
    import torch.nn
    import torch.nn.parallel
    import torch.optim

    del torch


def redirect(fd: int, path: str) -> None:
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(opened, fd)
    finally:
        os.close(opened)


def retitle(argv: list[str]) -> None:
    """Shows the rank's command line in ps and /proc/<pid>/cmdline, as a cold rank's would be
    (operators and tools find ranks by their script). The pool starts this interpreter with a
    blank padding argument, so the title fits in argv's own memory and SPT_NOENV keeps
    setproctitle off the environment block, where the reaper looks for the session marker."""
    os.environ["SPT_NOENV"] = "1"
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(" ".join(argv))


def become_rank(request: dict[str, Any]) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.flush()
    sys.stderr.flush()
    redirect(1, request["stdout"])
    redirect(2, request["stderr"])
    if request.get("cwd"):
        os.chdir(request["cwd"])
    target = str(request["target"])
    args = [str(arg) for arg in request["args"]]
    script = request["mode"] == "script"
    retitle([sys.executable, target, *args] if script else [sys.executable, "-m", target, *args])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    # Directories that appeared after this interpreter started (a freshly extracted bundle)
    # must not be hidden by a stale import-system listing.
    importlib.invalidate_caches()
    if script:
        sys.argv = [target, *args]
        # As `python script.py`: the script's own directory (symlinks resolved) comes first.
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        runpy.run_path(target, run_name="__main__")
    else:
        sys.argv = ["-m", *args]
        # As `python -m module`: the working directory comes first; run_module sets argv[0].
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def main() -> None:
    preload()
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return
    become_rank(json.loads(line))


if __name__ == "__main__":
    main()
