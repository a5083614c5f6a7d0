"""The rules both sides of the local link share, in nebula.wire: lane priority, frame dispatch, shared-memory
descriptors and release batching."""
from __future__ import annotations

import time
from collections import deque

import pytest

from nebula.wire import Dispatcher, FrameType, Lane, LaneQueues, WireError, decode_frame, encode_frame, next_lane
from nebula.wire.shm import RELEASE_BATCH, RELEASE_DELAY_S, Arena, ReleaseBatch, pack_desc, read_desc


def test_next_lane_serves_control_first_alternates_activation_and_gradient_and_bulk_last():
    q = [deque(), deque([1, 2]), deque([1, 2]), deque([1])]
    order, turn = [], 0
    while any(q):
        lane, turn = next_lane(q, turn)
        q[lane].popleft()
        order.append(Lane(lane))
        if len(order) == 1:
            q[0].append("ctl")  # a control frame arriving mid-way overtakes everything queued
    assert order == [Lane.ACTIVATION, Lane.CONTROL, Lane.GRADIENT, Lane.ACTIVATION, Lane.GRADIENT, Lane.BULK]
    assert next_lane(q, turn)[0] == -1


def test_lane_queues_count_bytes_and_pop_by_the_shared_rule():
    lq = LaneQueues()
    lq.push(Lane.BULK, "b", 100)
    lq.push(Lane.GRADIENT, "g", 10)
    lq.push_front(Lane.CONTROL, "c", 1)
    assert lq.bytes == 111 and len(lq) == 3 and not lq.only_bulk()
    assert [lq.pop()[1] for _ in range(2)] == ["c", "g"]
    assert lq.only_bulk() and lq.pop() == (Lane.BULK, "b", 100)
    assert lq.pop() is None and lq.bytes == 0 and not lq


def test_dispatcher_calls_the_handler_of_the_type_and_refuses_others_naming_what_it_accepts():
    seen = []
    d = Dispatcher("a test side", {FrameType.PING: lambda f, x: seen.append((f.type, x))})
    d.on((FrameType.DATA, FrameType.ACK), lambda f, x: seen.append(("routed", x)))
    ping = decode_frame(encode_frame(FrameType.PING, {"t": 1.0}))
    d(ping, 7)
    assert seen == [(FrameType.PING, 7)]
    with pytest.raises(WireError) as err:
        d(decode_frame(encode_frame(FrameType.PONG, {"t": 1.0})), 0)
    assert err.value.code == "bad_type"
    assert "PONG" in err.value.message and "a test side" in err.value.message and "DATA, ACK, PING" in err.value.message


def test_read_desc_returns_the_region_refuses_unsound_descriptors_and_ignores_other_arenas():
    arena = Arena.create(4096)
    try:
        arena.up[10:14] = b"abcd"
        off, region = read_desc(pack_desc(arena.token, 10, 4), arena, arena.up)
        assert off == 10 and bytes(region) == b"abcd"
        assert read_desc(pack_desc(arena.token ^ 2, 10, 4), arena, arena.up) is None  # stale: another arena
        assert read_desc(pack_desc(arena.token, 0, 4), None, arena.up) is None
        for bad in (pack_desc(arena.token, 4090, 10), pack_desc(arena.token, 0, 0), b"short"):
            with pytest.raises(WireError) as err:
                read_desc(bad, arena, arena.up)
            assert err.value.code == "bad_shm"
    finally:
        arena.close_fd()


def test_release_batch_goes_back_at_a_quarter_arena_or_after_the_delay_in_bounded_frames():
    batch = ReleaseBatch(half=4000)
    assert not batch.due()
    assert batch.add(0, 100) is False and not batch.due()
    assert batch.add(100, 900) is True and batch.due()  # a quarter of the half waits
    metas = batch.take(token=5)
    assert metas == [{"token": 5, "offsets": [0, 100]}] and not batch.due()
    batch.add(0, 1)
    time.sleep(RELEASE_DELAY_S * 1.5)  # the clock passes the delay: the behaviour under test
    assert batch.due()
    for i in range(1, RELEASE_BATCH + 10):
        batch.add(i, 1)
    metas = batch.take(token=5)
    assert [len(m["offsets"]) for m in metas] == [RELEASE_BATCH, 10]
