"""tiny-lm: a small GPT-style byte-level transformer on Python standard-library source text.

The corpus ships with every Python installation (no download) and is real text with structure a
small model learns quickly: indentation, keywords, identifiers, docstrings.
"""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from workers.workloads.common import Runtime, Task, seeded

CORPUS_MODULES = (
    "argparse.py",
    "textwrap.py",
    "string.py",
    "functools.py",
    "contextlib.py",
    "dataclasses.py",
    "json/decoder.py",
    "json/encoder.py",
    "heapq.py",
    "bisect.py",
    "fractions.py",
    "shlex.py",
)
VOCAB = 256
EVAL_BATCHES = 4


def load_corpus() -> torch.Tensor:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [(stdlib / name).read_bytes() for name in CORPUS_MODULES if (stdlib / name).exists()]
    if not parts:
        raise FileNotFoundError(f"no corpus files under {stdlib}")
    return torch.frombuffer(bytearray(b"\n".join(parts)), dtype=torch.uint8).long()


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, block_size: int, layers: int, heads: int, width: int, dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.tokens.weight
        # Small initial weights: with the tied head, N(0, 1) embeddings start at a loss near 18.
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


class TinyLMTask(Task):
    name = "tiny-lm"

    def __init__(self, hp: dict[str, Any], runtime: Runtime) -> None:
        self.hp = hp
        self.runtime = runtime
        corpus = load_corpus()
        split = int(len(corpus) * 0.9)
        self.train_data = corpus[:split]
        self.val_data = corpus[split:]
        torch.manual_seed(hp["seed"])
        self.model = TinyGPT(hp["block_size"], hp["layers"], hp["heads"], hp["width"], hp["dropout"])

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.AdamW(self.model.parameters(), lr=self.hp["lr"], weight_decay=0.01)]

    def _windows(self, data: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.hp["block_size"]
        starts = torch.randint(0, len(data) - size - 1, (self.hp["batch_size"],), generator=generator)
        offsets = torch.arange(size + 1)
        windows = data[starts[:, None] + offsets].to(self.runtime.device)
        return windows[:, :-1], windows[:, 1:]

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._windows(self.train_data, seeded(self.hp["seed"], step, micro, self.runtime.rank))

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))

    def tokens(self, batch: Any) -> int:
        return int(batch[0].numel())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        total = 0.0
        for index in range(EVAL_BATCHES):
            # Fixed windows: the perplexity of successive records is comparable.
            inputs, targets = self._windows(self.val_data, seeded(self.hp["seed"], -1, index))
            with self.runtime.autocast():
                logits = self.model(inputs)
            total += float(F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1)))
        val_loss = total / EVAL_BATCHES
        return {"val_loss": val_loss, "perplexity": math.exp(min(val_loss, 50.0))}
