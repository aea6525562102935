"""The workload catalogue the console validates job specs with: defaults, types, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_workload_digits import REPO
from workers.workloads.catalog import WORKLOADS, parse_overrides, validate_hyperparameters


def test_catalogue_lists_the_three_workloads_with_typed_defaults() -> None:
    assert set(WORKLOADS) == {"digits-mlp", "recsys-embedding", "tiny-lm"}
    for info in WORKLOADS.values():
        assert info.description
        for key in ("batch_size", "lr", "steps", "checkpoint_every", "grad_clip"):
            spec = info.hyperparameters[key]
            assert isinstance(spec.default, spec.type) and spec.help
    assert WORKLOADS["recsys-embedding"].defaults()["rows"] >= 1_000_000


def test_validation_fills_defaults_and_coerces_ints_to_floats() -> None:
    values = validate_hyperparameters("digits-mlp", {"lr": 1, "steps": 5})
    assert values["lr"] == 1.0 and isinstance(values["lr"], float)
    assert values["steps"] == 5 and values["batch_size"] == 64
    assert validate_hyperparameters("tiny-lm", None) == WORKLOADS["tiny-lm"].defaults()


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("nope", {}, "unknown workload 'nope'; choose one of: digits-mlp, recsys-embedding, tiny-lm"),
        ("digits-mlp", {"learning_rate": 0.1}, "unknown hyperparameter(s) for digits-mlp: learning_rate"),
        ("digits-mlp", {"steps": 2.5}, "hyperparameter 'steps' must be int, got float 2.5"),
        ("digits-mlp", {"steps": True}, "hyperparameter 'steps' must be int, got a boolean"),
        ("digits-mlp", {"lr": "fast"}, "hyperparameter 'lr' must be float, got str 'fast'"),
        ("digits-mlp", {"batch_size": 0}, "hyperparameter 'batch_size' must be at least 1, got 0"),
        ("tiny-lm", {"width": 100, "heads": 3}, "'width' (100) must be divisible by 'heads' (3)"),
    ],
)
def test_bad_hyperparameters_get_a_clear_error(name: str, values: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        validate_hyperparameters(name, values)
    assert message in str(caught.value)


def test_command_line_overrides_are_typed() -> None:
    assert parse_overrides("recsys-embedding", ["rows=5000", "lr=0.01"]) == {"rows": 5000, "lr": 0.01}
    with pytest.raises(ValueError, match="must be int, got 'many'"):
        parse_overrides("digits-mlp", ["steps=many"])
    with pytest.raises(ValueError, match="expects key=value"):
        parse_overrides("digits-mlp", ["steps"])


def test_the_catalogue_does_not_import_torch() -> None:
    probe = "import sys, workers.workloads.catalog; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr
