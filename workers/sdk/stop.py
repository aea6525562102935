"""Graceful stop: SIGTERM (and SIGINT) set a flag the training loop polls between steps."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import torch
import torch.distributed as dist

# How many steps may pass between the ranks' agreement on stopping (one tiny all-reduce each
# time). The agent's grace period is seconds; ten steps are far shorter and the collective then
# costs nothing measurable per step.
DEFAULT_CHECK_EVERY = 10

_requested = threading.Event()
_installed = False


def _handler(signum: int, frame: FrameType | None) -> None:
    _requested.set()


def install_stop_handler() -> None:
    """Installs the handler now (``should_stop`` does it on its first call anyway)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _handler)
    _installed = True


def request_stop() -> None:
    _requested.set()


def stop_requested() -> bool:
    """This process's own flag, without asking the other ranks."""
    return _requested.is_set()


def _in_group() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def should_stop(step: int | None = None, check_every: int = DEFAULT_CHECK_EVERY) -> bool:
    """True once a stop was requested; in a process group, every rank gets the same answer.

    Ranks agree through a one-element all-reduce (MAX) so that no rank leaves the loop while
    another waits in a collective. With ``step`` given they only compare on every
    ``check_every``-th step (every rank must pass the same steps); without it, on every call.
    """
    if not _installed:
        install_stop_handler()
    local = _requested.is_set()
    if step is not None and step % check_every != 0:
        # Between agreement steps only a process without peers may act on its own flag.
        return local and not _in_group()
    if not _in_group():
        return local
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    flag = torch.tensor([1.0 if local else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    agreed = bool(flag.item() > 0)
    if agreed:
        _requested.set()
    return agreed
