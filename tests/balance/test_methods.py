"""sky, milp and optimal-order: agreement with optimal and brute force, the paper's algorithms on known cases."""
from __future__ import annotations

import math

import pytest

from nebula.balance import AllocationError, DeviceProfile, LayerCost, allocate
from nebula.balance.cost import Problem
from nebula.balance.sky import coarse_allocation, optimize_workload

from ._instances import brute_force_orders, random_instance


def test_milp_agrees_with_optimal_for_a_fixed_order():
    checked = 0
    for seed in range(12):
        layers, devices = random_instance(300 + seed, 7 + seed % 5, 2 + seed % 3, comm=seed % 2 == 0)
        try:
            opt = allocate(layers, devices, "optimal")
        except AllocationError:
            with pytest.raises(AllocationError):
                allocate(layers, devices, "milp")
            continue
        got = allocate(layers, devices, "milp")
        assert got.notes["proven_optimal"]
        assert got.bottleneck_s == pytest.approx(opt.bottleneck_s, rel=1e-7)
        checked += 1
    assert checked >= 8


def test_optimal_order_equals_brute_force_over_orders():
    checked = 0
    for seed in range(25):
        layers, devices = random_instance(500 + seed, 5 + seed % 3, 2 + seed % 3, comm=seed % 3 != 0)
        best = brute_force_orders(layers, devices)
        if math.isinf(best):
            with pytest.raises(AllocationError, match="bytes"):
                allocate(layers, devices, "optimal-order")
            continue
        got = allocate(layers, devices, "optimal-order")
        assert got.notes["exact"] and got.gap == 0.0
        assert got.bottleneck_s == pytest.approx(best, rel=1e-12)
        assert sorted(got.order) == list(range(len(devices)))
        assert [devices[k] for k in got.order] == list(got.devices)
        checked += 1
    assert checked > 15


def test_optimal_order_search_beyond_exact_reports_a_valid_gap():
    layers, devices = random_instance(7, 40, 20, memory=False)
    got = allocate(layers, devices, "optimal-order")
    fixed = allocate(layers, devices, "optimal")
    assert not got.notes["exact"]
    assert got.bottleneck_s <= fixed.bottleneck_s  # the given order is one of its starting points
    assert 0 < got.lower_bound_s <= got.bottleneck_s and got.gap >= 0
    assert got.gap < 0.25  # the layer-count bound is close on uniform-ish layers


def test_order_lower_bound_holds_for_every_order_and_partition():
    from nebula.balance.optimal_order import order_lower_bound

    tight = 0
    for seed in range(60):
        layers, devices = random_instance(1100 + seed, 5 + seed % 3, 2 + seed % 3, memory=seed % 2 == 0)
        best = brute_force_orders(layers, devices)
        bound = order_lower_bound(layers, devices)
        assert bound <= best * (1 + 1e-12)
        tight += bound >= 0.8 * best
    assert tight > 20  # and it is not a trivial bound


def test_sky_coarse_allocation_moves_layers_off_a_full_device():
    layers = [LayerCost(1.0, 10.0, 0.0)] * 6
    devices = [DeviceProfile(1.0, 15.0), DeviceProfile(1.0, 40.0), DeviceProfile(1.0, 40.0)]
    assert coarse_allocation(Problem.of(layers), devices) == [0, 1, 4, 6]  # device 0 gives away, device 1 takes
    with pytest.raises(AllocationError, match="sky .*memory requirement.*bytes missing"):
        allocate(layers, [DeviceProfile(1.0, 5.0)] * 3, "sky")


def test_sky_fine_tuning_hands_the_last_layer_to_an_underloaded_next_device():
    # device 0 is slow: its workload is above the mean, the next device's below, and without its last layer
    # device 0 is still above the mean, so Algorithm 2 (line 11) hands that layer on.
    layers = [LayerCost(1.0, 1.0, 0.0)] * 6
    devices = [DeviceProfile(5.0, 100.0), DeviceProfile(1.0, 100.0), DeviceProfile(1.0, 100.0)]
    prob = Problem.of(layers)
    after = optimize_workload(prob, devices, [0, 2, 4, 6], max_iter=1)
    assert after[1] == 1  # workloads 10, 2, 2 (mean 4.67); without its last layer device 0 still has 5
    got = allocate(layers, devices, "sky")
    assert got.num_layers_per_device[0] == 1
    assert got.bottleneck_s >= allocate(layers, devices, "optimal").bottleneck_s


def test_sky_never_beats_optimal_and_respects_memory():
    for seed in range(30):
        layers, devices = random_instance(700 + seed, 10 + seed % 7, 2 + seed % 4)
        try:
            sky = allocate(layers, devices, "sky")
        except AllocationError:
            continue
        opt = allocate(layers, devices, "optimal")
        assert sky.bottleneck_s >= opt.bottleneck_s
        assert all(u <= d.memory_bytes for u, d in zip(sky.memory_used_bytes, sky.devices))


def test_sky_algorithm_1_can_fail_where_optimal_fits():
    # line 19 takes a layer only while dm[i] > am[i] + lm (strictly), so device 1 never fills its 7 bytes exactly
    # and device 2 keeps 4 bytes for its 3; the exact method finds [0, 3, 5, 6]
    layers = [LayerCost(1.0, float(m), 0.0) for m in (1, 1, 3, 4, 3, 1)]
    devices = [DeviceProfile(1.0, 6.0), DeviceProfile(1.0, 7.0), DeviceProfile(1.0, 3.0)]
    with pytest.raises(AllocationError, match=r"device #2 .*1 bytes missing; method 'optimal' finds a partition"):
        allocate(layers, devices, "sky")
    assert allocate(layers, devices, "optimal").bounds == (0, 3, 5, 6)


def test_optimal_order_names_the_missing_bytes_on_every_arrangement():
    layers = [LayerCost(1.0, 10.0, 0.0)] * 4
    with pytest.raises(AllocationError, match="needs 40 bytes and all 2 devices together have 30: 10 bytes missing"):
        allocate(layers, [DeviceProfile(1.0, 15.0, name="a"), DeviceProfile(1.0, 15.0, name="b")], "optimal-order")
    big = [LayerCost(1.0, 30.0, 0.0)] + [LayerCost(1.0, 1.0, 0.0)] * 3
    with pytest.raises(AllocationError, match="layer 0 needs 30 bytes but the largest device b has 20: 10 bytes"):
        allocate(big, [DeviceProfile(1.0, 15.0, name="a"), DeviceProfile(1.0, 20.0, name="b")], "optimal-order")
    # a fit exists only with the big device first: the fixed order fails, optimal-order reorders
    devices = [DeviceProfile(1.0, 5.0, name="small"), DeviceProfile(1.0, 40.0, name="large")]
    with pytest.raises(AllocationError, match="device small cannot hold even one layer"):
        allocate(big, devices, "optimal")
    got = allocate(big, devices, "optimal-order")
    assert [d.name for d in got.devices] == ["large", "small"] and got.order == (1, 0)
