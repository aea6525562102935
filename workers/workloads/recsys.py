"""recsys-embedding: a DLRM-style click model on a generated click log with a planted signal.

Each impression has a user, an item, an item category, a bag of recently seen items (history)
and a few dense features. Every id carries a hidden weight; the click probability is a logistic
function of those weights (plus a user-item interaction and the dense features), so a model that
learns good embeddings reaches a high AUC while a constant predictor stays at 0.5. Ids follow a
power law, as in real logs, so popular rows are seen often and the long tail rarely.

The tables are ``nn.EmbeddingBag`` with sparse gradients (on CPU/gloo): only rows a batch touches
get a gradient, SparseAdam updates only those rows, and DDP all-reduces the sparse gradients.

With the ``parameter_server`` strategy (``train_ps``) the tables live on the PS processes
(``sdk.ps``), the examples come from the coordinator's shards, and the dense layers are on the PS
too (modes ``async``, ``sync``) or local and all-reduced by DDP among the workers (``hybrid``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from workers.workloads.catalog import parameter_server_examples
from workers.workloads.common import Runtime, Task, seeded

# P(id < k) = (k / rows) ** (1 / ID_SKEW): with 3, a tenth of impressions hit the top 0.1 % ids.
ID_SKEW = 3.0
HIDDEN = 64
EMBEDDING_STD = 0.05
TABLES = ("users", "items", "categories")


class ClickLog:
    """Deterministic generator of impressions (features and click labels)."""

    def __init__(self, hp: dict[str, Any]) -> None:
        self.rows = hp["rows"]
        self.small_rows = hp["small_rows"]
        self.bag_size = hp["bag_size"]
        self.dense = hp["dense_features"]
        truth = seeded(hp["seed"], 7919)
        self.user_weight = torch.randn(self.rows, generator=truth)
        self.item_weight = torch.randn(self.rows, generator=truth)
        self.category_weight = torch.randn(self.small_rows, generator=truth)
        self.item_category = torch.randint(0, self.small_rows, (self.rows,), generator=truth)
        self.dense_weight = torch.randn(self.dense, generator=truth) * 0.5

    def _ids(self, count: int, rows: int, generator: torch.Generator) -> torch.Tensor:
        uniform = torch.rand(count, generator=generator)
        return (uniform.pow(ID_SKEW) * rows).long().clamp_(max=rows - 1)

    def sample(self, count: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        users = self._ids(count, self.rows, generator)
        items = self._ids(count, self.rows, generator)
        categories = self.item_category[items]
        history = self._ids(count * self.bag_size, self.rows, generator).view(count, self.bag_size)
        dense = torch.randn(count, self.dense, generator=generator)
        logit = (
            self.user_weight[users]
            + self.item_weight[items]
            + 0.5 * self.category_weight[categories]
            + 0.7 * self.user_weight[users] * self.item_weight[items]
            + 0.8 * self.item_weight[history].mean(dim=1)
            + dense @ self.dense_weight
            - 1.0
        )
        clicks = torch.bernoulli(torch.sigmoid(logit), generator=generator)
        return dense, users, items, categories, history, clicks

    def examples(self, start: int, end: int, seed: int) -> tuple[torch.Tensor, ...]:
        """Examples [start, end) of the sharded click log (parameter_server strategy): a pure
        function of the range, so whichever worker is handed a batch sees the same data."""
        return self.sample(end - start, seeded(seed, 104729, start))


class DLRM(nn.Module):
    pair_index: torch.Tensor

    def __init__(self, hp: dict[str, Any], sparse: bool, tables: dict[str, nn.Module] | None = None) -> None:
        """``tables``: modules standing in for the three tables (``sdk.ps.ShardedEmbeddingBag``)."""
        super().__init__()
        dim = hp["dim"]
        self.users: nn.Module
        self.items: nn.Module
        self.categories: nn.Module
        if tables is not None:
            self.users, self.items, self.categories = tables["users"], tables["items"], tables["categories"]
        else:
            self.users = nn.EmbeddingBag(hp["rows"], dim, mode="mean", sparse=sparse)
            self.items = nn.EmbeddingBag(hp["rows"], dim, mode="mean", sparse=sparse)
            self.categories = nn.EmbeddingBag(hp["small_rows"], dim, mode="mean", sparse=sparse)
            for table in (self.users, self.items, self.categories):
                assert isinstance(table, nn.EmbeddingBag)
                nn.init.normal_(table.weight, std=EMBEDDING_STD)
        self.bottom = nn.Sequential(
            nn.Linear(hp["dense_features"], HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, dim)
        )
        vectors = 5
        pairs = vectors * (vectors - 1) // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
        self.register_buffer("pair_index", torch.triu_indices(vectors, vectors, offset=1), persistent=False)

    def forward(
        self,
        dense: torch.Tensor,
        users: torch.Tensor,
        items: torch.Tensor,
        categories: torch.Tensor,
        history: torch.Tensor,
    ) -> torch.Tensor:
        bottom = self.bottom(dense)
        vectors = torch.stack(
            [
                bottom,
                self.users(users[:, None]),
                self.items(items[:, None]),
                self.categories(categories[:, None]),
                self.items(history),
            ],
            dim=1,
        )
        # Pairwise dot products between all feature vectors: DLRM's interaction layer.
        products = torch.bmm(vectors, vectors.transpose(1, 2))
        pairs = products[:, self.pair_index[0], self.pair_index[1]]
        logits: torch.Tensor = self.top(torch.cat([bottom, pairs], dim=1)).squeeze(1)
        return logits

    def dense_part(self) -> nn.ModuleDict:
        """The layers that are not embedding tables (the PS strategy's dense parameters)."""
        return nn.ModuleDict({"bottom": self.bottom, "top": self.top})


class RecsysTask(Task):
    name = "recsys-embedding"

    def __init__(self, hp: dict[str, Any], runtime: Runtime) -> None:
        self.hp = hp
        self.runtime = runtime
        self.log = ClickLog(hp)
        # NCCL cannot all-reduce sparse tensors; on GPUs the tables get dense gradients.
        self.sparse = runtime.device.type == "cpu"
        torch.manual_seed(hp["seed"])
        self.model = DLRM(hp, self.sparse)
        held_out = self.log.sample(hp["eval_samples"], seeded(hp["seed"], -1))
        self.eval_batch = tuple(t.to(runtime.device) for t in held_out)

    def _tables(self) -> list[torch.Tensor]:
        model = self.model
        assert isinstance(model, DLRM)
        return [table.weight for table in (model.users, model.items, model.categories)]  # type: ignore[misc]

    def clip_parameters(self) -> list[torch.Tensor]:
        tables = {id(p) for p in self._tables()}
        return [p for p in self.model.parameters() if id(p) not in tables]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        tables = self._tables()
        embedding: torch.optim.Optimizer
        if self.sparse:
            embedding = torch.optim.SparseAdam(tables, lr=self.hp["embedding_lr"])
        else:
            embedding = torch.optim.Adam(tables, lr=self.hp["embedding_lr"])
        return [embedding, torch.optim.Adam(self.clip_parameters(), lr=self.hp["lr"])]

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, ...]:
        sample = self.log.sample(
            self.hp["batch_size"], seeded(self.hp["seed"], step, micro, self.runtime.rank)
        )
        return tuple(t.to(self.runtime.device) for t in sample)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        *features, clicks = batch
        logits = model(*features)
        return F.binary_cross_entropy_with_logits(logits.float(), clicks)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        from sklearn.metrics import roc_auc_score

        self.model.eval()
        *features, clicks = self.eval_batch
        with self.runtime.autocast():
            logits = self.model(*features).float()
        auc = roc_auc_score(clicks.cpu().numpy(), logits.cpu().numpy())
        return {"auc": float(auc), "ctr": float(clicks.mean())}


def auc(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> float:
    from sklearn.metrics import roc_auc_score

    model.eval()
    *features, clicks = batch
    with torch.no_grad():
        logits = model(*features).float()
    model.train()
    return float(roc_auc_score(clicks.cpu().numpy(), logits.cpu().numpy()))


def train_ps(
    hp: dict[str, Any], runtime: Runtime, on_batch: Callable[[Any, Any], None] | None = None
) -> None:
    """The ``parameter_server`` strategy: a PS worker under the environment contract of
    workers/ps/contract.py. Worker 0 logs the loss and AUC; every worker its throughput and
    staleness (``worker_*``). ``on_batch(session, batch)`` runs after each push (tests)."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    from workers import sdk
    from workers.sdk import ps as sdk_ps

    session = sdk_ps.connect(device=runtime.device)
    device = runtime.device
    log = ClickLog(hp)
    optimizer = sdk_ps.Adam(lr=hp["embedding_lr"])
    tables = {
        name: session.embedding_bag(name, hp["dim"], optimizer, init_std=EMBEDDING_STD) for name in TABLES
    }
    torch.manual_seed(hp["seed"])
    model = DLRM(hp, sparse=False, tables=dict(tables)).to(device)
    dense = model.dense_part()
    session.dense(dense, sdk_ps.Adam(lr=hp["lr"]))
    hybrid = session.mode is sdk_ps.Mode.HYBRID
    wrapped: nn.Module = model
    if hybrid and runtime.distributed:
        wrapped = DistributedDataParallel(
            model, device_ids=[runtime.local_rank] if device.type == "cuda" else None
        )
    # Fixed by the console at submission; the worker count is only a fallback for runs started
    # without the console (tests, bench/ps), whose workers all start together.
    examples = parameter_server_examples(hp, session.env.worker_count)
    dataset = sdk_ps.Dataset(examples, hp["batch_size"] * hp["shard_batches"], hp["batch_size"], hp["epochs"])
    held_out = tuple(t.to(device) for t in log.sample(hp["eval_samples"], seeded(hp["seed"], -1)))
    is_main = session.env.index == 0
    timer = sdk.StepTimer(every=hp["log_every"])
    sdk.install_stop_handler()
    window_loss = 0.0
    window = 0

    def evaluate(step: int, loss: float | None) -> None:
        session.refresh_dense()
        values = {"auc": auc(model, held_out)}
        if loss is not None:
            values["loss"] = loss
        sdk.log(step, **values)

    def train(batch: Any) -> float:
        step_number = session.pushes + 1
        with timer(step_number):
            features = tuple(t.to(device) for t in log.examples(batch.start, batch.end, hp["seed"]))
            dense_in, users, items, categories, history, clicks = features
            with session.step(batch) as step:
                step.prefetch(
                    {
                        "users": users,
                        "items": torch.cat([items, history.reshape(-1)]),
                        "categories": categories,
                    }
                )
                with runtime.autocast():
                    logits = wrapped(dense_in, users, items, categories, history)
                loss = F.binary_cross_entropy_with_logits(logits.float(), clicks)
                loss.backward()
                if hp["grad_clip"] > 0:
                    torch.nn.utils.clip_grad_norm_(dense.parameters(), hp["grad_clip"])
            timer.count(batch.examples)
        if on_batch is not None:
            on_batch(session, batch)
        return float(loss.detach())

    # Workers get uneven numbers of batches from the shard queue: Join keeps DDP's collectives
    # matched for the ones that run out first, one pass at a time (hybrid only; the PS modes
    # have no collectives and one pass).
    for batches in session.passes(dataset):
        joined = Join([wrapped]) if isinstance(wrapped, DistributedDataParallel) else contextlib.nullcontext()
        with joined:
            for batch in batches:
                window_loss += train(batch)
                window += 1
                if is_main and session.pushes % hp["log_every"] == 0:
                    evaluate(session.pushes, window_loss / window)
                    window_loss, window = 0.0, 0
                if sdk.stop_requested():
                    break
    if is_main:
        evaluate(max(1, session.pushes), window_loss / window if window else None)
    session.report()
    sdk.flush()
    session.close()
    print(f"worker {session.env.index}: {session.pushes} batches, {session.examples} examples", flush=True)
