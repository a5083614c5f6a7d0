"""Slowdown simulator: factors drawn as in the paper, real sleeps for compute and links, slowed device profiles."""
from __future__ import annotations

import math
import time

import pytest

from nebula.balance import DeviceProfile
from nebula.balance.simulate import LinkShape, Slowdown, draw_factors, draw_slowdowns, slowed_device


def test_factors_are_reproducible_normal_and_clipped():
    a = draw_factors(2000, seed=3)
    assert a == draw_factors(2000, seed=3) and a != draw_factors(2000, seed=4)
    assert min(a) == 1.0 and max(a) == 7.0  # the clip is reached on both sides
    inner = [x for x in a if 1.0 < x < 7.0]
    assert 3.7 < sum(inner) / len(inner) < 4.3


def test_apply_compute_sleeps_the_extra_time():
    s = Slowdown(compute=3.0)
    start = time.perf_counter()
    slept = s.apply_compute(0.02)
    assert slept == pytest.approx(0.04)
    assert time.perf_counter() - start >= 0.04
    with s.compute_block():
        t0 = time.perf_counter()
        spins = 0
        while time.perf_counter() - t0 < 0.01:  # 10 ms of real compute inside the block
            spins += 1
    assert time.perf_counter() - t0 >= 0.03  # 0.01 s of work plus twice that asleep
    assert Slowdown().apply_compute(1.0) == 0.0


def test_link_shape_and_slowed_device():
    link = LinkShape(latency_s=0.01, bandwidth_bytes_per_s=1e6)
    assert link.delay_s(5e5) == pytest.approx(0.51)
    base = DeviceProfile(1e-12, 8e9, 1e-4, 1e9, name="gpu0")
    dev = slowed_device(base, Slowdown(compute=2.5, link=link), memory_bytes=4e9, name="slow0")
    assert dev.time_per_flop_s == pytest.approx(2.5e-12)
    assert dev.latency_s == pytest.approx(0.0101)
    assert 1 / dev.bandwidth_bytes_per_s == pytest.approx(1 / 1e9 + 1 / 1e6)  # the two links in series
    assert (dev.memory_bytes, dev.name) == (4e9, "slow0")
    free = Slowdown().device(DeviceProfile(1e-12, 1.0))
    assert free.bandwidth_bytes_per_s == math.inf


def test_bad_slowdowns_are_rejected():
    with pytest.raises(ValueError, match="compute=0.5 must be a finite factor >= 1"):
        Slowdown(compute=0.5)
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s=0"):
        LinkShape(bandwidth_bytes_per_s=0)
    with pytest.raises(ValueError, match="one LinkShape per rank"):
        draw_slowdowns(3, seed=0, links=[LinkShape()])
    assert len(draw_slowdowns(3, seed=0)) == 3
