"""digits-mlp: an MLP on scikit-learn's bundled 8x8 digits (1,797 images, no download)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from workers.workloads.common import Runtime, Task, seeded

# The last 297 images are held out for accuracy: the same split on every rank and every run.
TEST_SIZE = 297


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    features = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    return features, labels


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


class DigitsTask(Task):
    name = "digits-mlp"

    def __init__(self, hp: dict[str, Any], runtime: Runtime) -> None:
        self.hp = hp
        self.runtime = runtime
        features, labels = load_digits_tensors()
        device = runtime.device
        self.train_x = features[:-TEST_SIZE].to(device)
        self.train_y = labels[:-TEST_SIZE].to(device)
        self.test_x = features[-TEST_SIZE:].to(device)
        self.test_y = labels[-TEST_SIZE:].to(device)
        torch.manual_seed(hp["seed"])
        self.model = build_model(hp["hidden"])

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(self.model.parameters(), lr=self.hp["lr"])]

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = seeded(self.hp["seed"], step, micro, self.runtime.rank)
        index = torch.randint(0, len(self.train_x), (self.hp["batch_size"],), generator=generator)
        index = index.to(self.train_x.device)
        return self.train_x[index], self.train_y[index]

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        features, labels = batch
        return F.cross_entropy(model(features), labels)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        with self.runtime.autocast():
            logits = self.model(self.test_x)
        accuracy = (logits.argmax(dim=1) == self.test_y).float().mean()
        test_loss = F.cross_entropy(logits.float(), self.test_y)
        return {"accuracy": float(accuracy), "test_loss": float(test_loss)}
