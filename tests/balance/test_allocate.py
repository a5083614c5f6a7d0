"""`allocate`: even and optimal against brute force, memory caps, the slow-first case, bad input."""
from __future__ import annotations

import itertools
import math

import pytest

from nebula.balance import Allocation, AllocationError, DeviceProfile, LayerCost, allocate
from nebula.balance.cost import Problem
from nebula.balance.even import even_bounds

from ._instances import brute_force, random_instance


@pytest.mark.parametrize("comm", [False, True])
def test_optimal_equals_brute_force_on_random_instances(comm):
    checked = 0
    for seed in range(60):
        n, d = 4 + seed % 6, 1 + seed % 4
        layers, devices = random_instance(seed, n, d, comm=comm)
        best, _ = brute_force(layers, devices)
        if math.isinf(best):
            with pytest.raises(AllocationError, match="bytes missing"):
                allocate(layers, devices, "optimal")
            continue
        got = allocate(layers, devices, "optimal")
        assert got.bottleneck_s == pytest.approx(best, rel=1e-12)
        assert got.lower_bound_s == got.bottleneck_s
        checked += 1
    assert checked > 30  # most instances are feasible, so the comparison is not vacuous


def test_memory_caps_always_respected():
    for seed in range(40):
        layers, devices = random_instance(100 + seed, 12, 4)
        for method in ("even", "optimal"):
            try:
                a = allocate(layers, devices, method)
            except AllocationError:
                continue
            for k, dev in enumerate(a.devices):
                assert a.memory_used_bytes[k] <= dev.memory_bytes
                assert a.memory_used_bytes[k] == pytest.approx(sum(layers[j].memory_bytes for j in a.layers_of(k)))


def test_stage_time_model_charges_compute_and_the_last_activation():
    layers = [LayerCost(100.0, 1.0, 10.0), LayerCost(200.0, 1.0, 20.0), LayerCost(300.0, 1.0, 40.0)]
    devices = [DeviceProfile(0.5, 10.0, 1.0, 2.0), DeviceProfile(1.0, 10.0, 3.0, 4.0)]
    a = allocate(layers, devices, "even")  # device 0: layers 0,1; device 1: layer 2
    assert a.bounds == (0, 2, 3)
    assert a.stage_times_s == (0.5 * 300 + 1.0 + 20.0 / 2.0, 300.0)  # the last device sends nothing on
    assert a.bottleneck_s == 300.0
    assert a.memory_used_bytes == (2.0, 1.0)


def test_even_splits_counts_evenly():
    assert even_bounds(10, 4) == [0, 3, 6, 8, 10]
    layers = [LayerCost(1.0, 1.0, 0.0)] * 10
    devices = [DeviceProfile(1.0, 100.0)] * 4
    assert allocate(layers, devices, "even").num_layers_per_device == (3, 3, 2, 2)


def _only_toward_earlier(layers, devices):
    """Best bottleneck among partitions whose cut points are all >= even's (layers only moved to earlier devices)."""
    prob, n, d = Problem.of(layers), len(layers), len(devices)
    start = even_bounds(n, d)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), d - 1):
        bounds = (0, *cuts, n)
        if any(b < e for b, e in zip(bounds, start)):
            continue
        best = min(best, max(prob.stage_time_s(dev, bounds[k], bounds[k + 1]) for k, dev in enumerate(devices)))
    return best


def test_slow_device_first_gets_fewer_layers():
    layers = [LayerCost(1e9, 1.0, 0.0)] * 12
    devices = [DeviceProfile(6e-12, 1e3, name="slow"), DeviceProfile(1e-12, 1e3, name="fast1"),
               DeviceProfile(1e-12, 1e3, name="fast2")]
    opt = allocate(layers, devices, "optimal")
    ev = allocate(layers, devices, "even")
    assert opt.num_layers_per_device[0] < ev.num_layers_per_device[0] == 4
    assert opt.num_layers_per_device[0] == 1 and opt.bottleneck_s == pytest.approx(6e-3)
    # fine-tuning that only hands layers to earlier devices can never shrink the slow first device's range
    assert opt.bottleneck_s < _only_toward_earlier(layers, devices)
    assert opt.bottleneck_s < ev.bottleneck_s


def test_infeasible_names_device_and_missing_bytes():
    layers = [LayerCost(1.0, 100.0, 0.0)] * 4
    devices = [DeviceProfile(1.0, 250.0, name="big"), DeviceProfile(1.0, 50.0, name="tiny")]
    with pytest.raises(AllocationError, match=r"device tiny .*50 bytes missing"):
        allocate(layers, devices, "optimal")
    devices = [DeviceProfile(1.0, 150.0, name="a"), DeviceProfile(1.0, 150.0, name="b")]
    with pytest.raises(AllocationError, match=r"device b .*: 150 bytes missing"):
        allocate(layers, devices, "optimal")
    with pytest.raises(AllocationError, match=r"device a .*bytes missing"):
        allocate(layers, devices, "even")


@pytest.mark.parametrize("kwargs, match", [
    (dict(time_per_flop_s=0.0, memory_bytes=1.0), "time_per_flop_s=0.0 must be a finite number > 0"),
    (dict(time_per_flop_s=-1e-12, memory_bytes=1.0), "time_per_flop_s"),
    (dict(time_per_flop_s=1e-12, memory_bytes=0), "memory_bytes=0 must be > 0"),
    (dict(time_per_flop_s=1e-12, memory_bytes=-5.0), "memory_bytes"),
    (dict(time_per_flop_s=1e-12, memory_bytes=1.0, bandwidth_bytes_per_s=0.0), "bandwidth_bytes_per_s"),
    (dict(time_per_flop_s=1e-12, memory_bytes=1.0, latency_s=-1.0), "latency_s"),
])
def test_bad_device_values_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DeviceProfile(**kwargs)


def test_bad_layer_values_and_problem_shape_are_rejected():
    with pytest.raises(ValueError, match="flops"):
        LayerCost(-1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="memory_bytes"):
        LayerCost(1.0, math.nan, 1.0)
    layers = [LayerCost(1.0, 1.0, 0.0)] * 2
    devices = [DeviceProfile(1.0, 10.0)] * 3
    with pytest.raises(AllocationError, match="2 layers cannot be split over 3 devices"):
        allocate(layers, devices, "optimal")
    with pytest.raises(ValueError, match="unknown allocation method 'fastest'; known methods: even, milp, optimal"):
        allocate(layers, devices[:1], "fastest")
    with pytest.raises(AllocationError, match="name 'x' is used twice"):
        allocate(layers, [DeviceProfile(1.0, 9.0, name="x")] * 2, "even")


def test_allocation_rows_describe_each_device():
    layers = [LayerCost(1.0, 2.0, 0.0)] * 5
    devices = [DeviceProfile(1.0, 10.0, name="a"), DeviceProfile(2.0, 10.0)]
    a: Allocation = allocate(layers, devices, "optimal")
    rows = a.rows()
    assert [r["device"] for r in rows] == ["a", "#1"]
    assert sum(r["num_layers"] for r in rows) == 5
    assert rows[0]["memory_limit_bytes"] == 10.0
