"""recsys-embedding and tiny-lm under 2-process gloo: both learn, and report their own metrics."""

from __future__ import annotations

from pathlib import Path

from tests.test_workload_digits import RankGroup, assert_learns, workload


def test_recsys_embedding_learns_the_planted_signal(tmp_path: Path) -> None:
    argv = workload(
        "recsys-embedding",
        "steps=60",
        "log_every=20",
        "rows=20000",
        "batch_size=256",
        "eval_samples=2048",
        "checkpoint_every=0",
        "watch_every=20",
    )
    with RankGroup(tmp_path, argv) as group:
        assert group.start().wait(timeout=180) == [0, 0], group.text()
        assert_learns(group, factor=0.95)
        auc = group.series("auc")
        assert [s for s, _ in auc] == [1, 20, 40, 60]
        assert auc[-1][1] > 0.6 and auc[-1][1] > auc[0][1] + 0.05, auc
        # Sparse gradients of the tables are measured too (coalesced), next to the dense layers.
        watched = next(r["values"] for r in group.records("metric") if "grad_norm" in r["values"])
        assert watched["grad_norm/users"] > 0 and watched["grad_norm/bottom.0"] > 0
        [checkpoint] = group.records("checkpoint")
        assert checkpoint["step"] == 60 and checkpoint["size_bytes"] > 20000 * 16 * 4 * 2


def test_tiny_lm_learns_and_reports_throughput_and_perplexity(tmp_path: Path) -> None:
    argv = workload(
        "tiny-lm",
        "steps=40",
        "log_every=20",
        "batch_size=8",
        "block_size=32",
        "width=64",
        "checkpoint_every=0",
    )
    with RankGroup(tmp_path, argv) as group:
        assert group.start().wait(timeout=180) == [0, 0], group.text()
        assert_learns(group, factor=0.8)
        perplexity = group.series("perplexity")
        assert perplexity[-1][1] < perplexity[0][1] * 0.5, perplexity
        tokens = group.series("tokens_per_s")
        assert tokens and all(value > 0 for _, value in tokens)
