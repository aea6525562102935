"""Rows on a PS: lazy deterministic init, placement, and optimizer updates equal to torch's."""

from __future__ import annotations

import pytest
import torch

from workers.ps.optim import OptimizerConfig
from workers.ps.placement import initial_rows, ps_of_dense, split_rows
from workers.ps.store import RowBudget, RowBudgetExceeded, TableConfig, TableShard, coalesce


@pytest.mark.parametrize(
    "config",
    [
        OptimizerConfig("sgd", lr=0.3),
        OptimizerConfig("adagrad", lr=0.3, eps=1e-10, initial_accumulator=0.1),
        OptimizerConfig("adam", lr=0.05),
    ],
    ids=["sgd", "adagrad", "adam"],
)
def test_sparse_row_updates_equal_torch_sparse_optimizer(config: OptimizerConfig) -> None:
    # Given a PS table shard and a full torch table starting from the same lazy init
    table = TableShard(TableConfig("t", 8, 0.1, config), seed=5, budget=RowBudget(None))
    reference = torch.nn.Parameter(initial_rows(5, "t", torch.arange(200), 8, 0.1))
    optimizer = config.torch_sparse_optimizer([reference])
    generator = torch.Generator().manual_seed(0)
    for _ in range(6):
        # when both take the same sparse gradients (with duplicate ids)
        ids = torch.randint(0, 200, (40,), generator=generator)
        grads = torch.randn(40, 8, generator=generator)
        table.apply(*coalesce(ids, grads))
        reference.grad = torch.sparse_coo_tensor(ids[None], grads, (200, 8))
        optimizer.step()
    # then every row agrees, touched (stored) or not (still computed from the init)
    assert torch.allclose(table.read(torch.arange(200)), reference.detach(), atol=1e-6)
    assert 0 < table.rows < 200


def test_lazy_rows_are_a_function_of_seed_table_and_id() -> None:
    # Given the same ids asked in different orders and batches
    ids = torch.tensor([7, 3, 10_000_000_019, 3])
    once = initial_rows(1, "users", ids, 16, 0.05)
    again = torch.cat([initial_rows(1, "users", ids[i : i + 1], 16, 0.05) for i in range(4)])
    # then a row's values depend only on (seed, table, id)
    assert torch.equal(once, again) and torch.equal(once[1], once[3])
    assert not torch.equal(once, initial_rows(2, "users", ids, 16, 0.05))
    assert not torch.equal(once, initial_rows(1, "items", ids, 16, 0.05))
    # and they are N(0, std^2)
    many = initial_rows(0, "t", torch.arange(20_000), 16, 0.05)
    assert abs(float(many.mean())) < 1e-3 and abs(float(many.std()) - 0.05) < 1e-3


def test_placement_is_row_mod_m_and_a_stable_hash_for_dense() -> None:
    parts = split_rows(torch.tensor([0, 1, 2, 3, 4, 5, 6]), 3)
    assert [p.tolist() for p in parts] == [[0, 3, 6], [1, 4], [2, 5]]
    # crc32, not Python's per-process salted hash: the same in every worker and run
    assert ps_of_dense("dense/top.0.weight", 4) == ps_of_dense("dense/top.0.weight", 4)
    assert {ps_of_dense(f"dense/layer{i}", 4) for i in range(32)} == {0, 1, 2, 3}


def test_reads_store_nothing_and_the_row_budget_is_enforced_on_writes() -> None:
    table = TableShard(TableConfig("t", 4, 0.1, OptimizerConfig("adam", lr=0.1)), 0, RowBudget(10))
    table.read(torch.arange(1000))
    assert table.rows == 0
    table.apply(torch.arange(10), torch.ones(10, 4))
    with pytest.raises(RowBudgetExceeded, match="budget of 10 rows"):
        table.apply(torch.arange(10, 11), torch.ones(1, 4))
