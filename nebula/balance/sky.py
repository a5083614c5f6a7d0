"""`sky`: Sky Computing's heuristic, Algorithm 1 (coarse allocation by memory) then Algorithm 2 (workload fine-tuning).

Both algorithms are transcribed line by line from the paper (§IV-D); the partition index `pi` has length D+1 and
device i holds layers pi[i] .. pi[i+1]-1. Where the paper leaves a choice open, the comment marked AMBIGUOUS says
what this module does.
"""
from __future__ import annotations

from typing import Sequence

from nebula.balance.base import memory_shortfall, register_allocator
from nebula.balance.cost import Allocation, AllocationError, DeviceProfile, LayerCost, Problem, evaluate
from nebula.balance.even import even_bounds

__all__ = ["coarse_allocation", "optimize_workload", "allocate_sky", "DEFAULT_MAX_ITER"]

# AMBIGUOUS: the paper gives no value for max_iter; a sweep costs O(D), so a generous cap is cheap.
DEFAULT_MAX_ITER = 1000


def coarse_allocation(prob: Problem, devices: Sequence[DeviceProfile]) -> list[int]:
    """Algorithm 1: start even, then shift cut points until every device's layers fit its memory."""
    d = len(devices)
    dm = [dev.memory_bytes for dev in devices]
    pi = even_bounds(prob.num_layers, d)  # line 6: each device gets the same number of layers

    def am(i: int) -> float:  # allocated memory on device i (lines 8, 17, 21: always up to date)
        return prob.memory_bytes(pi[i], pi[i + 1])

    def num_layer(i: int) -> int:
        return pi[i + 1] - pi[i]

    # AMBIGUOUS: the paper's `while true` has no bound; a round that changes pi but never settles is stopped
    # after L*D rounds (each cut point can only take L positions) rather than looping forever.
    for _ in range(prob.num_layers * d + 1):
        if all(am(i) <= dm[i] for i in range(d)):  # line 11
            return pi
        before = list(pi)
        for i in range(d - 1):  # line 14
            while am(i) > dm[i] and num_layer(i) > 1:  # line 15: give the last layer to device i+1
                pi[i + 1] -= 1
            # line 19: take the next device's first layer while it still fits (num_layer checked first so that
            # lm[pi[i+1]] is a layer of device i+1)
            while num_layer(i + 1) > 1 and dm[i] > am(i) + prob.memory_bytes(pi[i + 1], pi[i + 1] + 1):
                pi[i + 1] += 1
        if pi == before:  # line 25
            break
    over = [(am(i) - dm[i], i) for i in range(d) if am(i) > dm[i]]
    missing, i = max(over) if over else (0.0, d - 1)
    hint = ("no partition in this device order fits" if memory_shortfall(prob, devices) is not None
            else "method 'optimal' finds a partition that fits")
    raise AllocationError(f"sky (Algorithm 1) cannot fulfil the memory requirement: device {devices[i].label(i)} "
                          f"holds layers {pi[i]}..{pi[i + 1] - 1} ({am(i):.0f} bytes), {missing:.0f} bytes missing; "
                          f"{hint}")


def optimize_workload(prob: Problem, devices: Sequence[DeviceProfile], pi: list[int],
                      max_iter: int = DEFAULT_MAX_ITER) -> list[int]:
    """Algorithm 2: sweep the devices, moving one layer at a cut toward the average workload, until pi settles."""
    d = len(devices)
    pi = list(pi)

    # AMBIGUOUS: the text defines a layer's workload as dt[i]*lf[j] + ct[i] summed over the device's layers, which
    # would charge the communication time once per layer, while the MILP charges it once per device. This module
    # uses the one stage-time model of nebula.balance.cost (compute plus sending the last activation) everywhere,
    # so the heuristic balances the same quantity the result is judged by.
    def workload(i: int, a: int, b: int) -> float:
        return prob.stage_time_s(devices[i], a, b)

    def fits(i: int, a: int, b: int) -> bool:
        return prob.memory_bytes(a, b) <= devices[i].memory_bytes

    counter = 0
    while counter < max_iter:  # line 3
        # AMBIGUOUS: the target is computed once per sweep (line 4, outside the for loop), while the workloads of
        # lines 7 and 11 are read from the partition as the sweep has changed it so far.
        target = sum(workload(i, pi[i], pi[i + 1]) for i in range(d)) / d
        before = list(pi)
        for i in range(d - 1):  # line 6
            this = workload(i, pi[i], pi[i + 1])
            if this < target and pi[i + 2] - pi[i + 1] > 1 and fits(i, pi[i], pi[i + 1] + 1):  # line 7
                pi[i + 1] += 1  # take the next device's first layer
            else:
                nxt = workload(i + 1, pi[i + 1], pi[i + 2])
                # AMBIGUOUS: "this device workload - this device last layer workload" is read as the workload the
                # device would have without its last layer (its communication term then follows the new last
                # layer), which is what the text means by "its remaining workload".
                remaining = workload(i, pi[i], pi[i + 1] - 1) if pi[i + 1] - pi[i] > 1 else 0.0
                if (nxt < target and remaining > target and pi[i + 1] - pi[i] > 1
                        and fits(i + 1, pi[i + 1] - 1, pi[i + 2])):  # line 11
                    pi[i + 1] -= 1  # hand the last layer to the under-loaded next device
        if pi == before or counter == max_iter:  # line 16
            return pi
        counter += 1
    return pi


@register_allocator("sky")
def allocate_sky(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile],
                 max_iter: int = DEFAULT_MAX_ITER) -> Allocation:
    """Sky Computing's heuristic: memory-driven coarse allocation, then workload fine-tuning."""
    prob = Problem.of(layers)
    pi = coarse_allocation(prob, devices)
    pi = optimize_workload(prob, devices, pi, max_iter=max_iter)
    return evaluate("sky", pi, prob, devices)
