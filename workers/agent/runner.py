"""Runs a rank's Python code in this interpreter as ``python script.py`` or ``python -m module``
would, and records how that code ended before the interpreter's own teardown begins.

A cold rank is ``python .../workers/agent/runner.py script train.py --lr 0.1`` (or ``module
workers.workloads digits``); a warm one calls ``run`` once it has become the rank (warm.py).
Run by its path, this file's directory is sys.path[0] only until ``run`` replaces it with the
script's, as the interpreter would have.

Why the record: in torch 2.13 a gloo rank can crash after its script has ended. Every backward
stashes a Python object in the thread-local state that each collective's work captures; a work
freed on a gloo worker thread must take the GIL to drop it, and a thread that asks for the GIL
once the interpreter is finalizing is ended by CPython 3.11 with pthread_exit, whose unwinding
through the work's noexcept destructor aborts the process ("terminate called without an active
exception", SIGABRT, sometimes SIGSEGV in faulthandler's dump). Seen here in about one rank run
in thirty of tests/scripts/ddp_train.py, with plain ``python`` as with torchrun; gdb on the core
shows the worker thread in ``~AsyncWork`` -> ``~ThreadLocalState`` -> ``take_gil`` ->
``pthread_exit`` while the main thread is in ``Py_FinalizeEx``. The same teardown can instead
deadlock (DDP's Reducer destructor joins that worker thread while holding the GIL).

So the last atexit handler writes the code's exit status to END_FILE_ENV's file, after
non-daemon threads have been joined and the script's own atexit handlers have run. A process
that then dies by a signal, or hangs, did so in the interpreter's teardown; the agent reports
the status the script ended with and says what the teardown did (supervisor.py). Only the
standard library (and setproctitle) is imported here: a cold rank pays for nothing else, and
nothing from the job's directory is imported before ``run`` puts it on sys.path.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import sys
import time

END_FILE_ENV = "TRAINYARD_END_FILE"
USAGE = "usage: python runner.py {script PATH | module NAME} [ARG ...]"


def exit_status(code: object) -> int:
    """The status a process exits with when SystemExit(code) ends its interpreter."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1  # the interpreter prints the object to stderr and exits 1


class Ending:
    """How the code ended (an exit status), written out by the last atexit handler to run."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.status: int | None = None  # None: not ended, or ended by KeyboardInterrupt

    def record(self) -> None:
        if not self.path or self.status is None:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            with open(tmp, "w") as fh:
                json.dump({"status": self.status, "pid": os.getpid(), "at": time.time()}, fh)
            os.replace(tmp, self.path)


def run(mode: str, target: str, args: list[str]) -> None:
    """Runs ``target`` (a script path, or a module name when ``mode`` is "module") as
    ``__main__`` with ``args``, and arranges for its ending to be recorded."""
    ending = Ending(os.environ.get(END_FILE_ENV, ""))
    # Handlers run last-registered first: registered before the code runs, this one runs after
    # every handler the code (or the libraries it imports) registers.
    atexit.register(ending.record)
    try:
        if mode == "script":
            sys.argv = [target, *args]
            # As `python script.py`: the script's directory (symlinks resolved) comes first,
            # unless the interpreter was told not to add one (-P, PYTHONSAFEPATH).
            if not sys.flags.safe_path:
                sys.path[0] = os.path.dirname(os.path.realpath(target))
            runpy.run_path(target, run_name="__main__")
        else:
            sys.argv = ["-m", *args]
            # As `python -m module`: the working directory comes first; run_module sets argv[0].
            if not sys.flags.safe_path:
                sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        ending.status = exit_status(exc.code)
        raise
    except KeyboardInterrupt:
        raise  # the interpreter ends by SIGINT: a signal, as the agent will see it
    except BaseException:
        ending.status = 1  # the interpreter prints the traceback and exits 1
        raise
    ending.status = 0


def retitle(mode: str, target: str, args: list[str]) -> None:
    """Shows the rank's own command line in ps and /proc/<pid>/cmdline, as `python train.py`
    would (operators and tools find ranks by their script). It must fit in argv's own memory:
    this module's command line is longer, and the warm pool starts its interpreters with a blank
    padding argument. SPT_NOENV keeps setproctitle off the environment block, where the agent's
    reaper looks for its session marker."""
    title = [sys.executable, target, *args] if mode == "script" else [sys.executable, "-m", target, *args]
    os.environ["SPT_NOENV"] = "1"
    try:
        import setproctitle

        setproctitle.setproctitle(" ".join(title))
    except ImportError:
        pass
    finally:
        del os.environ["SPT_NOENV"]  # read when setproctitle first sets a title


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("script", "module"):
        sys.exit(USAGE)
    mode, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    retitle(mode, target, args)
    run(mode, target, args)


if __name__ == "__main__":
    main()
