"""A warm rank interpreter: ``python -m workers.agent.warm``, started ahead of time by the
agent's warm pool (workers/agent/warmpool.py), becomes one rank process on request.

It imports torch (and torch.distributed, torch.nn, the DDP wrapper, torch._dynamo and the
``@record`` error machinery; see :func:`preload`) and then blocks reading ONE JSON line on stdin::

    {"mode": "script" | "module", "target": "train.py" | "pkg.mod", "args": [...],
     "cwd": "/dir" | null, "env": {...}, "stdout": "/path", "stderr": "/path"}

On that line it turns itself into what ``python train.py args`` (or ``python -m pkg.mod args``)
would have been, started with ``env`` in ``cwd`` with stdout/stderr on those files: stdin
becomes /dev/null, the files are dup2()ed onto fds 1 and 2, os.environ is replaced by ``env``
exactly, the working directory, sys.argv and sys.path[0] are set as the interpreter sets them,
OMP_NUM_THREADS is applied through torch.set_num_threads (OpenMP read the variable when torch
was imported), and the entrypoint runs as ``__main__`` through runner.run, as a cold rank's does.
Exceptions and SystemExit reach the interpreter, which prints the traceback / exits with the
code exactly as for a cold ``python train.py``. torch's ``@record`` reads
TORCHELASTIC_ERROR_FILE from os.environ when the exception happens, so it finds the rank's file.

Until the launch it imports at the lowest CPU priority when it can restore its priority
afterwards (lower_priority), and the pool may pause it (SIGSTOP) while the host's cores are busy.
When the imports are done it freezes its heap out of the garbage collector's way (freeze_heap)
and writes one byte on stdout, a pipe the pool reads to know it is ready. On EOF (the agent
closed the pipe, or died) it exits without running anything. Nothing here initialises CUDA:
CUDA_VISIBLE_DEVICES is read when the rank first touches CUDA.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import json
import os
import resource
import select
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.agent import runner

IMPORT_NICENESS = 19
LAUNCH_SIGNAL = signal.SIGWINCH


AUTOGROUP_PATH = Path("/proc/self/autogroup")


@dataclass(frozen=True)
class Priority:
    """What to restore at the launch: the process's nice value and its autogroup's (None when
    the kernel has no autogroups)."""

    nice: int
    autogroup_nice: int | None


def read_autogroup_nice() -> int | None:
    """The nice value of this process's autogroup ("/autogroup-85 nice 0"), None without one."""
    try:
        with AUTOGROUP_PATH.open() as fh:
            fields = fh.read().split()
        return int(fields[-1]) if len(fields) == 3 and fields[1] == "nice" else None
    except (OSError, ValueError):
        return None


def write_autogroup_nice(nice: int) -> None:
    with contextlib.suppress(OSError), AUTOGROUP_PATH.open("w") as fh:
        fh.write(str(nice))


def lower_priority() -> Priority | None:
    """Imports at the lowest CPU priority, so a refill does not slow ranks that are starting or
    training on the same cores. Only when the priority can be raised back at the launch
    (privileged, or RLIMIT_NICE allows it): a rank must never run at the import priority.
    Returns the priority to restore, None when it was left alone.

    With autogroup scheduling (sched_autogroup_enabled, the default of many distributions'
    kernels) a process's nice value only ranks it within its session's autogroup, and this
    interpreter has a session of its own: the kernel shares the CPU between autogroups by the
    autogroup's nice value, so that is lowered too. Measured here with three CPU-bound
    processes in their own sessions on 2 cores: at nice 19 the third still got a third of the
    CPU (3.2 s of 10 s), with its autogroup at nice 19 too it got 0.1 s."""
    original = os.getpriority(os.PRIO_PROCESS, 0)
    soft_limit = resource.getrlimit(resource.RLIMIT_NICE)[0]
    if os.geteuid() != 0 and (soft_limit != resource.RLIM_INFINITY and 20 - original > soft_limit):
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, max(original, IMPORT_NICENESS))
    except OSError:
        return None
    autogroup = read_autogroup_nice()
    if autogroup is not None:
        write_autogroup_nice(max(autogroup, IMPORT_NICENESS))
    return Priority(original, autogroup)


def restore_priority(original: Priority | None) -> None:
    if original is not None:
        os.setpriority(os.PRIO_PROCESS, 0, original.nice)
        if original.autogroup_nice is not None:
            write_autogroup_nice(original.autogroup_nice)


def restore_on_launch_signal(original: Priority | None) -> None:
    """The pool sends LAUNCH_SIGNAL right after the launch line: a process taken while still
    importing finishes its imports at the rank's priority. SIGWINCH is ignored by default, so a
    process taken before this handler existed (the pool hands out one it has only just started
    when none is ready) loses the signal; but its launch line was written before the signal,
    so it is already waiting on stdin here, and the priority is restored at once. Without that
    check such a rank imported torch at nice 19 in an autogroup at nice 19: on a busy host it
    took minutes to start (bench/chaos), and its whole round waited for it."""
    if original is None:
        return
    signal.signal(LAUNCH_SIGNAL, lambda _signum, _frame: restore_priority(original))
    if select.select([sys.stdin], [], [], 0)[0]:
        restore_priority(original)


def preload() -> None:
    """The imports that dominate a rank's start-up; their cost is paid before the launch.

    torch._dynamo included: a script's first optimizer (``torch._disable_dynamo`` on
    ``add_param_group``), DistributedDataParallel's constructor and every ``optimizer.step``
    import it, so without it here a new rank spent 1.2-1.5 s of its start on that import (on
    this 2-core machine, quiet; 0.6 s on a faster one; up to 4 s while other ranks start): the
    largest part of an in-place joiner's start and of a plain script's restart
    (docs/architecture.md). It stayed out until the hang it caused at exit was understood; the
    two guards below work around it (:func:`keep_backward_context_out_of_collectives`,
    :func:`let_gloo_workers_finish_before_destroy`).
    torch.distributed.fsdp stays out: nothing a DDP rank starts with imports it."""
    import torch
    import torch._dynamo
    import torch.distributed
    import torch.distributed.elastic.multiprocessing.errors
    import torch.nn
    import torch.nn.parallel
    import torch.optim

    del torch
    keep_backward_context_out_of_collectives()
    let_gloo_workers_finish_before_destroy()


def keep_backward_context_out_of_collectives() -> None:
    """torch's ``backward()`` stashes a copy of the caller's contextvars context in the thread's
    torch TLS (``_stash_obj_in_tls("context", ...)``, in ``autograd.graph._engine_run_backward``)
    so that a torch.compile'd graph's backward, run on an autograd device thread, sees the
    compiler's config. Every gloo collective launched meanwhile, such as DDP's bucket all-reduce,
    copies that TLS, Python object included, into its work; the gloo worker thread that drops
    the work's last reference must take the GIL to release it. At exit, pybind11 frees DDP's
    Reducer with the GIL held, and the Reducer's ProcessGroupGloo destructor joins the worker
    threads: when a worker is still dropping a work then, neither moves (py-spy: the main thread
    in ``std::thread::join`` under ``~ProcessGroupGloo`` under ``Reducer`` dealloc, the worker in
    ``gil_scoped_acquire`` under ``~ThreadLocalState`` under ``~AsyncAllreduceWork``). With
    torch._dynamo preloaded, 2 of 30 two-rank tests/scripts/plain_ddp.py runs hung so at their
    last line here (earlier: 8 of 80 ranks); with this function, 0 of 80; without the stash at
    all, 0 of 60 (a harness like ``bench/warm_teardown --end steps``).

    The context only matters once something was compiled: so it is stashed only once dynamo has
    compiled a graph or compiled autograd is on, and from then on exactly as torch does. Before
    that, nothing reads it (the compiled graphs' wrappers check ``_is_key_in_tls`` first)."""
    import torch
    import torch._dynamo.compiled_autograd as compiled_autograd
    from torch._dynamo.utils import counters

    stash = torch._C._stash_obj_in_tls
    if getattr(stash, "_trainyard_guard", False):
        return

    def stash_once_compiled(key: str, arg: Any) -> None:
        if (
            key == "context"
            and not counters["stats"].get("unique_graphs")
            and not compiled_autograd.compiled_autograd_enabled
        ):
            return
        stash(key, arg)

    stash_once_compiled._trainyard_guard = True  # type: ignore[attr-defined]
    torch._C._stash_obj_in_tls = stash_once_compiled


GLOO_DRAIN_SECONDS = 0.05


def let_gloo_workers_finish_before_destroy() -> None:
    """``torch.distributed.destroy_process_group`` first sleeps GLOO_DRAIN_SECONDS (the GIL free),
    then destroys as torch does.

    The other half of the teardown hang (see :func:`keep_backward_context_out_of_collectives`):
    a gloo worker thread drops its reference to a finished work after waking the rank that
    waited for it; when that rank has meanwhile dropped the Python tensor of the collective (a
    temporary, such as a one-element flag's), the work's reference is the last one and freeing
    the tensor's Python object needs the GIL. The worker gets it at the rank's next switch
    interval, unless the rank first frees DDP's Reducer or destroys the group: the
    ProcessGroupGloo destructor joins the workers with the GIL held (py-spy: the worker in
    ``gil_scoped_acquire`` under ``TensorImpl::decref_pyobject`` under ``~AsyncAllreduceWork``).
    With torch._dynamo preloaded a rank reaches that point sooner: 3 of 20 two-rank runs of
    plain_ddp.py stopped by SIGTERM hung so, against 0 of 20 without the preload
    (``bench/warm_teardown``). The pause lets a worker waiting for the GIL take it before the
    destructor runs; a worker the kernel does not schedule for the whole pause can still hang
    it. Scripts that free DDP or the group without destroy_process_group are not covered; the
    SDK and torchrun-style scripts call it."""
    import torch.distributed
    import torch.distributed.distributed_c10d as c10d

    destroy = c10d.destroy_process_group
    if getattr(destroy, "_trainyard_drain", False):
        return

    @functools.wraps(destroy)
    def destroy_process_group(group: Any = None) -> None:
        time.sleep(GLOO_DRAIN_SECONDS)
        destroy(group)

    destroy_process_group._trainyard_drain = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    torch.distributed.destroy_process_group = destroy_process_group


def freeze_heap() -> None:
    """Moves everything the preload created out of the garbage collector's sight (gc.freeze, as
    pre-forking servers do): those objects live as long as the interpreter anyway. The rank's
    full collections then skip them, and so does the collection at interpreter exit, which with
    torch imported took about 0.45 s here (0.1 s frozen): a rank that is asked to stop for a
    new round is gone that much sooner."""
    gc.collect()
    gc.freeze()


def signal_ready() -> None:
    """One byte on stdout (a pipe the pool reads) says the imports are done. The pool may have
    handed this process out meanwhile and closed its end: then nobody is waiting for it."""
    with contextlib.suppress(OSError):
        os.write(1, b"R")


def redirect(fd: int, path: str) -> None:
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(opened, fd)
    finally:
        os.close(opened)


def become_rank(request: dict[str, Any], priority: Priority | None = None) -> None:
    restore_priority(priority)
    signal.signal(LAUNCH_SIGNAL, signal.SIG_DFL)
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
    mode = "script" if request["mode"] == "script" else "module"
    runner.retitle(mode, target, args)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    # Directories that appeared after this interpreter started (a freshly extracted bundle)
    # must not be hidden by a stale import-system listing.
    importlib.invalidate_caches()
    runner.run(mode, target, args)


def main() -> None:
    started = time.monotonic()
    priority = lower_priority()
    restore_on_launch_signal(priority)
    preload()
    freeze_heap()
    signal_ready()
    # For the pool log: how long a refill takes on this host (launches before this line wait).
    print(
        f"warm pid {os.getpid()} ready after {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True
    )
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return
    become_rank(json.loads(line), priority)


if __name__ == "__main__":
    main()
