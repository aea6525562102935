"""Optuna's part of a sweep: which parameters the next trial gets, and whether a running trial
is losing. Pure: plain values in, plain values out; no database.

Each decision rebuilds an in-memory study from the sweep's trials (``TrialRecord``s) and asks
it. Optuna keeps some bookkeeping in a trial's system attributes (the grid point it took,
successive halving's completed rungs); the rebuilt study starts from what the rows kept, and
what the decision added is handed back to be stored, so a study rebuilt after a controller
restart decides as the one before would have.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.distributions import BaseDistribution
from optuna.pruners import BasePruner, MedianPruner, NopPruner, SuccessiveHalvingPruner
from optuna.samplers import BaseSampler, GridSampler, RandomSampler, TPESampler
from optuna.trial import FrozenTrial, TrialState

from console.experiments import space as spaces

optuna.logging.set_verbosity(optuna.logging.WARNING)
log = logging.getLogger(__name__)

# A trial's state as optuna knows it, by TrialState of console/experiments/models.py.
_OPTUNA_STATES = {
    "RUNNING": TrialState.RUNNING,
    "COMPLETE": TrialState.COMPLETE,
    "PRUNED": TrialState.PRUNED,
    "FAILED": TrialState.FAIL,
    "STOPPED": TrialState.FAIL,
}


@dataclass(frozen=True)
class Settings:
    """What of a sweep the decisions depend on."""

    space: dict[str, Any]
    sampler: str  # "grid" | "random" | "tpe"
    seed: int
    direction: Literal["minimize", "maximize"]
    pruner: str  # "none" | "median" | "successive_halving"
    pruner_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrialRecord:
    number: int
    state: str  # console/experiments/models.py TrialState
    params: dict[str, Any]
    value: float | None = None
    intermediate: dict[int, float] = field(default_factory=dict)
    system_attrs: dict[str, Any] = field(default_factory=dict)


def _sampler(settings: Settings, number: int) -> BaseSampler:
    # The grid sampler shuffles its grid with its seed: one seed for the whole sweep, so every
    # rebuilt study numbers the grid points alike.
    if settings.sampler == "grid":
        return GridSampler(spaces.grid(settings.space), seed=settings.seed)
    # The others are seeded per trial number (consecutive seeds draw alike at first, so hashed):
    # trial N draws the same parameters however often the study is rebuilt, and with or without
    # a pruner (bench/experiments compares the two).
    digest = hashlib.sha256(f"{settings.seed}:{number}".encode()).digest()
    seed = int.from_bytes(digest[:4], "big") >> 1
    if settings.sampler == "random":
        return RandomSampler(seed=seed)
    return TPESampler(seed=seed)


def pruner_for(settings: Settings) -> BasePruner:
    options = settings.pruner_options
    if settings.pruner == "median":
        return MedianPruner(
            n_startup_trials=int(options.get("startup_trials", 5)),
            n_warmup_steps=int(options.get("warmup_steps", 0)),
        )
    if settings.pruner == "successive_halving":
        min_resource = options.get("min_resource", "auto")
        return SuccessiveHalvingPruner(
            min_resource=min_resource if min_resource == "auto" else int(min_resource),
            reduction_factor=int(options.get("reduction_factor", 3)),
            min_early_stopping_rate=int(options.get("min_early_stopping_rate", 0)),
        )
    return NopPruner()


def check_pruner(pruner: str, options: Any) -> dict[str, Any]:
    """The pruner's options, checked; raises ValueError with a message for people."""
    if not isinstance(options, dict):
        raise ValueError("pruner_options must be an object.")
    allowed = {
        "none": set(),
        "median": {"startup_trials", "warmup_steps"},
        "successive_halving": {"min_resource", "reduction_factor", "min_early_stopping_rate"},
    }[pruner]
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"unknown option(s) for the {pruner} pruner: {', '.join(sorted(unknown))}.")
    for key, value in options.items():
        if key == "min_resource" and value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key} must be a whole number of 0 or more.")
    if options.get("reduction_factor", 3) < 2:
        raise ValueError("reduction_factor must be at least 2.")
    if options.get("min_resource", 1) == 0:
        raise ValueError("min_resource must be at least 1 (or 'auto').")
    return dict(options)


def _frozen(record: TrialRecord, dists: dict[str, BaseDistribution], up_to: int | None = None) -> FrozenTrial:
    state = _OPTUNA_STATES[record.state]
    intermediate = {
        step: value for step, value in record.intermediate.items() if up_to is None or step <= up_to
    }
    value = record.value if state is TrialState.COMPLETE else None
    if state is TrialState.COMPLETE and (value is None or not math.isfinite(value)):
        state = TrialState.FAIL  # optuna refuses a complete trial without a finite value
        value = None
    params = {k: v for k, v in record.params.items() if k in dists}
    return optuna.trial.create_trial(
        state=state,
        value=value,
        params=params,
        distributions={k: dists[k] for k in params},
        intermediate_values=intermediate,
        system_attrs=dict(record.system_attrs),
    )


def _study(settings: Settings, trials: Sequence[TrialRecord], number: int) -> optuna.Study:
    study = optuna.create_study(
        direction=settings.direction,
        sampler=_sampler(settings, number),
        pruner=pruner_for(settings),
        storage=optuna.storages.InMemoryStorage(),
    )
    dists = spaces.distributions(settings.space)
    for record in sorted(trials, key=lambda r: r.number):
        study.add_trial(_frozen(record, dists))
    return study


@dataclass(frozen=True)
class Asked:
    params: dict[str, Any]
    system_attrs: dict[str, Any]


def ask(settings: Settings, trials: Sequence[TrialRecord]) -> Asked:
    """The parameters of the next trial (number ``len(trials)``)."""
    number = len(trials)
    study = _study(settings, trials, number)
    trial = study.ask(fixed_distributions=spaces.distributions(settings.space))
    frozen = study._storage.get_trial(trial._trial_id)
    return Asked(dict(trial.params), _plain(frozen.system_attrs))


def grid_exhausted(settings: Settings, trials: Sequence[TrialRecord]) -> bool:
    """The grid sampler has handed out every point (a grid sweep ends then, whatever its budget)."""
    if settings.sampler != "grid":
        return False
    taken = {r.system_attrs.get("grid_id") for r in trials}
    return len(taken - {None}) >= spaces.grid_size(settings.space)


@dataclass(frozen=True)
class Verdict:
    prune_at: int | None  # the step at which the trial was judged losing; None: it goes on
    checked_step: int | None  # the newest step judged
    system_attrs: dict[str, Any]


def judge(settings: Settings, trials: Sequence[TrialRecord], number: int, after: int | None) -> Verdict:
    """Whether running trial ``number`` is losing, at each step it reported after ``after``, in
    order (as optuna's ``report`` then ``should_prune`` would have been called)."""
    record = next(r for r in trials if r.number == number)
    steps = sorted(s for s in record.intermediate if after is None or s > after)
    if settings.pruner == "none" or not steps:
        return Verdict(None, steps[-1] if steps else after, dict(record.system_attrs))
    study = _study(settings, [r for r in trials if r.number != number], number)
    pruner = pruner_for(settings)
    dists = spaces.distributions(settings.space)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=_frozen(record, dists, -1))
    storage = study._storage
    for step in steps:
        storage.set_trial_intermediate_value(trial_id, step, record.intermediate[step])
        if pruner.prune(study, storage.get_trial(trial_id)):
            return Verdict(step, step, _plain(storage.get_trial(trial_id).system_attrs))
    return Verdict(None, steps[-1], _plain(storage.get_trial(trial_id).system_attrs))


def best(direction: str, values: Sequence[tuple[int, float]]) -> int | None:
    """The number of the best (trial number, value) pair; ties go to the earlier trial."""
    finite = [(n, v) for n, v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    sign = -1.0 if direction == "maximize" else 1.0
    return min(finite, key=lambda nv: (sign * nv[1], nv[0]))[0]


def _plain(attrs: dict[str, Any]) -> dict[str, Any]:
    """System attributes as JSON can hold them (optuna keeps tuples and floats; NaN → None)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return {str(k): clean(v) for k, v in attrs.items()}
