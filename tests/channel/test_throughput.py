"""ThroughputMeter: busy periods of overlapping deliveries, net of the round trip, smoothed; only periods in which
the link was the bottleneck count."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.channel.throughput import ThroughputMeter


def test_rate_is_bytes_over_busy_time_net_of_latency():
    m = ThroughputMeter(alpha=1.0)
    m.record(100, 0.0, 0.020)  # a control message: 20 ms is the round trip
    assert m.bytes_per_s is None  # too small to be a sample
    m.record(1_000_000, 1.0, 1.020 + 0.125)  # 1 MB in 125 ms of link time: 8 MB/s
    m.record(1_000_000, 1.05, 1.020 + 0.250)  # sent while the first was in flight: the same busy period
    assert m.bytes_per_s is None  # the period is still open
    m.record(100, 3.0, 3.020)
    assert m.bytes_per_s == pytest.approx(8e6, rel=1e-9) and m.samples == 1


def test_estimates_are_smoothed_and_bad_input_is_refused():
    m = ThroughputMeter(alpha=0.5, min_bytes=50, min_transfer_s=0.01)
    m.record(10, 0.0, 0.01)
    for start, rate in ((1.0, 1000.0), (2.0, 3000.0)):
        m.record(100, start, start + 0.01 + 100 / rate)
    m.record(10, 5.0, 5.01)
    # bytes over seconds, the older sample's both halved: (0.5 * 100 + 100) / (0.5 * 0.1 + 100 / 3000)
    assert m.bytes_per_s == pytest.approx(150 / (0.05 + 100 / 3000), rel=1e-6)
    m.record(10, 6.0, 5.0)  # acknowledged before it was sent: ignored
    assert m.samples == 2
    with pytest.raises(ValueError, match="alpha"):
        ThroughputMeter(alpha=0)


def test_a_link_that_never_idles_is_sampled_every_window():
    m = ThroughputMeter(alpha=1.0, window_s=0.5)
    m.record(100, 0.0, 0.01)
    t = 1.0
    for _ in range(20):  # 100 kB every 50 ms, each sent before the previous one was acknowledged
        m.record(100_000, t, t + 0.06)
        t += 0.05
    assert m.samples >= 1 and m.bytes_per_s == pytest.approx(2e6, rel=0.15)


def _fifo_link(sizes, sent, rate, rtt):
    """(nbytes, sent, acked) of messages through a FIFO link of `rate` bytes/s and round trip `rtt`."""
    free, out = 0.0, []
    for n, t in zip(sizes, sent):
        free = max(free, t) + n / rate
        out.append((n, t, free + rtt))
    return out


def test_small_messages_with_idle_gaps_give_no_estimate_rather_than_a_low_one():
    """Few-kB messages on an idle link: each delivery is the round trip plus jitter (here up to 30 ms, a loaded
    host), so bytes over busy time would read 4 kB / 15 ms = 0.27 MB/s on a 7.5 MB/s link. No sample is taken."""
    m = ThroughputMeter(alpha=1.0)
    jitter = np.random.default_rng(0).uniform(0, 0.03, 200)
    for i, (n, t, acked) in enumerate(_fifo_link([4000] * 200, np.arange(200) * 0.1, 7.5e6, 0.02)):
        m.record(n, t, acked + jitter[i])
    assert m.bytes_per_s is None and m.samples == 0 and m.skipped >= 199


@pytest.mark.parametrize("size", [4000, 1_000_000])
def test_small_and_large_messages_faster_than_the_link_read_its_rate(size):
    """Messages offered faster than a 2.5 MB/s link drains them (4 kB at 4 MB/s, or 1 MB at 4 MB/s), with 20 ms of
    round trip and up to 5 ms of jitter on each acknowledgement: the estimate is within 10% of the rate."""
    m = ThroughputMeter()
    count = 4_000_000 // size
    sent = np.arange(count) * (size / 4e6)
    jitter = np.random.default_rng(1).uniform(0, 0.005, count)
    m.record(100, 0.0, 0.02)
    for i, (n, t, acked) in enumerate(_fifo_link([size] * count, sent + 1.0, 2.5e6, 0.02)):
        m.record(n, t, acked + jitter[i])
    m.record(100, 10.0, 10.02)  # the next message closes the busy period
    assert m.samples >= 2 and m.bytes_per_s == pytest.approx(2.5e6, rel=0.1)
