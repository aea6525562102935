"""Step timing and the model watcher (gradient/parameter statistics, NaN/Inf detection)."""

from __future__ import annotations

import math
import resource
import sys
import time
from types import TracebackType
from typing import Any

import torch
from torch import nn

from workers.sdk.progress_cell import cell as progress_cell
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

    One reused object; per step it only counts. Each ``every``-th step (and the first, which
    includes warm-up) it emits the wall time per step over the window (from the first step's
    start to the last one's end, so data loading between steps counts), samples/s, tokens/s,
    peak memory and ``data_wait_s``: the part of a step's wall time spent between two ``with``
    blocks (fetching the next batch), which the console's goodput counts as data waits.
    """

    def __init__(self, every: int = 10) -> None:
        self.every = max(1, every)
        self._step = 0
        self._window_start = 0.0
        self._samples = 0
        self._tokens = 0
        self._steps = 0
        self._reported = False
        self._left = 0.0  # when the last step's block ended
        self._between = 0.0  # seconds between blocks in this window

    def __call__(self, step: int, samples: int = 0, tokens: int = 0) -> StepTimer:
        self._step = step
        self._samples += samples
        self._tokens += tokens
        return self

    def count(self, samples: int = 0, tokens: int = 0) -> None:
        """Adds samples/tokens to the current step when they are known only inside it."""
        self._samples += samples
        self._tokens += tokens

    def __enter__(self) -> StepTimer:
        now = time.perf_counter()
        if not self._window_start:
            self._window_start = now
        elif self._left:
            self._between += now - self._left
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._steps += 1
        self._left = time.perf_counter()
        if exc_type is None:
            progress_cell().write(self._step)
        if exc_type is None and (self._step % self.every == 0 or not self._reported):
            self._report(self._step, self._left - self._window_start)

    def _report(self, step: int, elapsed: float) -> None:
        self._reported = True
        values: dict[str, Any] = {
            "step_time_s": elapsed / self._steps,
            "data_wait_s": self._between / self._steps,
        }
        if elapsed > 0 and self._samples:
            values["samples_per_s"] = self._samples / elapsed
        if elapsed > 0 and self._tokens:
            values["tokens_per_s"] = self._tokens / elapsed
        values["peak_memory_bytes"] = peak_memory_bytes()
        telemetry().metric(step, values, echo=False)
        self._window_start = self._left = self._between = 0.0
        self._samples = self._tokens = self._steps = 0


def _layer_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


def _norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of each tensor (one fused call for dense ones), as a float32 CPU vector."""
    if not any(t.is_sparse for t in tensors):
        return torch.stack(torch._foreach_norm(tensors)).float().cpu()
    return torch.stack(
        [
            torch.linalg.vector_norm(t.coalesce()._values() if t.is_sparse else t).float().cpu()
            for t in tensors
        ]
    )


class Watcher:
    """Gradient and parameter statistics for one model, every ``every`` steps.

    Call ``after_backward(step)`` once the gradients of a step are complete (after the last
    micro-batch, after ``scaler.unscale_`` with fp16, before clipping). Pass ``optimizer`` to get
    the update/parameter ratio: on measured steps the watcher copies the parameters (tables above
    MAX_SNAPSHOT_NUMEL elements excepted) and hooks that optimizer's next step.
    """

    def __init__(self, model: nn.Module, every: int = 100, optimizer: torch.optim.Optimizer | None = None):
        self.every = max(1, every)
        # DDP wraps the model as .module; names without the prefix read better.
        inner = getattr(model, "module", model)
        self.named = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
        self.layers: dict[str, list[int]] = {}
        for index, (name, _) in enumerate(self.named):
            self.layers.setdefault(_layer_of(name), []).append(index)
        # After an all-reduce every replica holds the same gradients: one rank reports.
        self.active = env_rank() == 0
        self._snapshot: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._snapshot_step = -1
        self._snapshot_norm = 0.0
        self.anomalies = 0
        self.optimizer = optimizer
        self._hook: Any = None

    def after_backward(self, step: int) -> None:
        if not self.active or step % self.every != 0:
            return
        self.measure(step)

    def measure(self, step: int) -> dict[str, float]:
        names: list[str] = []
        grads: list[torch.Tensor] = []
        for name, param in self.named:
            if param.grad is not None:
                names.append(name)
                grads.append(param.grad)
        values: dict[str, float] = {}
        with torch.no_grad():
            if grads:
                per_param = _norms(grads).tolist()
                total = sum(v * v for v in per_param) ** 0.5
                values["grad_norm"] = total
                by_name = dict(zip(names, per_param, strict=True))
                bad = [n for n in names if not math.isfinite(by_name[n])]
                if bad:
                    self._report_anomaly(step, bad, by_name)
                squares: dict[str, float] = {}
                for name, value in by_name.items():
                    layer = _layer_of(name)
                    squares[layer] = squares.get(layer, 0.0) + value * value
                for layer, square in squares.items():
                    values[f"grad_norm/{layer}"] = square**0.5
            params = [p.detach() for _, p in self.named]
            param_norms = _norms(params).tolist() if params else []
            if param_norms:
                values["param_norm"] = sum(v * v for v in param_norms) ** 0.5
            if self.optimizer is not None:
                kept = [i for i, p in enumerate(params) if p.numel() <= MAX_SNAPSHOT_NUMEL]
                current = [params[i] for i in kept]
                self._snapshot = (current, [p.clone() for p in current])
                self._snapshot_norm = sum(param_norms[i] ** 2 for i in kept) ** 0.5
                self._snapshot_step = step
                if self._hook is None:
                    # Hooked only while a snapshot waits: a registered hook costs every step a few us.
                    self._hook = self.optimizer.register_step_post_hook(
                        lambda opt, args, kwargs: self.after_step()
                    )
        telemetry().metric(step, values, echo=False)
        return values

    def after_step(self) -> None:
        """Emits ||Δθ|| / ||θ|| for the step measured by the last ``after_backward``."""
        snapshot, self._snapshot = self._snapshot, None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if not snapshot or not snapshot[0]:
            return
        current, before = snapshot
        with torch.no_grad():
            delta = float(torch.linalg.vector_norm(_norms(list(torch._foreach_sub(current, before)))))
        if self._snapshot_norm > 0:
            ratio = delta / self._snapshot_norm
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
