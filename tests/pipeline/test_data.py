"""Example ids per step, rank and micro-batch: a pure function of the shared seed."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.pipeline import rank_micro_batches, step_ids


def test_one_epoch_visits_every_example_once():
    ids = np.concatenate([step_ids(s, seed=5, num_examples=64, global_batch=16) for s in range(4)])
    assert sorted(ids.tolist()) == list(range(64))
    again = np.concatenate([step_ids(s, seed=5, num_examples=64, global_batch=16) for s in range(4)])
    assert (ids == again).all()
    other = np.concatenate([step_ids(s, seed=6, num_examples=64, global_batch=16) for s in range(4)])
    assert (ids != other).any()


def test_steps_straddling_an_epoch_boundary():
    ids = step_ids(3, seed=1, num_examples=10, global_batch=4)  # positions 12..15 = epoch 1
    assert len(ids) == 4 and len(set(ids.tolist())) == 4
    straddle = step_ids(2, seed=1, num_examples=10, global_batch=4)  # positions 8, 9 | 10, 11
    assert len(straddle) == 4


def test_ranks_and_micro_batches_partition_the_step():
    ids = step_ids(0, seed=2, num_examples=100, global_batch=24)
    parts = [rank_micro_batches(ids, rank=r, world_size=3, micro_batches=2) for r in range(3)]
    flat = np.concatenate([m for p in parts for m in p])
    assert (flat == ids).all()
    assert all(len(m) == 4 for p in parts for m in p)
    with pytest.raises(ValueError, match="do not split evenly"):
        rank_micro_batches(ids, rank=0, world_size=5, micro_batches=1)


def test_choose_k_balances_the_two_sides():
    from nebula.pipeline import choose_k

    assert choose_k(1.0, 1.0) == 1
    assert choose_k(1.0, 8.0) == 8  # the paper's setting: receivers 8x slower than the sender
    assert choose_k(1.0, 7.6) == 8 and choose_k(1.0, 7.2) == 7
    assert choose_k(2.0, 1.0) == 1  # a slower sender never gets fewer than one receiver
    assert choose_k(1.0, 20.0, max_k=4) == 4
    with pytest.raises(ValueError, match="finite and > 0"):
        choose_k(0.0, 1.0)
