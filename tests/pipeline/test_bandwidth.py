"""Measured link bandwidth reaches the adaptive codecs a boundary sends with (and only when it changed)."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.compress import get_codec
from nebula.pipeline.bandwidth import BandwidthFeed, adaptive_codecs


def test_feed_passes_changed_estimates_to_auto_codecs_nested_or_not():
    estimates = iter([None, 1e6, 1.1e6, 5e6, 5e6])
    feed = BandwidthFeed(lambda: next(estimates), rel_change=0.2)
    auto, wrapped, plain = get_codec("auto(0.05)"), get_codec("ef(auto(0.05, int8, fp16))"), get_codec("int8")
    assert adaptive_codecs(plain) == [] and adaptive_codecs(wrapped) == [wrapped.inner]
    assert feed.feed([auto, plain]) is None and auto.bytes_per_s == 100e6 / 8  # no estimate yet: the spec's mbit
    assert feed.feed([auto]) == 1e6 and auto.bytes_per_s == 1e6
    assert feed.feed([auto, wrapped]) == 1e6  # 1.1e6 is within 20%: kept; the new codec gets the current one
    assert wrapped.inner.bytes_per_s == 1e6 and feed.updates == 2
    assert feed.feed([auto, wrapped]) == 5e6 and auto.bytes_per_s == wrapped.inner.bytes_per_s == 5e6
    feed.feed([auto, wrapped])
    assert feed.updates == 4  # an unchanged estimate re-decides nothing


def test_a_slower_link_moves_auto_to_fewer_bytes():
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    auto = get_codec("auto(0.02, none, fp16, int8_row)")
    rates = iter([1e12, 1e4])
    feed = BandwidthFeed(lambda: next(rates), rel_change=0.2)
    feed.feed([auto])
    auto.encode(x)
    fast = auto.chosen(x.shape)
    feed.feed([auto])
    assert fast is not None and auto.chosen(x.shape) == "int8_row"  # at 10 kB/s bytes dominate: the smallest
    with pytest.raises(ValueError, match="rel_change"):
        BandwidthFeed(lambda: None, rel_change=-1)


def test_switch_link_throughput_reaches_auto_on_a_boundary(procs, tmp_path):
    """Two real switch servers shaped to 20 Mbit/s: the upstream endpoint measures the link from its messages'
    acknowledgements, and the boundary's auto codec decides at that bandwidth instead of its spec's 1 Gbit/s."""
    import paddle

    from nebula.channel import Endpoint
    from nebula.pipeline.boundary import Boundary
    from nebula.pipeline.links import ChannelLink
    from testbed.federation import start_switches

    workers = start_switches(procs, tmp_path / "fed", ["A", "B"], shape={"rate_mbit": 20, "delay_ms": 5})
    eps = {c: Endpoint.connect(workers[c], job="bw", rank=0) for c in ("A", "B")}
    links = {c: {k: ChannelLink(eps[c], "B" if c == "A" else "A", 0, f"b0.{k}") for k in ("act", "grad", "ctl")}
             for c in ("A", "B")}
    codecs = {"forward": "auto(0.05, none, fp16, int8_row, mbit=1000)", "backward": "none"}
    up = Boundary(side="upstream", codec=lambda d, s: codecs[d], peer_timeout_s=60, **links["A"])
    down = Boundary(side="downstream", codec=lambda d, s: codecs[d], peer_timeout_s=60, **links["B"])
    try:
        # 1 MB per activation: the shaper's 50 ms burst (125 kB at 20 Mbit/s) is a small part of each message
        x = paddle.to_tensor(np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32))
        def step(i: int) -> None:
            up.send_array((i, 0, 0), x, "forward")
            got = down.recv_array((i, 0, 0))
            assert isinstance(got, paddle.Tensor) and got.shape == [256, 1024]  # decoded on this process's device
            up.flush()

        for i in range(8):  # 4-8 MB (fp16 or none): several of the meter's half-second windows at 2.5 MB/s
            step(i)
        assert eps["A"].flush(30)  # every message acknowledged: the meter has seen them all
        measured = eps["A"].throughput("B")
        assert measured is not None and 0 < measured < 3 * 20e6 / 8  # a shaped link cannot deliver 3x its rate
        step(8)  # the next send passes the estimate on
        auto = up.outbox._coder.codec(codecs["forward"])
        assert up.outbox.bandwidth.fed_bytes_per_s is not None
        assert auto.bytes_per_s == up.outbox.bandwidth.fed_bytes_per_s != 1000e6 / 8
        print(f"measured {measured * 8e-6:.1f} Mbit/s on a link shaped to 20 Mbit/s")
    finally:
        up.close()
        down.close()
        for ep in eps.values():
            ep.close(flush_s=1)


def test_a_shaped_switch_link_reads_its_rate_for_small_and_large_messages(procs, tmp_path):
    """Two real switch servers shaped to 8 Mbit/s (+5 ms): a stream of 8 kB messages and one of 512 kB messages,
    each offered faster than the link drains it, both read within 20% of 8 Mbit/s; the demo's pattern (a few kB
    now and then on an idle link) gives no estimate instead of a low one."""
    import threading
    import time

    from nebula.channel import Endpoint
    from testbed.federation import start_switches

    rate = 8e6 / 8
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"], shape={"rate_mbit": 8, "delay_ms": 5})

    def measure(job: str, size: int, count: int, gap_s: float) -> float | None:
        eps = {c: Endpoint.connect(workers[c], job=job, rank=0) for c in ("A", "B")}
        tx, rx = eps["A"].channel("B", 0, "data"), eps["B"].channel("A", 0, "data")
        got = []
        reader = threading.Thread(target=lambda: got.extend(rx.recv(timeout_s=60) for _ in range(count + 1)),
                                  daemon=True)
        reader.start()
        try:
            tx.send([b"x" * 100]).result(timeout=30)  # a small message: the round trip
            assert eps["A"].flush(30)
            payload = bytes(size)
            for _ in range(count):
                tx.send([payload])
                if gap_s:
                    time.sleep(gap_s)
            assert eps["A"].flush(60)  # every message acknowledged
            reader.join(timeout=60)
            assert len(got) == count + 1
            tx.send([b"x" * 100]).result(timeout=30)  # the next message closes the last busy period
            assert eps["A"].flush(30)
            return eps["A"].throughput("B")
        finally:
            for ep in eps.values():
                ep.close(flush_s=1)

    for job, size, count in (("small", 8192, 200), ("large", 1 << 19, 3)):  # 1.6 MB each: 1.6 s at 8 Mbit/s
        measured = measure(job, size, count, 0.0)
        print(f"{job}: measured {measured * 8e-6 if measured else 0:.1f} Mbit/s on a link shaped to 8 Mbit/s")
        assert measured == pytest.approx(rate, rel=0.2), (job, measured)
    assert measure("idle", 4096, 10, 0.1) is None
