"""Random small allocation instances and a brute-force reference over every partition (and every order)."""
from __future__ import annotations

import itertools
import math
import random

from nebula.balance import DeviceProfile, LayerCost
from nebula.balance.cost import Problem


def random_instance(seed: int, num_layers: int, num_devices: int, comm: bool = True, memory: bool = True):
    """Layers with uneven FLOPs/memory/activations; devices with speeds 1..7x, optional links and memory caps."""
    rng = random.Random(seed)
    layers = [LayerCost(rng.uniform(1, 10) * 1e9, rng.uniform(1, 5) * 1e6, rng.uniform(0.5, 4) * 1e6)
              for _ in range(num_layers)]
    total = sum(x.memory_bytes for x in layers)
    devices = []
    for k in range(num_devices):
        cap = rng.uniform(0.4, 1.5) * total * 2 / num_devices if memory else math.inf
        devices.append(DeviceProfile(rng.uniform(1, 7) * 1e-12, cap,
                                     rng.uniform(0, 5e-3) if comm else 0.0,
                                     rng.uniform(0.5, 5) * 1e9 if comm else math.inf, name=f"d{k}"))
    return layers, devices


def brute_force(layers, devices):
    """(best bottleneck, bounds) over every contiguous partition in this order; (inf, None) if none fits."""
    prob = Problem.of(layers)
    n, d = len(layers), len(devices)
    best, arg = math.inf, None
    for cuts in itertools.combinations(range(1, n), d - 1):
        bounds = (0, *cuts, n)
        worst = 0.0
        for k, dev in enumerate(devices):
            a, b = bounds[k], bounds[k + 1]
            if prob.memory_bytes(a, b) > dev.memory_bytes:
                worst = math.inf
                break
            worst = max(worst, prob.stage_time_s(dev, a, b))
        if worst < best:
            best, arg = worst, bounds
    return best, arg


def brute_force_orders(layers, devices):
    """Best bottleneck over every order of the devices and every partition."""
    return min(brute_force(layers, list(p))[0] for p in itertools.permutations(devices))
