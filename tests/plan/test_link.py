"""The link model: parsing `--link` and the wall-time formula on cases computed by hand."""
from __future__ import annotations

import pytest

from nebula.plan.link import WanLink, exchange_s, parse_link, predicted_wall_s
from nebula.quality.rows import Traffic


@pytest.mark.parametrize("text, mbit, rtt_ms", [
    ("100mbit,20ms", 100.0, 20.0),
    ("1gbit", 1000.0, 0.0),
    ("500kbit,0.1s", 0.5, 100.0),
    (" 10Mbit , 5ms ", 10.0, 5.0),
    ("20ms,100mbit", 100.0, 20.0),
    ("2.5gbit,.5ms", 2500.0, 0.5),
])
def test_a_link_reads_its_rate_and_round_trip_in_any_unit(text, mbit, rtt_ms):
    assert parse_link(text) == WanLink(mbit, rtt_ms)


@pytest.mark.parametrize("text, says", [
    ("100", "neither a rate nor an RTT"),
    ("fast", "neither a rate nor an RTT"),
    ("100mbit,20", "'20' is neither"),
    ("", "neither a rate nor an RTT"),
    ("20ms", "has no rate"),
    ("0mbit,20ms", "must be > 0"),
    ("100mbit,1gbit", "two rates"),
    ("-5mbit", "neither a rate nor an RTT"),
])
def test_a_bad_link_names_the_part_and_the_form(text, says):
    with pytest.raises(ValueError) as exc:
        parse_link(text)
    msg = str(exc.value)
    assert says in msg and "100mbit,20ms" in msg and "\n" not in msg


def test_one_exchange_is_serialisation_plus_its_one_way_latencies():
    link = WanLink(100.0, 20.0)
    # 1.25 MB at 100 Mbit/s: 0.1 s; one one-way latency: 10 ms; two: 20 ms
    assert exchange_s(1.25e6, 1.0, link) == pytest.approx(0.11)
    assert exchange_s(1.25e6, 2.0, link) == pytest.approx(0.12)
    assert exchange_s(0.0, 0.0, link) == 0.0


def test_blocking_exchanges_add_to_compute_and_overlapped_ones_hide_up_to_the_links_capacity():
    link = WanLink(100.0, 20.0)
    serial = Traffic(exchanges=5, bytes_per_exchange=1.25e6, latencies_per_exchange=1.0)
    assert predicted_wall_s(10.0, serial, link) == pytest.approx(10.0 + 5 * 0.11)
    hidden = Traffic(exchanges=5, bytes_per_exchange=1.25e6, latencies_per_exchange=1.0, overlapped=True)
    assert predicted_wall_s(10.0, hidden, link) == pytest.approx(10.0)  # 0.55 s of link behind 10 s of compute
    saturated = Traffic(exchanges=200, bytes_per_exchange=1.25e6, latencies_per_exchange=1.0, overlapped=True)
    assert predicted_wall_s(10.0, saturated, link) == pytest.approx(200 * 0.11)  # the link is the bottleneck
    assert predicted_wall_s(3.0, Traffic(), link) == 3.0  # no WAN: the compute


def test_small_messages_are_latency_bound_and_large_ones_bandwidth_bound():
    far = WanLink(1000.0, 100.0)
    tiny = Traffic(exchanges=1000, bytes_per_exchange=1000, latencies_per_exchange=2.0)
    wall = predicted_wall_s(0.0, tiny, far)
    assert wall == pytest.approx(1000 * (8e3 / 1e9 + 0.1))
    assert 1000 * 0.1 / wall > 0.99  # the round trips, not the 8 ms of bytes
    bulk = Traffic(exchanges=10, bytes_per_exchange=1e9, latencies_per_exchange=1.0)
    wall = predicted_wall_s(0.0, bulk, WanLink(1000.0, 1.0))
    assert wall == pytest.approx(10 * (8.0 + 0.0005))
    assert 80.0 / wall > 0.999  # the bytes, not the latency
    # a tenth of the rate: ten times the bandwidth-bound time, the latency-bound one barely moves
    assert predicted_wall_s(0.0, bulk, WanLink(100.0, 1.0)) == pytest.approx(10 * (80.0 + 0.0005))
    assert predicted_wall_s(0.0, tiny, WanLink(100.0, 100.0)) == pytest.approx(1000 * (8e3 / 1e8 + 0.1))


def test_the_synchronous_pipeline_pays_its_round_trip_every_step_and_stale_weights_share_it():
    """M = 4 micro-batches of 250 kB each way per step, 100 steps of 0.5 s compute, 50 Mbit/s, 40 ms RTT."""
    link, steps, compute = WanLink(50.0, 40.0), 100, 0.5
    per_step = 4 * 250e3  # the four micro-batches one after another on the link
    sync = Traffic(exchanges=steps, bytes_per_exchange=per_step, latencies_per_exchange=2.0)
    assert predicted_wall_s(steps * compute, sync, link) == pytest.approx(steps * (0.5 + 0.16 + 0.04))
    stale = Traffic(exchanges=steps, bytes_per_exchange=per_step, latencies_per_exchange=2.0 / 2, overlapped=True)
    assert predicted_wall_s(steps * compute, stale, link) == pytest.approx(steps * 0.5)
    slow = WanLink(10.0, 40.0)  # 0.8 s of bytes per step: more than the compute hides
    assert predicted_wall_s(steps * compute, stale, slow) == pytest.approx(steps * (0.8 + 0.02))


@pytest.mark.parametrize("mbit, rtt", [(0.0, 1.0), (-1.0, 0.0), (1.0, -1.0), (float("nan"), 0.0)])
def test_a_link_refuses_a_rate_or_round_trip_out_of_range(mbit, rtt):
    with pytest.raises(ValueError, match="must be"):
        WanLink(mbit, rtt)
