"""Search spaces: what a sweep's ``space`` may say, checked, and turned into optuna's
distributions. Pure: no database.

    {"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": true},
     "hidden": {"type": "int", "low": 16, "high": 128, "step": 16},
     "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]},
     "batch_size": [32, 64]}                    # a list is a categorical

The grid sampler walks every combination: each parameter needs ``choices`` or a ``step``.
"""

from __future__ import annotations

import math
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

MAX_PARAMETERS = 32
MAX_CHOICES = 256
MAX_GRID = 100_000
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
Choice = None | bool | int | float | str


class SpaceError(ValueError):
    """A search space the console refuses; the message says what to change."""


def _number(name: str, key: str, value: Any, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpaceError(f"{name}: '{key}' must be a finite number, not {value!r}.")
    if integer and int(value) != value:
        raise SpaceError(f"{name}: '{key}' must be a whole number, not {value!r}.")
    return value


def _choices(name: str, values: Any) -> tuple[Choice, ...]:
    if not isinstance(values, list) or not values:
        raise SpaceError(f"{name}: 'choices' must be a non-empty list.")
    if len(values) > MAX_CHOICES:
        raise SpaceError(f"{name}: at most {MAX_CHOICES} choices.")
    for value in values:
        if value is not None and not isinstance(value, bool | int | float | str):
            raise SpaceError(f"{name}: choices must be numbers, strings, true/false or null, not {value!r}.")
        if isinstance(value, float) and not math.isfinite(value):
            raise SpaceError(f"{name}: choices must be finite.")
    if len({repr(v) for v in values}) != len(values):
        raise SpaceError(f"{name}: a choice is listed twice.")
    return tuple(values)


def distribution(name: str, raw: Any) -> BaseDistribution:
    """One parameter's distribution; raises SpaceError with a message for people."""
    if not isinstance(name, str) or not name or len(name) > 64 or not set(name) <= NAME_CHARS:
        raise SpaceError(f"{name!r}: a parameter name is 1-64 letters, digits, '_', '.' or '-'.")
    if isinstance(raw, list):
        return CategoricalDistribution(_choices(name, raw))
    if not isinstance(raw, dict):
        raise SpaceError(f"{name}: give {{'type': ...}} or a list of choices.")
    kind = raw.get("type")
    unknown = set(raw) - {"type", "low", "high", "log", "step", "choices"}
    if unknown:
        raise SpaceError(f"{name}: unknown key(s) {', '.join(sorted(unknown))}.")
    if kind == "categorical":
        return CategoricalDistribution(_choices(name, raw.get("choices")))
    if kind not in ("float", "int"):
        raise SpaceError(f"{name}: 'type' must be float, int or categorical, not {kind!r}.")
    integer = kind == "int"
    if "low" not in raw or "high" not in raw:
        raise SpaceError(f"{name}: a {kind} needs 'low' and 'high'.")
    low = _number(name, "low", raw["low"], integer)
    high = _number(name, "high", raw["high"], integer)
    if low > high:
        raise SpaceError(f"{name}: 'low' ({low}) is above 'high' ({high}).")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(f"{name}: 'log' is true or false.")
    step = raw.get("step")
    if step is not None:
        step = _number(name, "step", step, integer)
        if step <= 0:
            raise SpaceError(f"{name}: 'step' must be positive.")
        if log:
            raise SpaceError(f"{name}: 'log' and 'step' cannot be combined.")
    if log and low <= 0:
        raise SpaceError(f"{name}: a log scale needs 'low' above 0.")
    if integer:
        return IntDistribution(int(low), int(high), log=log, step=int(step or 1))
    return FloatDistribution(float(low), float(high), log=log, step=None if step is None else float(step))


def distributions(space: Any) -> dict[str, BaseDistribution]:
    if not isinstance(space, dict) or not space:
        raise SpaceError("The search space needs at least one parameter.")
    if len(space) > MAX_PARAMETERS:
        raise SpaceError(f"At most {MAX_PARAMETERS} parameters.")
    return {name: distribution(name, raw) for name, raw in space.items()}


def grid_values(name: str, dist: BaseDistribution) -> list[Choice]:
    """Every value the grid sampler tries for one parameter."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution) and not dist.log:
        count = (dist.high - dist.low) // dist.step + 1
        if count > MAX_CHOICES:
            raise SpaceError(f"{name}: {count} grid values; at most {MAX_CHOICES}.")
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, FloatDistribution) and dist.step is not None:
        count = math.floor((dist.high - dist.low) / dist.step + 1e-9) + 1
        if count > MAX_CHOICES:
            raise SpaceError(f"{name}: {count} grid values; at most {MAX_CHOICES}.")
        return [round(dist.low + i * dist.step, 12) for i in range(count)]
    raise SpaceError(f"{name}: the grid sampler needs 'choices' or a 'step' (and no log scale).")


def grid(space: dict[str, Any]) -> dict[str, list[Choice]]:
    """The grid of a space, checked to be finite and at most MAX_GRID points."""
    values = {name: grid_values(name, dist) for name, dist in distributions(space).items()}
    size = math.prod(len(v) for v in values.values())
    if size > MAX_GRID:
        raise SpaceError(f"The grid has {size:,} points; at most {MAX_GRID:,}.")
    return values


def grid_size(space: dict[str, Any]) -> int:
    return math.prod(len(v) for v in grid(space).values())


def example(space: dict[str, Any]) -> dict[str, Choice]:
    """A point of the space (each low end or first choice), to check the job spec with."""
    point: dict[str, Choice] = {}
    for name, dist in distributions(space).items():
        if isinstance(dist, CategoricalDistribution):
            point[name] = dist.choices[0]
        elif isinstance(dist, IntDistribution):
            point[name] = int(dist.low)
        else:
            assert isinstance(dist, FloatDistribution)
            point[name] = float(dist.low)
    return point
