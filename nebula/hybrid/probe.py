"""Device benchmark through the real runtime: every rank times a fixed probe and ping-pongs its neighbour.

As in Sky Computing's benchmark stage: each rank runs the same small network forward and backward (warm-up
rounds first, then the median of timed rounds), reports the memory it has free, and measures latency and
bandwidth to the next rank with ping-pong messages (a tiny one for latency, an activation-sized one for
bandwidth) over the same paddle.distributed point-to-point path the pipeline uses. The results are gathered on
every rank (so each computes the same allocation) and become one `DeviceProfile` per rank.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

__all__ = ["RankProbe", "probe_together", "probe_compute", "free_memory_bytes", "measure_links", "measure_allreduce",
           "probe_ranks", "in_turns", "gather", "PROBE_WIDTH", "PROBE_DEPTH", "PROBE_BATCH"]

T = TypeVar("T")

PROBE_WIDTH, PROBE_DEPTH, PROBE_BATCH = 256, 4, 64  # the fixed probe: 4 Linear(256, 256) + tanh on 64 rows


@dataclass(frozen=True, slots=True)
class RankProbe:
    """What the benchmark measured on one rank."""

    rank: int
    compute_s: float  # median seconds of one forward+backward of the probe (slowdown included)
    probe_flops: float  # FLOPs of that forward+backward
    free_memory_bytes: float
    latency_s: float  # one-way latency to the next rank (the previous one for the last rank; 0 alone)
    bandwidth_bytes_per_s: float  # to the same neighbour (inf alone)
    allreduce_s: float = 0.0  # median seconds of an all-reduce of one number over all ranks (the step's end)

    @property
    def time_per_flop_s(self) -> float:
        """Seconds per FLOP of this rank on the probe."""
        return self.compute_s / self.probe_flops

    def profile(self, name: str = "") -> Any:
        """This rank as a `nebula.balance.DeviceProfile`."""
        from nebula.balance import DeviceProfile

        return DeviceProfile(self.time_per_flop_s, self.free_memory_bytes, self.latency_s,
                             self.bandwidth_bytes_per_s, name or f"rank{self.rank}")

    def to_dict(self) -> dict:
        """Plain values (JSON)."""
        return asdict(self)


def probe_compute(*, slowdown: float = 1.0, warmup: int = 3, repeats: int = 10) -> tuple[float, float]:
    """(median seconds, FLOPs) of one forward+backward of the fixed probe; `slowdown` > 1 sleeps as a slower
    device would take (the paper's speed control: measured time x (slowdown - 1) more)."""
    import paddle

    from nebula.balance.simulate import Slowdown

    slow = Slowdown(compute=slowdown)
    paddle.seed(0)
    net = paddle.nn.Sequential(*[m for _ in range(PROBE_DEPTH)
                                 for m in (paddle.nn.Linear(PROBE_WIDTH, PROBE_WIDTH), paddle.nn.Tanh())])
    x = paddle.randn([PROBE_BATCH, PROBE_WIDTH])
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        net(x).mean().backward()
        net.clear_gradients()
        slow.apply_compute(time.perf_counter() - t0)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    flops = 3 * 2 * PROBE_BATCH * PROBE_WIDTH * PROBE_WIDTH * PROBE_DEPTH  # backward is twice the forward
    return float(np.median(times)), float(flops)


def free_memory_bytes(device: str = "cpu") -> float:
    """Memory this rank can still use: the accelerator's free memory, or the host's available memory shared by
    the ranks on this host."""
    if device != "cpu":
        import paddle

        dev = paddle.device.get_device()
        try:
            props = paddle.device.cuda.get_device_properties(dev)
            return float(props.total_memory - paddle.device.cuda.memory_reserved(dev))
        except Exception:  # noqa: BLE001 - not a CUDA device: fall back to host memory below
            pass
    avail = 0.0
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = float(line.split()[1]) * 1024
    else:
        avail = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    local = int(os.environ.get("PADDLE_LOCAL_SIZE", os.environ.get("PADDLE_TRAINERS_NUM", "1")))
    return avail / max(local, 1)


def measure_links(rank: int, world: int, message_bytes: int, groups: Any, repeats: int = 5) -> tuple[float, float]:
    """(one-way latency s, bandwidth bytes/s) between this rank and the next one, by ping-pong.

    Two rounds cover every consecutive pair: (0,1), (2,3), ... then (1,2), (3,4), ...; the last rank reports the
    link to its previous rank. A rank alone reports (0, inf)."""
    from nebula.hybrid.p2p import ping_pong

    if world == 1:
        return 0.0, math.inf
    mine: dict[str, tuple[float, float]] = {}
    for parity in (0, 1):
        if rank % 2 == parity and rank + 1 < world:
            peer, leader, side = rank + 1, True, "next"
        elif rank % 2 != parity and rank - 1 >= 0:
            peer, leader, side = rank - 1, False, "prev"
        else:
            continue
        g = groups.link(rank, peer)
        small = ping_pong(peer, leader, 4, repeats, g)
        big = ping_pong(peer, leader, message_bytes, repeats, g)
        mine[side] = _share(_link_of(small, big, message_bytes) if leader else (0.0, 0.0), peer, leader, g)
    return mine.get("next", mine.get("prev", (0.0, math.inf)))


def measure_allreduce(world: int, repeats: int = 10) -> float:
    """Median seconds of an all-reduce of one float64 over all `world` ranks (one warm-up first; 0 alone): what
    ends every step of the pipeline runner."""
    if world == 1:
        return 0.0
    import paddle
    import paddle.distributed as dist

    t = paddle.zeros([1], dtype="float64")
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        if i:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _link_of(small_rtt_s: float, big_rtt_s: float, message_bytes: int) -> tuple[float, float]:
    """(latency, bandwidth) from the round trips of a tiny and an `message_bytes` message."""
    latency = small_rtt_s / 2
    transfer = big_rtt_s / 2 - latency
    if transfer <= 0:  # jitter hid the transfer time: charge the whole one-way time (a lower bound on bandwidth)
        transfer = big_rtt_s / 2
    return latency, message_bytes / transfer


def _share(link: tuple[float, float], peer: int, leader: bool, group: Any) -> tuple[float, float]:
    """The leader's measurement, on both ends (the follower's clock starts while it waits, so only the leader
    times the round trips)."""
    import paddle
    import paddle.distributed as dist

    t = paddle.to_tensor(np.array(link, dtype=np.float64))
    if leader:
        dist.send(t, dst=peer, group=group)
    else:
        dist.recv(t, src=peer, group=group)
    lat, bw = (float(v) for v in t.numpy())
    return lat, bw


def probe_together(configured: bool | None, device: str, ranks_on_host: int, host_cores: int) -> bool:
    """Whether the ranks time their layers all at once: as configured, else where a host's CPU ranks outnumber its
    cores. Those ranks contend for the cores in training as well; timed alone they predicted the step 13-24% short
    on 4 ranks sharing 2 cores, timed together 3-10% (benchmarks/allocation_run.py)."""
    if configured is not None:
        return configured
    return device == "cpu" and host_cores < ranks_on_host


def in_turns(rank: int, world: int, together: bool, fn: Callable[[], T]) -> T:
    """`fn()` on every rank, one rank at a time in rank order (a barrier between turns), or all at once."""
    out = None
    for turn in range(1 if together else world):
        if world > 1:
            import paddle.distributed as dist

            dist.barrier()
        if together or turn == rank:
            out = fn()
    return out


def gather(rank_obj: Any, world: int) -> list:
    """Every rank's picklable `rank_obj`, in rank order, on every rank."""
    if world == 1:
        return [rank_obj]
    import paddle.distributed as dist

    out: list[Any] = []
    dist.all_gather_object(out, rank_obj)
    return out


def probe_ranks(*, rank: int, world: int, groups: Any = None, device: str = "cpu", slowdown: float = 1.0,
                message_bytes: int = 1 << 20, repeats: int = 20, together: bool = False) -> list[RankProbe]:
    """Run the device benchmark on this rank and gather every rank's result (on every rank, in rank order).

    Ranks are timed one at a time (each device's own speed) unless `together`: then all at once, so ranks that
    share a host's cores are measured with the contention they will have in training (but a simulated slow rank,
    which sleeps, then leaves its core to the others and looks faster than it is).
    `groups`: the pair groups of `nebula.hybrid.p2p.make_groups` (created here when None)."""
    if groups is None and world > 1:
        from nebula.hybrid.p2p import make_groups

        groups = make_groups(rank, world)
    compute_s, flops = in_turns(rank, world, together, lambda: probe_compute(slowdown=slowdown, repeats=repeats))
    latency, bandwidth = measure_links(rank, world, message_bytes, groups)
    mine = RankProbe(rank, compute_s, flops, free_memory_bytes(device), latency, bandwidth,
                     measure_allreduce(world, repeats))
    return [RankProbe(**d) for d in sorted(gather(mine.to_dict(), world), key=lambda d: d["rank"])]
