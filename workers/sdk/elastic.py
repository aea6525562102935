"""In-place elasticity: the process survives membership changes; only the process group is re-formed.

::

    from workers import sdk

    with sdk.elastic(model, optimizer) as run:
        for batch in run.batches(dataset, batch_size=32):
            loss = loss_fn(run.model(batch["x"]), batch["y"])   # run.model: DDP over the current group
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    if run.left:                     # this rank's node left the job (scale-down): stop quietly
        return
    if run.stopped:                  # every rank got SIGTERM (the job is stopping): save, exit
        ...

The agent tells each rank its current round in a control file (path in ``TRAINYARD_CONTROL``;
format and the ``<control>.state`` file the SDK reports in: :mod:`workers.sdk.elastic_control`).
At every step boundary the SDK checks it and the ranks agree on the newest round with a
one-element all-reduce, so all of them re-form at the same boundary. Re-forming: destroy the
process group, form the new one at the round's address, then broadcast model, optimizer and data
position from the lowest rank that already had state (a survivor) to every rank; newcomers thus
receive state from a live peer, not from disk. The data position is a place in the epoch's fixed
permutation, re-split over the new world at every step (:mod:`workers.sdk.elastic_data`), so no
example is skipped or repeated. When forming does not finish within ``form_timeout`` seconds the
state is ``failed`` and :class:`ElasticError` is raised: the process exits and the controller
falls back to a restart.

A collective that fails because a peer died does not end the survivors
(:mod:`workers.sdk.elastic_recovery`): the step is undone, the SDK writes state ``waiting`` and
waits up to ``form_timeout`` for a newer round in the control file, then re-forms as for a resize
and the step is redone over the new world. Without a newer round in time it reports ``failed``
and raises :class:`ElasticError` (the restart path takes over). Collectives the user's step calls
itself are not guarded: they raise out of the step and end the process as before.

Without ``TRAINYARD_CONTROL`` (plain ``torchrun`` or ``python``) the round comes from the usual
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` variables and never changes.

Backends: gloo on CPU; with ``device`` a CUDA device (one GPU per process) NCCL, with the state
moved to that device for the broadcast. Both go through the same :meth:`ElasticRun._form`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import default_collate

from workers.protocol import InplaceStatus
from workers.sdk import elastic_store as round_store
from workers.sdk.elastic_control import ENV_CONTROL, Control, ControlFile, ElasticError
from workers.sdk.elastic_data import IndexedDataset, epoch_order, rank_slice
from workers.sdk.elastic_recovery import StepGuard
from workers.sdk.stop import install_stop_handler, stop_requested

DEFAULT_FORM_TIMEOUT = 20.0
# A collective waits at most this long for a peer: how long a peer lost without a closed
# connection (a node loss) takes to be noticed. Steps whose ranks drift further apart need more.
DEFAULT_COLLECTIVE_TIMEOUT = 10.0


def device_for(requested: torch.device | None, local_rank: int) -> torch.device:
    """The process's device in a round: a CUDA request without an index takes the GPU of its
    local rank (which can change in place); anything else runs on the CPU."""
    if requested is not None and requested.type == "cuda":
        return torch.device("cuda", local_rank if requested.index is None else requested.index)
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


class ElasticRun:
    """The state the SDK carries across rounds; made by :func:`elastic`."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        *,
        control_path: str | os.PathLike[str] | None = None,
        device: torch.device | str | None = None,
        form_timeout: float = DEFAULT_FORM_TIMEOUT,
        collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT,
        seed: int = 0,
        wrap_ddp: bool = True,
    ) -> None:
        self.module = model
        if optimizer is None:
            self.optimizers: list[torch.optim.Optimizer] = []
        elif isinstance(optimizer, torch.optim.Optimizer):
            self.optimizers = [optimizer]
        else:
            self.optimizers = list(optimizer)
        path = control_path if control_path is not None else os.environ.get(ENV_CONTROL)
        self.control_path = Path(path) if path else None
        self._control_file = ControlFile(self.control_path) if self.control_path else None
        self.form_timeout = form_timeout
        self.collective_timeout = collective_timeout
        self.seed = seed
        self.wrap_ddp = wrap_ddp
        self._device_arg = torch.device(device) if device is not None else None
        self.device = torch.device("cpu")
        self.control: Control | None = None
        self._next: Control | None = None  # the next round, read but not formed yet
        self._next_store: dist.TCPStore | None = None
        self._wait_target = 0
        self._wait_started = 0.0
        self._ddp: nn.Module | None = None
        self.step = 0
        self.epoch = 0
        self.position = 0
        self.left = False
        self.stopped = False  # every rank was sent SIGTERM: the loop ended early
        self.reforms = 0
        # True when this process got its state from a survivor (it joined a running job); False
        # when the whole group started afresh (load a checkpoint then, on every rank).
        self.joined = False
        self.last_form_seconds = 0.0
        # Whether this process holds training state worth keeping (a survivor) or needs it (a
        # newcomer). False until the first formed round; a fresh start takes rank 0's init.
        self._has_state = False
        self._guard = StepGuard(self.module, self.optimizers)
        self.recoveries = 0  # rounds re-formed after a peer died mid-step

    # ---- the public surface -------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.control.rank if self.control else 0

    @property
    def world_size(self) -> int:
        return self.control.world_size if self.control else 1

    @property
    def round(self) -> int:
        return self.control.round if self.control else 0

    @property
    def broken(self) -> str | None:
        """A collective of the current step failed (a peer died): the error, until recovered."""
        return self._guard.broken

    @property
    def model(self) -> nn.Module:
        """The model to call in a step: DDP over the current group (re-made at every re-form)."""
        return self._ddp if self._ddp is not None else self.module

    def __enter__(self) -> ElasticRun:
        install_stop_handler()
        control = self._read_control(wait_for_round=None)
        self._form(control)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and not isinstance(exc, ElasticError) and not self.left:
            self._report(InplaceStatus.FAILED, reason=f"{type(exc).__name__}: {exc}"[:500])
        self._ddp = None
        if dist.is_initialized():
            dist.destroy_process_group()

    def batches(
        self, dataset: IndexedDataset, batch_size: int, epochs: int | None = 1, collate: Any = default_collate
    ) -> Iterator[Any]:
        """Yields this rank's batches; between two batches (a step boundary) follows round changes.

        Every yielded batch is one step; ``self.step`` counts the steps finished. With ``epochs``
        None it runs until the caller stops. In the last step of an epoch a rank gets None when
        fewer examples than ranks remain; it must still take part in the step's collectives."""
        size = len(dataset)
        if size < 1 or batch_size < 1:
            raise ValueError("batches() needs a non-empty dataset and a positive batch_size")
        while epochs is None or self.epoch < epochs:
            order = epoch_order(size, self.seed, self.epoch)
            while self.position < size:
                start, end = rank_slice(
                    self.position, size - self.position, self.world_size, self.rank, batch_size
                )
                taken = min(size - self.position, self.world_size * batch_size)
                self._keep_before_step()
                yield collate([dataset[int(i)] for i in order[start:end]]) if end > start else None
                if self.broken is not None:
                    if not self._recover():
                        return
                    continue  # the step is redone over the new world
                self.position += taken
                self.step += 1
                if not self.boundary():
                    return
            self.epoch += 1
            self.position = 0

    def steps(self, total: int) -> Iterator[int]:
        """Yields step numbers from ``self.step + 1`` to ``total``; between two steps (a step
        boundary) follows round changes. For loops whose data is a function of (step, rank)."""
        while self.step < total:
            self._keep_before_step()
            yield self.step + 1
            if self.broken is not None:
                if not self._recover():
                    return
                continue
            self.step += 1
            if self.step < total and not self.boundary():
                return

    def boundary(self) -> bool:
        """Follows a round change if there is one; False when this rank leaves or the job stops.

        One all-reduce (MAX) of [newest round seen, -stop flag, -ready flag] tells every rank the
        newest round any of them was told about, whether *every* rank got SIGTERM, and whether
        every rank is ready to move to the new round. A rank is ready once it has read its new
        control file; the new round's rank 0 (a survivor: it hosts the new round's store from the
        moment it reads its control) only once every joiner has checked in there. Until then the
        group trains on in the old round, so survivors do not wait while newcomers import torch.

        Then, at the same boundary on every rank: a rank with a new control re-forms; a rank
        without one that was sent SIGTERM leaves (its node is leaving the job: the agent stops it
        while the others are told the new round). Only when every rank was sent SIGTERM and no
        round changed does the whole group stop."""
        local = self._peek_round()
        stopping = stop_requested()
        if local > self.round and (self._next is None or self._next.round < local):
            self._prepare(local)
        ready = self._ready(stopping, local)
        target, all_stopping, all_ready = local, stopping, ready
        if self.world_size > 1:
            flags = torch.tensor([local, -int(stopping), -int(ready)], dtype=torch.int64, device=self.device)
            try:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            except RuntimeError as error:  # a peer died after the step's own collectives
                if not self._recoverable():
                    raise
                self._guard.broken = f"{type(error).__name__}: {error}"[:500]
                self._guard.forget()  # the step itself completed everywhere: keep it
                return self._recover()
            target = int(flags[0].item())
            all_stopping, all_ready = int(flags[1].item()) < 0, int(flags[2].item()) < 0
        if target <= self.round:
            if all_stopping:
                self.stopped = True
                return False
            return True
        if not all_ready:
            if time.monotonic() - self._waiting_since(target) > self.form_timeout:
                reason = f"round {target}: not every rank was ready within {self.form_timeout:.0f} s"
                self._report(InplaceStatus.FAILED, reason=reason, round_no=target)
                raise ElasticError(reason)
            return True  # train on in the old round; the newcomers are still starting
        if stopping and local <= self.round:
            self._leave()
            return False
        if self._next is None or self._next.round < target:
            self._prepare(target)
        assert self._next is not None
        control, store, self._next, self._next_store = self._next, self._next_store, None, None
        self._form(control, store)
        return not self.left

    # ---- a peer died mid-step ------------------------------------------------------------
    def _recoverable(self) -> bool:
        """Only a rank that can be told a new round (a control file) waits for one."""
        return self.control_path is not None and self.world_size > 1

    def _keep_before_step(self) -> None:
        """A copy of model and optimizer before the step, to put back if the step's collectives fail."""
        if self._recoverable():
            self._guard.keep()
        else:
            self._guard.forget()

    def _recover(self) -> bool:
        """After a failed collective: undo the step, wait for the next round, re-form in it.
        False when this rank leaves in that round."""
        reason = self.broken or "a collective failed"
        self._guard.undo()
        self._ddp = None
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        self._report(InplaceStatus.WAITING, reason=reason)
        control = self._read_control(wait_for_round=self.round + 1)
        self._next, self._next_store = None, None
        store = None
        if not control.leaves and control.joiners > 0 and control.world_size > 1:
            store = self._wait_for_joiners(control)
        self._guard.broken = None
        self.recoveries += 1
        self._form(control, store)
        return not self.left

    def _wait_for_joiners(self, control: Control) -> dist.TCPStore:
        """Survivors hold back until the round's newcomers checked in (they are still starting)."""
        try:
            store = round_store.open_store(control, self.form_timeout)
            round_store.wait_for_joiners(store, control, self.form_timeout)
        except Exception as error:
            reason = f"round {control.round}: {type(error).__name__}: {error}"[:500]
            self._report(InplaceStatus.FAILED, reason=reason, round_no=control.round)
            raise ElasticError(reason) from error
        return store

    def _waiting_since(self, target: int) -> float:
        if self._wait_target != target:
            self._wait_target, self._wait_started = target, time.monotonic()
        return self._wait_started

    def _prepare(self, target: int) -> None:
        """Reads the new round's control; its rank 0 opens the round's store for the joiners."""
        self._next = self._read_control(wait_for_round=target)
        self._next_store = None
        control = self._next
        if control.joiners > 0 and control.rank == 0 and control.world_size > 1:
            try:
                self._next_store = round_store.open_store(control, self.form_timeout)
            except Exception as error:  # the port is taken, the address is not ours
                reason = f"round {control.round}: cannot open the store: {type(error).__name__}: {error}"
                self._report(InplaceStatus.FAILED, reason=reason[:500], round_no=control.round)
                raise ElasticError(reason) from error

    def _ready(self, stopping: bool, local: int) -> bool:
        """This rank's part of the agreement to move to the new round (see boundary)."""
        if stopping and local <= self.round:
            return True  # leaving: it does not hold the others back
        control = self._next
        if control is None:
            return False
        if control.joiners == 0 or self._next_store is None:
            return True
        return round_store.joined(self._next_store, control) >= control.joiners

    # ---- control file --------------------------------------------------------------------
    def _peek_round(self) -> int:
        """The newest round this rank has been told about."""
        return self._control_file.peek(self.round) if self._control_file else self.round

    def _read_control(self, wait_for_round: int | None) -> Control:
        if self._control_file is None:
            return Control.from_env()
        try:
            return self._control_file.read(wait_for_round, self.form_timeout)
        except ElasticError as error:
            self._report(InplaceStatus.FAILED, reason=str(error))
            raise

    def _report(self, state: InplaceStatus, reason: str = "", round_no: int | None = None) -> None:
        if self._control_file is None:
            return
        self._control_file.report(
            state,
            round_no=self.round if round_no is None else round_no,
            step=self.step,
            reason=reason,
            form_seconds=self.last_form_seconds,
        )

    # ---- re-forming --------------------------------------------------------------------
    def _form(self, control: Control, store: dist.TCPStore | None = None) -> None:
        started = time.monotonic()
        self._report(InplaceStatus.FORMING, round_no=control.round)
        self._ddp = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self.control = control
        if control.leaves:
            self._leave()
            return
        self.device = self._pick_device(control)
        try:
            if control.world_size > 1:
                if store is None:
                    store = round_store.open_store(control, self.form_timeout)
                if not self._has_state and control.joiners > 0:
                    round_store.check_in(store, control)
                prefixed = dist.PrefixStore(round_store.round_prefix(control), store)
                round_store.gather(prefixed, control, self.form_timeout)
                dist.init_process_group(
                    backend_for(self.device),
                    store=prefixed,
                    rank=control.rank,
                    world_size=control.world_size,
                    timeout=datetime.timedelta(seconds=self.collective_timeout),
                )
                self._sync_state()
                if self.wrap_ddp:
                    self._wrap_ddp()  # DDP's constructor has collectives of its own: part of forming
        except ElasticError:
            raise
        except Exception as error:  # gloo/nccl/store errors have no common type
            reason = f"forming round {control.round} failed: {type(error).__name__}: {error}"[:500]
            self._report(InplaceStatus.FAILED, reason=reason)
            raise ElasticError(reason) from error
        self._has_state = True
        self.reforms += 1
        self.last_form_seconds = time.monotonic() - started
        self._report(InplaceStatus.FORMED)

    def _wrap_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self._ddp = DistributedDataParallel(self.module, device_ids=device_ids)
        if self._recoverable():
            # a lambda: DDP checks the hook's annotations, which are strings in this module
            self._ddp.register_comm_hook(
                None, lambda state, bucket: self._guard.allreduce(bucket, self.world_size)
            )

    def _leave(self) -> None:
        self._ddp = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self.left = True
        self._report(InplaceStatus.LEFT)

    def _pick_device(self, control: Control) -> torch.device:
        device = device_for(self._device_arg, control.local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device

    def _sync_state(self) -> None:
        """Every rank ends with the state of the lowest rank that had some (a survivor)."""
        mine = [self._has_state, self.step]
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, mine)
        holders = [rank for rank, (has, _) in enumerate(everyone) if has]
        steps = {step for has, step in everyone if has}
        if holders and len(holders) == self.world_size and len(steps) == 1:
            return  # everyone was already in step together (a pure scale-down)
        # the survivor furthest on (after a peer died at a boundary, some may have one more step)
        source = max(holders, key=lambda rank: (everyone[rank][1], -rank)) if holders else 0
        payload: list[Any] = [None]
        if self.rank == source:
            payload[0] = self.snapshot()
        dist.broadcast_object_list(
            payload, src=source, device=self.device if self.device.type == "cuda" else None
        )
        if self.rank != source:
            self.restore(payload[0])
            self.joined = self.joined or bool(holders)

    def snapshot(self) -> dict[str, Any]:
        return {
            "model": self.module.state_dict(),
            "optimizers": [optimizer.state_dict() for optimizer in self.optimizers],
            "step": self.step,
            "epoch": self.epoch,
            "position": self.position,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


# ``with sdk.elastic(model, optimizer) as run:`` (see the module docstring): the run is the context.
elastic = ElasticRun
