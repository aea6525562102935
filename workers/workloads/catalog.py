"""The built-in workloads and their hyperparameters, without importing torch.

The console imports this module to validate job specs and to fill the submit form; the
workloads import it to read their own defaults, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Hyperparameter:
    default: Any
    type: type
    help: str
    minimum: float | None = None

    def check(self, name: str, value: Any) -> Any:
        expected = self.type
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and expected is not bool:
            raise ValueError(f"hyperparameter {name!r} must be {expected.__name__}, got a boolean")
        if not isinstance(value, expected):
            raise ValueError(
                f"hyperparameter {name!r} must be {expected.__name__}, got {type(value).__name__} {value!r}"
            )
        if self.minimum is not None and isinstance(value, int | float) and value < self.minimum:
            raise ValueError(f"hyperparameter {name!r} must be at least {self.minimum}, got {value!r}")
        return value

    def parse(self, name: str, text: str) -> Any:
        """Reads a ``--set name=text`` value."""
        try:
            if self.type is bool:
                lowered = text.strip().lower()
                if lowered not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(text)
                return lowered in ("1", "true", "yes")
            if self.type is int:
                return int(text)
            if self.type is float:
                return float(text)
        except ValueError:
            raise ValueError(f"hyperparameter {name!r} must be {self.type.__name__}, got {text!r}") from None
        return text


def _common(batch_size: int, lr: float, steps: int) -> dict[str, Hyperparameter]:
    return {
        "batch_size": Hyperparameter(batch_size, int, "samples per rank per micro-batch", 1),
        "lr": Hyperparameter(lr, float, "learning rate", 0),
        "steps": Hyperparameter(steps, int, "optimizer steps to run", 1),
        "checkpoint_every": Hyperparameter(100, int, "steps between checkpoints (0 = only on stop/end)", 0),
        "grad_clip": Hyperparameter(1.0, float, "clip the global gradient norm to this (0 = off)", 0),
        "log_every": Hyperparameter(10, int, "steps between loss/metric records", 1),
        "watch_every": Hyperparameter(100, int, "steps between gradient/parameter statistics", 1),
        "seed": Hyperparameter(0, int, "seed of the model and the data order"),
    }


@dataclass(frozen=True)
class WorkloadInfo:
    name: str
    description: str
    hyperparameters: dict[str, Hyperparameter] = field(default_factory=dict)
    # Trains through sdk.elastic: the console resizes it in place (survivors keep their processes).
    inplace: bool = False

    def defaults(self) -> dict[str, Any]:
        return {name: spec.default for name, spec in self.hyperparameters.items()}


WORKLOADS: dict[str, WorkloadInfo] = {
    "digits-mlp": WorkloadInfo(
        "digits-mlp",
        "MLP classifier on scikit-learn's bundled 8x8 digits images (DDP); logs loss and test accuracy.",
        {
            **_common(batch_size=64, lr=3e-3, steps=300),
            "hidden": Hyperparameter(128, int, "width of the two hidden layers", 1),
        },
        inplace=True,
    ),
    "recsys-embedding": WorkloadInfo(
        "recsys-embedding",
        "DLRM-style click model on a generated click log with a planted signal: sparse ids through "
        "EmbeddingBag tables, dense MLP, pairwise interactions, BCE loss; logs AUC.",
        {
            **_common(batch_size=512, lr=1e-3, steps=300),
            "embedding_lr": Hyperparameter(
                0.05, float, "learning rate of the embedding tables (sparse Adam)", 0
            ),
            "rows": Hyperparameter(1_000_000, int, "rows of each large id table (user, item)", 2),
            "small_rows": Hyperparameter(1000, int, "rows of the category table", 2),
            "dim": Hyperparameter(16, int, "embedding dimension", 1),
            "bag_size": Hyperparameter(4, int, "ids per sample in the history bag", 1),
            "dense_features": Hyperparameter(8, int, "dense input features", 1),
            "eval_samples": Hyperparameter(8192, int, "held-out samples for AUC", 64),
            "examples": Hyperparameter(
                0,
                int,
                "parameter_server strategy: examples per epoch (0 = steps x batch_size x the workers "
                "asked for at submission; fixed then, a resize does not change it)",
                0,
            ),
            "epochs": Hyperparameter(1, int, "parameter_server strategy: passes over the examples", 1),
            "shard_batches": Hyperparameter(
                4,
                int,
                "parameter_server strategy: batches per data shard (the unit re-queued when a worker is lost)",
                1,
            ),
        },
        inplace=True,
    ),
    "tiny-lm": WorkloadInfo(
        "tiny-lm",
        "Small GPT-style byte-level transformer on Python standard-library source text; "
        "logs tokens/s and perplexity.",
        {
            **_common(batch_size=16, lr=3e-3, steps=300),
            "block_size": Hyperparameter(64, int, "context length in bytes", 2),
            "layers": Hyperparameter(2, int, "transformer blocks", 1),
            "heads": Hyperparameter(4, int, "attention heads", 1),
            "width": Hyperparameter(128, int, "model width (divisible by heads)", 1),
            "dropout": Hyperparameter(0.0, float, "dropout probability", 0),
        },
        inplace=True,
    ),
}


def parameter_server_examples(hyperparameters: dict[str, Any], workers: int) -> int:
    """recsys-embedding's examples per epoch as a parameter-server job: ``examples``, or when 0
    steps x batch_size x ``workers``. The console fixes it when the job is submitted (with the
    worker count asked for then): every worker the job ever starts, a resize's too, must declare
    the same dataset to the coordinator, which refuses any other."""
    given = int(hyperparameters.get("examples") or 0)
    return given or int(hyperparameters["steps"]) * int(hyperparameters["batch_size"]) * max(1, workers)


def validate_hyperparameters(name: str, values: dict[str, Any] | None) -> dict[str, Any]:
    """Checks ``values`` against workload ``name``; returns the full set with defaults filled in."""
    info = WORKLOADS.get(name)
    if info is None:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(sorted(WORKLOADS))}")
    values = dict(values or {})
    unknown = sorted(set(values) - set(info.hyperparameters))
    if unknown:
        raise ValueError(
            f"unknown hyperparameter(s) for {name}: {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(info.hyperparameters))}"
        )
    result = info.defaults()
    for key, value in values.items():
        result[key] = info.hyperparameters[key].check(key, value)
    if name == "tiny-lm" and result["width"] % result["heads"]:
        raise ValueError(
            f"hyperparameter 'width' ({result['width']}) must be divisible by 'heads' ({result['heads']})"
        )
    return result


def parse_overrides(name: str, pairs: list[str]) -> dict[str, Any]:
    """Turns ``["lr=0.1", "steps=5"]`` into typed values for workload ``name``."""
    info = WORKLOADS.get(name)
    if info is None:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(sorted(WORKLOADS))}")
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        spec = info.hyperparameters.get(key)
        if spec is None:
            raise ValueError(
                f"unknown hyperparameter for {name}: {key}; allowed: {', '.join(sorted(info.hyperparameters))}"
            )
        parsed[key] = spec.parse(key, text)
    return parsed
