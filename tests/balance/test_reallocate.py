"""reallocate: optimal bottleneck after devices join or leave, with the fewest moved bytes among optimal plans."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from nebula.balance import AllocationError, DeviceProfile, LayerCost, allocate
from nebula.balance.cost import Problem
from nebula.balance.reallocate import reallocate

from ._instances import random_instance


def _moved(bounds, devices, owner, layers):
    return sum(layers[j].memory_bytes for k, d in enumerate(devices) for j in range(bounds[k], bounds[k + 1])
               if owner[j] != d.name)


def _brute_min_moves(layers, devices, owner, cap):
    prob, n, d = Problem.of(layers), len(layers), len(devices)
    best = None
    for cuts in itertools.combinations(range(1, n), d - 1):
        bounds = (0, *cuts, n)
        if all(prob.memory_bytes(bounds[k], bounds[k + 1]) <= dev.memory_bytes
               and prob.stage_time_s(dev, bounds[k], bounds[k + 1]) <= cap for k, dev in enumerate(devices)):
            m = _moved(bounds, devices, owner, layers)
            best = m if best is None else min(best, m)
    return best


def test_device_leaving_keeps_the_optimum_and_moves_the_fewest_bytes():
    checked = 0
    for seed in range(30):
        layers, devices = random_instance(900 + seed, 8 + seed % 4, 3 + seed % 2, memory=False)
        before = allocate(layers, devices, "optimal")
        gone = seed % len(devices)
        after_devices = devices[:gone] + devices[gone + 1:]
        r = reallocate(before, layers, after_devices, "optimal")
        fresh = allocate(layers, after_devices, "optimal")
        assert r.allocation.bottleneck_s == fresh.bottleneck_s == r.optimal_bottleneck_s
        owner = [d.name for k, d in enumerate(before.devices) for _ in before.layers_of(k)]
        assert r.moved_bytes == pytest.approx(_brute_min_moves(layers, after_devices, owner, fresh.bottleneck_s))
        assert r.moved_bytes <= _moved(fresh.bounds, after_devices, owner, layers) + 1e-6
        gone_name = devices[gone].name
        assert sum(m.bytes for m in r.moves if m.src is None) == pytest.approx(
            sum(layers[j].memory_bytes for j in before.layers_of(gone)))  # the leaver's layers come from checkpoint
        assert all(m.src != gone_name for m in r.moves)
        checked += 1
    assert checked == 30


def test_device_joining_and_tolerance_trade_time_for_fewer_moves():
    layers = [LayerCost(1e9, 10.0, 1.0) for _ in range(12)]
    devices = [DeviceProfile(1e-12, 1e9, name=n) for n in ("a", "b", "c")]
    before = allocate(layers, devices, "optimal")
    joined = devices + [DeviceProfile(1e-12, 1e9, name="d")]
    exact = reallocate(before, layers, joined, "optimal")
    assert exact.allocation.bottleneck_s == pytest.approx(3e-3)
    assert exact.moves and exact.moves[-1].dst == "d"
    loose = reallocate(before, layers, joined, "optimal", tolerance=0.5)
    assert loose.allocation.bottleneck_s <= 1.5 * exact.allocation.bottleneck_s
    assert loose.moved_bytes < exact.moved_bytes
    assert loose.moved_bytes == 10.0  # one layer to the newcomer is the least that gives it a stage


def test_reallocate_bad_input():
    layers = [LayerCost(1.0, 1.0, 0.0)] * 4
    named = [DeviceProfile(1.0, 9.0, name="a"), DeviceProfile(1.0, 9.0, name="b")]
    before = allocate(layers, named, "optimal")
    with pytest.raises(AllocationError, match="needs a name"):
        reallocate(before, layers, [DeviceProfile(1.0, 9.0)], "optimal")
    with pytest.raises(AllocationError, match="covers 4 layers, the model has 3"):
        reallocate(before, layers[:3], named, "optimal")
    with pytest.raises(ValueError, match="tolerance"):
        reallocate(before, layers, named, "optimal", tolerance=-1)
    with pytest.raises(AllocationError, match="bytes missing"):
        reallocate(before, layers, [dataclasses.replace(named[0], memory_bytes=2.0)], "optimal")


def test_reallocate_with_optimal_order_keeps_its_best_order():
    layers, devices = random_instance(42, 10, 4, memory=False)
    before = allocate(layers, devices, "optimal-order")
    rest = [d for d in devices if d.name != "d2"]
    r = reallocate(before, layers, rest, "optimal-order")
    fresh = allocate(layers, rest, "optimal-order")
    assert r.allocation.bottleneck_s == fresh.bottleneck_s
    assert r.allocation.method == "optimal-order" and sorted(r.allocation.order) == [0, 1, 2]
    assert all(m.dst != "d2" for m in r.moves)
