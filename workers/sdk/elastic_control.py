"""The files between an agent and an in-place rank (:mod:`workers.sdk.elastic`).

The agent writes a small JSON control file per rank (path in ``TRAINYARD_CONTROL``) holding the
current round: ``job_id, round, rank, local_rank, world_size, master_addr, master_port, joiners``
(``rank`` -1 = leave). The rank checks it at every step boundary (:meth:`ControlFile.peek`: a
``stat``, and a read only when its mtime changed).

The SDK writes its state next to the control file (``<control>.state``, JSON: ``state`` (a
protocol.InplaceStatus: forming, formed, failed, left or waiting), ``round``, ``step``, ``pid``,
``reason``, ``form_seconds``, ``time``) so the agent can report it (:func:`read_state`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from workers import protocol
from workers.protocol import InplaceStatus

ENV_CONTROL = protocol.ENV_CONTROL
STATE_SUFFIX = ".state"


class ElasticError(RuntimeError):
    """Re-forming the process group failed (timeout, bad control file, unreachable peers)."""


@dataclasses.dataclass(frozen=True)
class Control:
    """One round as the agent described it to this rank."""

    job_id: str
    round: int
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    joiners: int = 0  # ranks of this round that start afresh (the survivors wait for them)

    @property
    def leaves(self) -> bool:
        return self.rank < 0

    @classmethod
    def parse(cls, data: Any) -> Control:
        if not isinstance(data, dict):
            raise ElasticError(f"control file must hold a JSON object, not {type(data).__name__}")
        try:
            control = cls(
                job_id=str(data.get("job_id", "")),
                round=int(data["round"]),
                rank=int(data["rank"]),
                local_rank=int(data.get("local_rank", 0)),
                world_size=int(data["world_size"]),
                master_addr=str(data["master_addr"]),
                master_port=int(data["master_port"]),
                joiners=int(data.get("joiners", 0)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ElasticError(f"control file is missing or has a bad field: {error!r}") from None
        if control.world_size < 1 or control.rank >= control.world_size:
            raise ElasticError(f"control file has rank {control.rank} outside world {control.world_size}")
        return control

    @classmethod
    def from_env(cls) -> Control:
        """The fixed round of a plain torchrun/python launch."""
        return cls(
            job_id=os.environ.get("TRAINYARD_JOB_ID", ""),
            round=0,
            rank=int(os.environ.get("RANK", "0")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(os.environ.get("MASTER_PORT", "29500")),
        )


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Readers never see half a file: write a sibling, then rename over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_control(path: Path, control: Control) -> None:
    """What the agent (and tests) call to tell a rank about a new round."""
    write_json_atomic(path, dataclasses.asdict(control))


def state_path(control_path: Path) -> Path:
    return control_path.with_name(control_path.name + STATE_SUFFIX)


def read_state(control_path: Path) -> dict[str, Any] | None:
    """The SDK's last reported state for this rank (its ``state`` an InplaceStatus), or None when
    there is none (yet)."""
    try:
        data = json.loads(state_path(control_path).read_text())
        if not isinstance(data, dict):
            return None
        data["state"] = InplaceStatus(str(data.get("state")))
    except (OSError, ValueError):
        return None
    return data


def round_seconds(value: float) -> float:
    return float(f"{value:.4f}")


class ControlFile:
    """The rank's side of the two files: the rounds it is told about, the state it reports."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime: int | None = None
        self._pending_round = 0

    def peek(self, current_round: int) -> int:
        """The newest round this rank has been told about: a stat, and a read only on change."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return current_round
        if mtime == self._mtime:
            return self._pending_round
        self._mtime = mtime
        try:
            self._pending_round = Control.parse(json.loads(self.path.read_text())).round
        except (OSError, ValueError, ElasticError):
            self._pending_round = current_round
        return self._pending_round

    def read(self, wait_for_round: int | None, timeout: float) -> Control:
        """The control, once it is at ``wait_for_round`` or later (any round when None); raises
        :class:`ElasticError` when there is no such valid control within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last_error = "no control file"
        while True:
            try:
                control = Control.parse(json.loads(self.path.read_text()))
                if wait_for_round is None or control.round >= wait_for_round:
                    return control
                last_error = f"control file is at round {control.round}, the group at {wait_for_round}"
            except (OSError, ValueError, ElasticError) as error:
                last_error = str(error)
            if time.monotonic() > deadline:
                raise ElasticError(last_error)
            time.sleep(0.01)

    def report(
        self, state: InplaceStatus, *, round_no: int, step: int, reason: str, form_seconds: float
    ) -> None:
        """Writes the state file (best effort: a rank does not fail because it cannot report)."""
        data = {
            "state": state,
            "round": round_no,
            "step": step,
            "pid": os.getpid(),
            "reason": reason,
            "form_seconds": round_seconds(form_seconds),
            "time": time.time(),
        }
        with contextlib.suppress(OSError):
            write_json_atomic(state_path(self.path), data)
