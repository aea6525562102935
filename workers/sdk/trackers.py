"""``sdk.log`` mirrored to the trackers a team already reads, when the job asks for them:
``TRAINYARD_TRACKERS=tensorboard`` (event files through torch's ``SummaryWriter``, the official
writer, into ``TRAINYARD_TENSORBOARD_DIR``, else ``runs/``), ``mlflow`` (a run through
``mlflow``'s client, ``pip install trainyard[mlflow]`` or ``mlflow-skinny``; ``MLFLOW_TRACKING_URI``
and ``MLFLOW_EXPERIMENT_NAME`` as MLflow reads them), or both, comma-separated.

Each library is imported only when asked for. Values are converted and written by a background
thread (a CUDA tensor's ``.item()`` never stalls the training loop; an MLflow server is called
once per ``FLUSH_SECONDS`` with a batch). When a tracker opens, the SDK records a ``tracker.*``
event (where its files or run are), which the job page turns into a link. A tracker that cannot
open (library missing, server refused) is reported as a ``tracker.unavailable`` warning and
training goes on without it.

The event files carry the suffix ``.trainyard-sdk``: the agent, which ships the scalars of other
event files to the console (workers/agent/tensorboard.py), leaves these alone, since their points
came through the telemetry file already.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import socket
import threading
import time
from typing import Any

from workers import protocol

log = logging.getLogger(__name__)

SDK_SUFFIX = ".trainyard-sdk"  # the same as workers/agent/tensorboard.py's
FLUSH_SECONDS = 2.0
KNOWN = ("tensorboard", "mlflow")
MAX_PARAM_CHARS = 500  # MLflow refuses longer parameter values


def wanted() -> list[str]:
    raw = os.environ.get(protocol.ENV_TRACKERS, "")
    return [name for name in (part.strip().lower() for part in raw.split(",")) if name]


def _number(value: Any) -> float | None:
    if hasattr(value, "item"):
        value = value.item()
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class _TensorBoard:
    def __init__(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        rank = os.environ.get("RANK", "0")
        self.logdir = os.environ.get(protocol.ENV_TENSORBOARD_DIR) or os.path.join(
            "runs", f"trainyard-job-{os.environ.get(protocol.ENV_JOB_ID, 'local')}-rank-{rank}"
        )
        self.writer = SummaryWriter(
            log_dir=self.logdir, flush_secs=int(FLUSH_SECONDS), filename_suffix=SDK_SUFFIX
        )

    def where(self) -> dict[str, Any]:
        return {"tracker": "tensorboard", "logdir": os.path.abspath(self.logdir)}

    def write(self, batch: list[tuple[int, float, dict[str, float]]]) -> None:
        for step, t, values in batch:
            for name, value in values.items():
                self.writer.add_scalar(name, value, step, walltime=t)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class _MLflow:
    def __init__(self) -> None:
        import mlflow
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "trainyard"
        experiment = self.client.get_experiment_by_name(name)
        self.experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        job, rank = os.environ.get(protocol.ENV_JOB_ID, "local"), os.environ.get("RANK", "0")
        tags = {
            "trainyard.job": job,
            "trainyard.rank": rank,
            "trainyard.node": os.environ.get(protocol.ENV_NODE, ""),
        }
        run = self.client.create_run(self.experiment_id, run_name=f"job-{job}-rank-{rank}", tags=tags)
        self.run_id = run.info.run_id
        self.tracking_uri = mlflow.get_tracking_uri()
        self._metric = Metric
        params = json.loads(os.environ.get(protocol.ENV_HYPERPARAMETERS) or "{}")
        if isinstance(params, dict) and params:
            self.client.log_batch(
                self.run_id,
                params=[
                    Param(
                        str(k)[:250],
                        json.dumps(v)[:MAX_PARAM_CHARS] if not isinstance(v, str) else v[:MAX_PARAM_CHARS],
                    )
                    for k, v in list(params.items())[:100]
                ],
            )

    def where(self) -> dict[str, Any]:
        return {
            "tracker": "mlflow",
            "tracking_uri": self.tracking_uri,
            "experiment_id": self.experiment_id,
            "run_id": self.run_id,
        }

    def write(self, batch: list[tuple[int, float, dict[str, float]]]) -> None:
        metrics = [
            self._metric(name, value, int(t * 1000), step)
            for step, t, values in batch
            for name, value in values.items()
        ]
        for first in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[first : first + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Mirror:
    """The trackers of this process; ``log`` only queues."""

    def __init__(self, names: list[str]) -> None:
        self.names = [n for n in names if n in KNOWN]
        self.unknown = [n for n in names if n not in KNOWN]
        self._queue: queue.SimpleQueue[tuple[int, float, dict[str, Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._open: list[Any] = []
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._thread = None
        self._open = []
        self._queue = queue.SimpleQueue()

    def log(self, step: int, values: dict[str, Any]) -> None:
        if not self.names:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainyard-trackers", daemon=True)
                self._thread.start()
                atexit.register(self.close)
        self._queue.put((step, time.time(), dict(values)))

    def _start(self) -> None:
        from workers.sdk.telemetry import telemetry

        for name in self.unknown:
            telemetry().event(
                "tracker.unavailable", "warning", f"Unknown tracker {name!r}; known: {', '.join(KNOWN)}.", {}
            )
        for name in self.names:
            try:
                tracker = _TensorBoard() if name == "tensorboard" else _MLflow()
            except Exception as exc:
                message = f"The {name} tracker could not open: {type(exc).__name__}: {exc}"
                telemetry().event("tracker.unavailable", "warning", message, {"tracker": name})
                continue
            self._open.append(tracker)
            where = {
                **tracker.where(),
                "host": socket.gethostname(),
                "rank": int(os.environ.get("RANK", "0") or 0),
            }
            telemetry().event(f"tracker.{name}", "info", f"sdk.log mirrored to {name}", where)

    def _run(self) -> None:
        self._start()
        pending: list[tuple[int, float, dict[str, float]]] = []
        deadline = time.monotonic() + FLUSH_SECONDS
        done = False
        while not done:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                if item is None:
                    done = True
                else:
                    step, t, values = item
                    numbers = {k: v for k, v in ((k, _number(v)) for k, v in values.items()) if v is not None}
                    if numbers:
                        pending.append((step, t, numbers))
            except queue.Empty:
                pass
            if done or time.monotonic() >= deadline:
                self._write(pending)
                pending = []
                deadline = time.monotonic() + FLUSH_SECONDS
        for tracker in self._open:
            try:
                tracker.close()
            except Exception:
                log.warning("closing a tracker failed", exc_info=True)

    def _write(self, batch: list[tuple[int, float, dict[str, float]]]) -> None:
        if not batch:
            return
        for tracker in self._open:
            try:
                tracker.write(batch)
            except Exception:
                log.warning("a tracker refused %d points", len(batch), exc_info=True)

    def close(self, timeout: float = 60.0) -> None:
        """Writes what is queued and closes the trackers (at exit)."""
        thread = self._thread
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout)
        self._thread = None


_mirror: Mirror | None = None


def mirror() -> Mirror:
    global _mirror
    if _mirror is None:
        _mirror = Mirror(wanted())
    return _mirror
