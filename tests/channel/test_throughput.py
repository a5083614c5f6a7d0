"""ThroughputMeter: busy periods of overlapping deliveries, net of the round trip, smoothed."""
from __future__ import annotations

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
    assert m.bytes_per_s == pytest.approx(8e6, rel=1e-4) and m.samples == 1  # (the 100 B round trip pooled in)


def test_estimates_are_smoothed_and_bad_input_is_refused():
    m = ThroughputMeter(alpha=0.5, min_bytes=50)
    m.record(10, 0.0, 0.01)
    for start, rate in ((1.0, 1000.0), (2.0, 3000.0)):
        m.record(100, start, start + 0.01 + 100 / rate)
    m.record(10, 5.0, 5.01)
    assert m.bytes_per_s == pytest.approx(0.5 * 1100 + 0.5 * 3000, rel=1e-6)  # the first 10 B joined the first sample
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


def test_small_messages_are_pooled_into_samples():
    m = ThroughputMeter(alpha=1.0, min_bytes=16384)
    m.record(100, 0.0, 0.02)  # round trip 20 ms
    for i in range(8):  # 4 kB messages with idle gaps: 4 kB in 20 ms + 2 ms transfer each
        m.record(4000, 1.0 + i, 1.0 + i + 0.022)
    m.record(100, 20.0, 20.02)
    assert m.samples >= 1 and m.bytes_per_s == pytest.approx(4000 / 0.002, rel=0.01)
