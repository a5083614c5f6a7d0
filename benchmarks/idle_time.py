"""Idle time and server bandwidth in federated training: FedOptima against synchronous FedAvg and offloading
without auxiliary networks (OAFL), and OWL's worker-assisted distribution against server-only distribution.

    .venv/bin/python benchmarks/idle_time.py [--wall-s 30] [--settings a,b] [--speeds-a 4,6,8,16]
                                             [--speeds-b 8,16,24,32,48] [--omega N] [--workers 2,4,8]
                                             [--rate-mbit 100] [--skip-owl] [--skip-fedoptima]

Part 1 (FedOptima) runs every method for the same virtual wall time on heterogeneous simulated devices
(`nebula.federated.fedoptima.simulate`) in the paper's two image-classification settings (its Table II and III):
Testbed A, VGG-5 on CIFAR-10-shaped images with 8 Raspberry Pis in four groups at 50 Mbit/s, and Testbed B,
MobileNetV3-Large on Tiny-ImageNet-shaped images with 16 Jetson Nanos in four GPU-clock groups at 100 Mbit/s
(images synthetic: no CIFAR-10 or Tiny ImageNet here). The split point comes from the pre-processor's rule; the
paper does not give its servers' speed against the devices', so each setting runs at the server speeds given
(multiples of the fastest device). Training is real (Paddle SGD, Dirichlet(0.5) non-IID over the devices), time
is the cost model's (FLOPs / FLOP/s, bytes / bandwidth). omega defaults to 2 x the devices, which keeps
FedOptima's server memory below OAFL's (printed). Testbed B is timed without training (16 MobileNets would take
this machine hours; the times are the cost model's either way), so it reports no accuracy.

Part 2 (OWL) runs for real: a server in cluster A and 2, 4, 8 workers in cluster B (threads, each its own
authenticated endpoint) through two TLS switch servers whose WAN link is shaped to `--rate-mbit`; server egress
bytes and round time per round, OWL against the server sending every worker the whole model. BLAS threads are
pinned to 1.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import dataclasses
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from _federation import Federation  # benchmarks/ is this script's directory

NUM_CLASSES, DIM = 10, 32
PAPER = {"server_idle_cut": 0.939, "device_idle_cut": 0.818, "throughput_gain": (1.1, 2.0)}
# Testbed A (the paper's Table II): two Raspberry Pis per group, a: Pi 3B at 600 MHz, b: Pi 3B at 1.2 GHz,
# c: Pi 4B at 1.2 GHz, d: Pi 4B at 1.8 GHz. Slowdown against d = clock ratio x 2 for the Pi 3B's Cortex-A53
# against the Pi 4B's Cortex-A72 (about half the floating-point work per clock).
TESTBED_A = (6.0, 6.0, 3.0, 3.0, 1.5, 1.5, 1.0, 1.0)
PI4_FLOPS = 4e9  # a Pi 4B at 1.8 GHz training a small CNN on its four cores, about 4 GFLOP/s
# Testbed B: four Jetson Nanos per group with the GPU at 240, 320, 640 and 921 MHz: slowdown = 921 MHz / clock.
TESTBED_B = tuple(f for f in (921 / 240, 921 / 320, 921 / 640, 1.0) for _ in range(4))
NANO_FLOPS = 25e9  # a Nano's GPU at 921 MHz training MobileNetV3: about a tenth of its 236 GFLOP/s FP32 peak
IMAGE = (3, 32, 32)  # CIFAR-10's shape
TINY = (3, 64, 64)  # Tiny ImageNet's shape
TINY_CLASSES = 200


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    centers = np.random.default_rng(7).standard_normal((NUM_CLASSES, DIM)).astype(np.float32) * 0.6
    rng = np.random.default_rng(seed)
    y = rng.integers(0, NUM_CLASSES, n)
    return (centers[y] + rng.standard_normal((n, DIM)).astype(np.float32)).astype(np.float32), y.astype(np.int64)


def _batches(k: int, batch: int = 32):
    x, y = _data(3000, 100 + k)
    rng = np.random.default_rng(k)
    p = rng.dirichlet([0.5] * NUM_CLASSES)  # non-IID as the paper splits (Dirichlet prior 0.5)
    idx = rng.choice(len(y), size=len(y), p=p[y] / p[y].sum())
    x, y = x[idx], y[idx]
    while True:
        for i in range(0, len(y) - batch + 1, batch):
            yield x[i : i + batch], y[i : i + batch]


def _templates(classes: int, shape: tuple[int, int, int]) -> np.ndarray:
    """One low-frequency pattern per class (noise at 1/4 of the resolution blown up 4x)."""
    t = np.random.default_rng(11).standard_normal((classes, shape[0], shape[1] // 4, shape[2] // 4))
    return np.kron(t.astype(np.float32), np.ones((1, 1, 4, 4), np.float32)) * 0.35


class _ImageTask:
    """Synthetic images of `shape` in `num_classes` classes (one pattern per class under unit noise), each device's
    batches drawn from its own Dirichlet(0.5) class mix, as the paper splits its datasets."""

    num_classes = NUM_CLASSES
    shape = IMAGE

    def __init__(self, batch: int = 32) -> None:
        self.batch = batch
        self._t = _templates(self.num_classes, self.shape)

    def _images(self, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self._t[y] + rng.standard_normal((len(y), *self.shape)).astype(np.float32)

    def sample(self) -> np.ndarray:
        return self._images(np.arange(4) % self.num_classes, np.random.default_rng(99))

    def batches(self, k: int, num: int):
        rng = np.random.default_rng(100 + k)
        p = rng.dirichlet([0.5] * self.num_classes)
        while True:
            y = rng.choice(self.num_classes, size=self.batch, p=p).astype(np.int64)
            yield self._images(y, rng), y

    def test_data(self):
        rng = np.random.default_rng(5)
        y = rng.integers(0, self.num_classes, 500).astype(np.int64)
        return self._images(y, rng), y


class Vgg5Task(_ImageTask):
    """The paper's Testbed A image task: VGG-5 (CONV-3-32, CONV-3-64 x 2, FC-128, FC-10, each conv block with
    ReLU and the first two with 2x2 max pooling) on CIFAR-10-shaped images."""

    def layers(self) -> list:
        import paddle
        import paddle.nn as nn

        paddle.seed(0)
        return [nn.Conv2D(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2), nn.Conv2D(32, 64, 3, padding=1),
                nn.ReLU(), nn.MaxPool2D(2), nn.Conv2D(64, 64, 3, padding=1), nn.ReLU(), nn.Flatten(),
                nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, NUM_CLASSES)]


class MobileNetTask(_ImageTask):
    """The paper's Testbed B image task: MobileNetV3-Large (Paddle's, 200 classes) on Tiny-ImageNet-shaped images,
    as its sequence of 23 layers (stem, 15 bottlenecks, last conv, pooling and the classifier's layers)."""

    num_classes = TINY_CLASSES
    shape = TINY

    def layers(self) -> list:
        import paddle
        import paddle.nn as nn
        from paddle.vision.models import mobilenet_v3_large

        paddle.seed(0)
        net = mobilenet_v3_large(num_classes=self.num_classes)
        return [net.conv, *net.blocks, net.lastconv, net.avgpool, nn.Flatten(), *net.classifier]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One of the paper's image-classification settings as the simulator runs it."""

    title: str
    task: type
    slowdown: tuple[float, ...]  # one per device, against the fastest
    device_flops: float  # the fastest device's FLOP/s (an estimate: the paper gives clock rates)
    mbit: float  # per device link
    train: bool  # False: timed only (MobileNetV3 on 16 devices would take this machine hours)


SETTINGS = {
    "a": Setting("Testbed A: VGG-5 on CIFAR-10-shaped images", Vgg5Task, TESTBED_A, PI4_FLOPS, 50.0, True),
    "b": Setting("Testbed B: MobileNetV3-Large on Tiny-ImageNet-shaped images", MobileNetTask, TESTBED_B, NANO_FLOPS,
                 100.0, False),
}


class TowersTask:
    """OWL's task: four parallel towers (the branches), then a classifier."""

    def __init__(self, width: int) -> None:
        self.width = width

    def model(self):
        import paddle
        import paddle.nn as nn

        from nebula.federated.owl.model import Parallel

        paddle.seed(0)
        w = self.width
        towers = [nn.Sequential(nn.Linear(DIM, w), nn.ReLU(), nn.Linear(w, w // 2)) for _ in range(4)]
        return nn.Sequential(Parallel(*towers), nn.ReLU(), nn.Linear(4 * (w // 2), NUM_CLASSES))

    def batches(self, k: int, num: int):
        return _batches(k)

    def test_data(self):
        return _data(2000, 5)


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def _acc(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def fedoptima_part(st: Setting, wall_s: float, omega: int | None, speeds: tuple[int, ...], h: int) -> list[float]:
    """Part 1: the three methods at each server speed on one of the paper's settings; measured values and ratios.
    Returns FedOptima's server idle cut against the best baseline at each speed."""
    from nebula.federated.fedoptima.simulate import SimSetting, simulate
    from nebula.federated.fedoptima.split import DeviceInfo, profile_layers, split_point

    import paddle

    title, slowdown, flops, mbit, train = st.title, st.slowdown, st.device_flops, st.mbit, st.train
    task = st.task()
    layers = task.layers()
    prof = profile_layers(layers, paddle.to_tensor(task.sample()))
    bw = mbit * 1e6 / 8
    split = split_point(prof, [DeviceInfo(flops_per_s=flops / f, bandwidth_bytes_per_s=bw) for f in slowdown])
    batch = task.batch
    act_mb = batch * prof[split - 1].output_bytes / 1e6
    srv_mb = sum(int(np.prod(p.shape)) * 4 for layer in layers[split:] for p in layer.parameters()) / 1e6
    k = len(slowdown)
    omega = omega or 2 * k
    print(f"\n## FedOptima on {title}, {k} devices (slowdown {','.join(f'{f:.3g}' for f in slowdown)}; fastest "
          f"{flops / 1e9:g} GFLOP/s), {mbit:g} Mbit/s, batch {batch}, {wall_s:g} s of virtual wall time each\n")
    print(f"split {split} of {len(layers)} layers (the pre-processor's rule): {act_mb:.2f} MB of activations per "
          f"batch; server memory for activations and server-side models (the paper's Eq. 2 and 3): OAFL "
          f"{(k + 1) * srv_mb + k * act_mb:.1f} MB, FedOptima with omega={omega} {srv_mb + omega * act_mb:.1f} MB\n")
    cuts = []
    for ratio in speeds:
        s = SimSetting(slowdown=slowdown, device_flops_per_s=flops, server_flops_per_s=flops * ratio,
                       bandwidth_bytes_per_s=bw, latency_s=0.002, split=split, wall_s=wall_s, omega=omega,
                       local_iterations=h, batch=batch, lr=0.01,  # 0.05 makes local VGG-5 training diverge
                       train=train)
        rows = {}
        for m in ("fedavg", "oafl", "fedoptima"):
            t0 = time.monotonic()
            rows[m] = simulate(m, task, s)
            rows[m].real_s = time.monotonic() - t0
        print(f"### server {ratio}x the fastest device\n")
        print("| method | server idle | device idle (mean) | throughput (samples/s) | accuracy | activation batches "
              "used per device |")
        print("| --- | --- | --- | --- | --- | --- |")
        for m, r in rows.items():
            print(f"| {m} | {r.server_idle_s:.2f} s ({_pct(r.server_idle_s / r.wall_s)}) | {r.device_idle_s:.2f} s "
                  f"({_pct(r.device_idle_s / r.wall_s)}) | {r.throughput:.0f} | {_acc(r.accuracy)} | "
                  f"{r.used or '-'} |")
        fo = rows["fedoptima"]
        base_srv = min(rows[m].server_idle_s for m in ("fedavg", "oafl"))
        base_dev = min(rows[m].device_idle_s for m in ("fedavg", "oafl"))
        base_thr = max(rows[m].throughput for m in ("fedavg", "oafl"))
        base_acc = None if fo.accuracy is None else max(rows[m].accuracy for m in ("fedavg", "oafl"))
        srv_cut = 1 - fo.server_idle_s / base_srv if base_srv > 0 else float("-inf")
        cuts.append(srv_cut)
        dev_cut = 1 - fo.device_idle_s / base_dev
        print("\n| FedOptima against | server idle cut | device idle cut | throughput | accuracy |")
        print("| --- | --- | --- | --- | --- |")
        for m in ("fedavg", "oafl"):
            r = rows[m]
            sc = 1 - fo.server_idle_s / r.server_idle_s if r.server_idle_s > 0 else float("-inf")
            print(f"| {m} | {_pct(sc)} | {_pct(1 - fo.device_idle_s / r.device_idle_s)} | "
                  f"{fo.throughput / r.throughput:.2f}x | {_acc(fo.accuracy)} vs {_acc(r.accuracy)} |")
        print(f"| best baseline per column | {_pct(srv_cut)} | {_pct(dev_cut)} | {fo.throughput / base_thr:.2f}x | "
              f"{_acc(fo.accuracy)} vs {_acc(base_acc)} |")
        print(f"| paper (up to) | {_pct(PAPER['server_idle_cut'])} | {_pct(PAPER['device_idle_cut'])} | "
              f"1.1x-2.0x | higher or comparable |")
        print(f"\ntargets (half the paper's cuts against the best baseline): server idle cut >= 47.0%: "
              f"{'met' if srv_cut >= 0.4695 else 'NOT met'}; device idle cut >= 40.9%: "
              f"{'met' if dev_cut >= 0.409 else 'NOT met'}; throughput >= 1.05x: "
              f"{'met' if fo.throughput / base_thr >= 1.05 else 'NOT met'}; peak activation batches held "
              f"{fo.peak_held} <= omega {s.omega}; simulated in {sum(r.real_s for r in rows.values()):.0f} s, load "
              f"average {os.getloadavg()[0]:.2f}\n")
    return cuts


def _owl_run(sw: Federation, n: int, distribution: str, rounds: int, width: int, job: str, rate_mbit: float) -> dict:
    from nebula.channel import Endpoint
    from nebula.federated.owl.config import OwlSpec
    from nebula.federated.owl.runtime import run_owl_worker, serve_owl

    spec = OwlSpec(distribution=distribution, rounds=rounds, local_steps=5, lr=0.05,
                   server_bytes_per_s=rate_mbit * 1e6 / 8, peer_bytes_per_s=1e9, round_timeout_s=120,
                   peer_timeout_s=60)
    task = TowersTask(width)
    errors: list = []

    def worker(rank: int) -> None:
        try:
            with Endpoint.connect(sw.worker("B"), job=job, rank=rank) as ep:
                run_owl_worker(ep, ("A", 0), task, spec)
        except Exception:  # reported below; a benchmark must not hang on one worker
            errors.append(f"worker {rank} ({distribution}, {n} workers): {traceback.format_exc()}")

    threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(1, n + 1)]
    for t in threads:
        t.start()
    with Endpoint.connect(sw.worker("A"), job=job, rank=0) as ep:
        res = serve_owl(ep, [("B", r) for r in range(1, n + 1)], task, spec)
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise RuntimeError("; ".join(errors))
    return dataclasses.asdict(res)


def owl_part(workers: list[int], rate_mbit: float, rounds: int, width: int) -> None:
    """Part 2: OWL against server-only distribution through real switches, as the number of workers grows."""
    print(f"\n## OWL: server in cluster A, workers in cluster B, WAN shaped to {rate_mbit:g} Mbit/s + 5 ms; "
          f"4-tower model, {rounds} rounds (first left out of times)\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sw = Federation(Path(tmp), ["A", "B"], rate_mbit, 5.0, name="idle")
        try:
            for n in workers:
                got = {}
                for dist in ("server", "owl"):
                    try:
                        got[dist] = _owl_run(sw, n, dist, rounds, width, f"owl-{dist}-{n}", rate_mbit)
                    except RuntimeError as exc:  # said in the output, then the run is repeated once on a new job
                        print(f"(run {dist} with {n} workers failed and is repeated: {exc})")
                        got[dist] = _owl_run(sw, n, dist, rounds, width, f"owl-{dist}-{n}-again", rate_mbit)
                rows.append((n, got))
        finally:
            sw.close()
    model_mb = sum(rows[0][1]["owl"]["group_bytes"]) / 1e6
    print(f"model: {model_mb:.2f} MB in {rows[0][1]['owl']['num_groups']} groups (OWL's deploying algorithm)\n")
    print("| workers | server egress/round, server-only | server egress/round, OWL | egress ratio | round time, "
          "server-only | round time, OWL | round time cut | accuracy server-only / OWL |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, got in rows:
        eg = {d: statistics.mean(got[d]["server_egress_bytes"]) / 1e6 for d in got}
        rt = {d: statistics.median(got[d]["round_s"][1:] or got[d]["round_s"]) for d in got}
        print(f"| {n} | {eg['server']:.2f} MB | {eg['owl']:.2f} MB | {eg['owl'] / eg['server']:.3f} | "
              f"{rt['server']:.2f} s | {rt['owl']:.2f} s | {_pct(1 - rt['owl'] / rt['server'])} | "
              f"{got['server']['accuracy']:.3f} / {got['owl']['accuracy']:.3f} |")
    eg_owl = [statistics.mean(g["owl"]["server_egress_bytes"]) for _, g in rows]
    flat = max(eg_owl) / min(eg_owl)
    n_last, g_last = rows[-1]
    cut = 1 - statistics.median(g_last["owl"]["round_s"][1:]) / statistics.median(g_last["server"]["round_s"][1:])
    print(f"\ntargets: OWL server egress flat in workers (max/min over {workers} = {flat:.3f}, target <= 1.05): "
          f"{'met' if flat <= 1.05 else 'NOT met'}; round time at {n_last} workers {_pct(cut)} lower (target >= 20%): "
          f"{'met' if cut >= 0.2 else 'NOT met'}; paper: 20%-69% less training time\n")


def smallest(a: argparse.Namespace) -> argparse.Namespace:
    """`a` at the smallest size that still runs every part, setting and method (NEBULA_SMOKE, nebula/smoke.py: how
    CI runs the printed commands): 3 s of virtual wall time (every method finishes a round), the slowest and fastest
    server speeds, two local iterations, OWL with 2 and 4 workers for 2 rounds of a narrow model."""
    from nebula import smoke

    def ends(csv: str) -> str:
        values = csv.split(",")
        return ",".join(dict.fromkeys([values[0], values[-1]]))

    return argparse.Namespace(**{**vars(a), "wall_s": smoke.cap(a.wall_s, 3.0),
                                 "local_iterations": smoke.cap(a.local_iterations, 2),
                                 "speeds_a": smoke.pick(a.speeds_a, ends(a.speeds_a)),
                                 "speeds_b": smoke.pick(a.speeds_b, ends(a.speeds_b)),
                                 "workers": smoke.pick(a.workers, ",".join(a.workers.split(",")[:2])),
                                 "rounds": smoke.cap(a.rounds, 2), "width": smoke.cap(a.width, 64)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wall-s", type=float, default=30.0, help="virtual wall time per FedOptima method")
    ap.add_argument("--omega", type=int, default=None,
                    help="FedOptima's cap on activation batches held or granted (default 2 x the devices)")
    ap.add_argument("--local-iterations", type=int, default=10, help="H: device iterations per round")
    ap.add_argument("--settings", default="a,b", help="the paper's settings to run: a (Testbed A), b (Testbed B)")
    ap.add_argument("--speeds-a", default="4,6,8,16",
                    help="Testbed A's server FLOP/s as multiples of the fastest device's")
    ap.add_argument("--speeds-b", default="8,16,24,32,48", help="the same for Testbed B")
    ap.add_argument("--device-gflops", type=float, default=None,
                    help="the fastest device's GFLOP/s instead of the setting's estimate (4 for A, 25 for B)")
    ap.add_argument("--workers", default="2,4,8")
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--width", type=int, default=512, help="tower width of the OWL model")
    ap.add_argument("--skip-owl", action="store_true")
    ap.add_argument("--skip-fedoptima", action="store_true")
    a = smallest(ap.parse_args())
    print(f"# benchmarks/idle_time.py (load average {', '.join(f'{x:.2f}' for x in os.getloadavg())})")
    if not a.skip_fedoptima:
        best = {}
        for setting in a.settings.split(","):
            if setting not in SETTINGS:
                ap.error(f"--settings: {setting!r} is not one of {', '.join(SETTINGS)}")
            st = SETTINGS[setting]
            if a.device_gflops:
                st = dataclasses.replace(st, device_flops=a.device_gflops * 1e9)
            speeds = tuple(int(x) for x in getattr(a, f"speeds_{setting}").split(","))
            best[setting] = max(fedoptima_part(st, a.wall_s, a.omega, speeds, a.local_iterations))
        top = max(best.values())
        print(f"server idle cut, best over settings and server speeds (the paper's 'up to' is over its settings): "
              f"{_pct(top)} against the paper's {_pct(PAPER['server_idle_cut'])}; target >= 47.0%: "
              f"{'met' if top >= 0.4695 else 'NOT met'} ({', '.join(f'{k}: {_pct(v)}' for k, v in best.items())})\n")
    if not a.skip_owl:
        owl_part([int(w) for w in a.workers.split(",")], a.rate_mbit, a.rounds, a.width)
    return 0


if __name__ == "__main__":
    sys.exit(main())
