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
