"""Step timing and the model watcher (gradient/parameter statistics, NaN/Inf detection)."""

from __future__ import annotations

import resource
import sys
import time
from types import TracebackType
from typing import Any

import torch
from torch import nn

from workers.sdk.telemetry import env_rank, telemetry

# Parameters this large (embedding tables) are left out of the update/parameter ratio: copying
# them every few steps would cost more than the statistic is worth.
MAX_SNAPSHOT_NUMEL = 1 << 22


def peak_memory_bytes() -> int:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    # ru_maxrss is KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class StepTimer:
    """``with sdk.step(step, samples=n, tokens=m):`` around one optimizer step.

    Reused for every step (one object, no allocation); emits step time, samples/s, tokens/s and
    peak memory averaged over the last ``every`` steps, on the first step and each ``every``-th.
    """

    def __init__(self, every: int = 10) -> None:
        self.every = max(1, every)
        self._step = 0
        self._samples = 0
        self._tokens = 0
        self._started = 0.0
        self._window_time = 0.0
        self._window_samples = 0
        self._window_tokens = 0
        self._window_steps = 0
        self._reported = False

    def __call__(self, step: int, samples: int = 0, tokens: int = 0) -> StepTimer:
        self._step = step
        self._samples = samples
        self._tokens = tokens
        return self

    def __enter__(self) -> StepTimer:
        self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            return
        self.done(self._step, time.perf_counter() - self._started, self._samples, self._tokens)

    def done(self, step: int, seconds: float, samples: int = 0, tokens: int = 0) -> None:
        self._window_time += seconds
        self._window_samples += samples
        self._window_tokens += tokens
        self._window_steps += 1
        # The first step is reported alone (it includes warm-up), then one record per window.
        if self._reported and step % self.every != 0:
            return
        self._reported = True
        elapsed = self._window_time
        values: dict[str, Any] = {"step_time_s": elapsed / self._window_steps}
        if elapsed > 0 and self._window_samples:
            values["samples_per_s"] = self._window_samples / elapsed
        if elapsed > 0 and self._window_tokens:
            values["tokens_per_s"] = self._window_tokens / elapsed
        values["peak_memory_bytes"] = peak_memory_bytes()
        telemetry().metric(step, values, echo=False)
        self._window_time = 0.0
        self._window_samples = self._window_tokens = self._window_steps = 0


def _layer_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


def _grad_norm(grad: torch.Tensor) -> torch.Tensor:
    if grad.is_sparse:
        grad = grad.coalesce()._values()
    return torch.linalg.vector_norm(grad.detach().float())


class Watcher:
    """Gradient and parameter statistics for one model, every ``every`` steps.

    Call ``after_backward(step)`` once the gradients of a step are complete (after the last
    micro-batch, after ``scaler.unscale_`` with fp16, before clipping). Pass ``optimizer`` to get
    the update/parameter ratio (the watcher hooks the optimizer's step).
    """

    def __init__(self, model: nn.Module, every: int = 50, optimizer: torch.optim.Optimizer | None = None):
        self.every = max(1, every)
        # DDP wraps the model as .module; names without the prefix read better.
        inner = getattr(model, "module", model)
        self.named = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
        self.layers: dict[str, list[int]] = {}
        for index, (name, _) in enumerate(self.named):
            self.layers.setdefault(_layer_of(name), []).append(index)
        # After an all-reduce every replica holds the same gradients: one rank reports.
        self.active = env_rank() == 0
        self._snapshot: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._snapshot_step = -1
        self.anomalies = 0
        if optimizer is not None:
            optimizer.register_step_post_hook(lambda opt, args, kwargs: self.after_step())

    def after_backward(self, step: int) -> None:
        if not self.active or step % self.every != 0:
            return
        self.measure(step)

    def measure(self, step: int) -> dict[str, float]:
        norms: list[torch.Tensor] = []
        names: list[str] = []
        for name, param in self.named:
            if param.grad is not None:
                norms.append(_grad_norm(param.grad))
                names.append(name)
        values: dict[str, float] = {}
        if norms:
            stacked = torch.stack(norms).cpu()
            per_param = stacked.tolist()
            total = float(torch.linalg.vector_norm(stacked))
            values["grad_norm"] = total
            by_name = dict(zip(names, per_param, strict=True))
            bad = [n for n in names if not _finite(by_name[n])]
            if bad:
                self._report_anomaly(step, bad, by_name)
            squares: dict[str, float] = {}
            for name, value in by_name.items():
                layer = _layer_of(name)
                squares[layer] = squares.get(layer, 0.0) + value * value
            for layer, square in squares.items():
                values[f"grad_norm/{layer}"] = square**0.5
        with torch.no_grad():
            param_norms = [torch.linalg.vector_norm(p.detach().float()) for _, p in self.named]
            if param_norms:
                values["param_norm"] = float(torch.linalg.vector_norm(torch.stack(param_norms)))
        self._snapshot = [(p, p.detach().clone()) for _, p in self.named if p.numel() <= MAX_SNAPSHOT_NUMEL]
        self._snapshot_step = step
        telemetry().metric(step, values, echo=False)
        return values

    def after_step(self) -> None:
        """Emits ||Δθ|| / ||θ|| for the step measured by the last ``after_backward``."""
        snapshot, self._snapshot = self._snapshot, None
        if not snapshot:
            return
        with torch.no_grad():
            delta = torch.stack([torch.linalg.vector_norm((p - old).float()) for p, old in snapshot])
            before = torch.stack([torch.linalg.vector_norm(old.float()) for _, old in snapshot])
            denominator = float(torch.linalg.vector_norm(before))
            if denominator > 0:
                ratio = float(torch.linalg.vector_norm(delta)) / denominator
                telemetry().metric(self._snapshot_step, {"update_ratio": ratio}, echo=False)

    def _report_anomaly(self, step: int, bad: list[str], by_name: dict[str, float]) -> None:
        self.anomalies += 1
        layer = _layer_of(bad[0])
        kinds = sorted({"nan" if by_name[n] != by_name[n] else "inf" for n in bad})
        telemetry().event(
            "gradient_anomaly",
            "error",
            f"non-finite gradient ({'/'.join(kinds)}) in layer {layer} at step {step}",
            {"step": step, "layer": layer, "parameters": bad[:20], "kind": kinds},
        )


def _finite(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))
