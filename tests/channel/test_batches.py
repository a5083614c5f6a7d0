"""Batch frames: runs of small queued messages of one channel share a DATA frame (`nebula.channel.sender.batches`),
driven by hand through the real wire codec: what may share a frame, that a batch delivers each message once and in
order whatever is lost, duplicated or sent again alone, and that a batch whose length table lies is refused in its
place while the stream goes on."""
from __future__ import annotations

import random
import struct

import pytest

from nebula.channel.arena import Pieces
from nebula.channel.delivery import Receiver, Sender
from nebula.channel.sender import BATCH_BELOW_BYTES, OutBatch, batches
from nebula.wire import FrameType, Lane, WireError, decode_frame, encode_frame
from nebula.wire.meta import MAX_BATCH
from tests.channel.test_delivery import KEY, LIMIT, msg

CHUNK = 1 << 20


def submitted(tx: Sender, payloads, lane: Lane = Lane.ACTIVATION, parts=None):
    ms = [msg(p, parts, lane) for p in payloads]
    admitted = []
    for m in ms:
        admitted += tx.submit(m)
    return ms, admitted


def on_wire(tx: Sender, run, now: float = 0.0) -> tuple:
    """One batch frame of `run` as a receiver's parser sees it: (header, payload bytes, meta); marked sent."""
    f = tx.batch_frame(run, now)
    assert isinstance(f.payload, Pieces) and isinstance(f.msg, OutBatch)
    payload = f.payload.join()
    frame = decode_frame(f.head, payload)
    f.msg.frame_sent(now)
    return frame.header, payload, frame.meta


def take(rx: Receiver, frames, limit: int = LIMIT) -> list:
    got = []
    for h, payload, meta in frames:
        got += rx.on_chunk(h, payload, meta.get("parts"), limit, region=("r", h.seq), meta=meta).ready
    return got


def test_only_consecutive_small_messages_of_one_lane_share_a_frame():
    tx = Sender(KEY, window_bytes=1 << 30)
    small, _ = submitted(tx, [b"a" * 100] * 3)
    big, _ = submitted(tx, [b"b" * BATCH_BELOW_BYTES])
    grad, _ = submitted(tx, [b"c" * 10] * 2, lane=Lane.GRADIENT)
    parted, _ = submitted(tx, [b"d" * 10], parts=[4, 6])
    more, _ = submitted(tx, [b"e" * 10] * 2)
    runs = batches(small + big + grad + parted + more, CHUNK)
    assert [[m.seq for m in r] for r in runs] == [[1, 2, 3], [4], [5, 6], [7, 8, 9]]
    # a gap in the numbering (a message refused meanwhile, or resends of a few) starts a new run
    assert [[m.seq for m in r] for r in batches(small[:1] + small[2:], CHUNK)] == [[1], [3]]


def test_a_run_stops_at_chunk_bytes_and_at_max_batch():
    tx = Sender(KEY, window_bytes=1 << 30)
    ms, _ = submitted(tx, [b"x" * 1000] * 10)
    # (each message also takes two 4-byte table entries: its length and its part count)
    sizes = [len(r) for r in batches(ms, chunk_bytes=3 * 1008)]
    assert sizes == [3, 3, 3, 1]
    many, _ = submitted(tx, [b""] * (MAX_BATCH + 5))
    assert [len(r) for r in batches(many, CHUNK)] == [MAX_BATCH, 5]
    # a switch whose chunks are smaller than BATCH_BELOW_BYTES: a message too large for one chunk goes alone
    lone, _ = submitted(tx, [b"y" * 600, b"y" * 600])
    assert [len(r) for r in batches(lone, chunk_bytes=500)] == [1, 1]


def test_a_batch_frame_delivers_each_message_once_in_order_and_completes_every_future():
    tx, rx = Sender(KEY, window_bytes=1 << 30), Receiver(KEY)
    payloads = [bytes([i]) * n for i, n in enumerate([0, 1, 700, 5, 3000])]
    ms, admitted = submitted(tx, payloads)
    h, payload, meta = on_wire(tx, admitted)
    assert meta["batch"] == 5 and h.seq == 1 and h.chunk_count == 1
    assert all(m.future.done() for m in ms)  # the one frame left: so did every message in it
    got = take(rx, [(h, payload, meta)])
    assert [g.data for g in got] == payloads and rx.ack_state() == (5, 0)
    assert take(rx, [(h, payload, meta)]) == [] and rx.ack_state() == (5, 0)  # a duplicate batch: nothing again


@pytest.mark.parametrize("seed", range(4))
def test_batches_lost_duplicated_reordered_and_resent_alone_deliver_everything_exactly_once(seed):
    rng = random.Random(seed)
    tx, rx = Sender(KEY, window_bytes=1 << 30), Receiver(KEY)
    data = [rng.randbytes(rng.choice([0, 7, 300, 2000])) for _ in range(60)]
    ms, _ = submitted(tx, data)
    frames = []
    for run in batches(ms, chunk_bytes=rng.choice([2500, 9000])):
        frames.append(on_wire(tx, run) if len(run) > 1 else _alone(tx, run[0]))
    got = []
    for rnd in range(60):
        kept = [f for f in frames if rng.random() > 0.3] + [f for f in frames if rng.random() < 0.2]
        rng.shuffle(kept)
        ready = take(rx, kept)
        got += ready
        for _ in ready:
            rx.consume()
        tx.on_ack(*rx.ack_state(), now=float(rnd))
        if tx.idle:
            break
        # what is still unacknowledged goes again, in other runs than the first time (one alone, or batched anew)
        again = tx.resendable()
        cut = rng.randrange(len(again) + 1)
        frames = [_alone(tx, m) for m in again[:cut]]
        frames += [on_wire(tx, r) if len(r) > 1 else _alone(tx, r[0]) for r in batches(again[cut:], 4096)]
    assert tx.idle and [g.data for g in got] == data


def _alone(tx: Sender, m, now: float = 0.0) -> tuple:
    (f,) = tx.frames(m, CHUNK, now)
    frame = decode_frame(f.head, f.payload)
    m.frame_sent(now)
    return frame.header, bytes(f.payload), frame.meta


def _forged(k: int, lengths: list[int], body: bytes, seq: int = 1, counts: list[int] | None = None,
            part_lengths: list[int] = ()) -> tuple:
    counts = counts if counts is not None else [0] * len(lengths)
    table = [*lengths, *counts, *part_lengths]
    payload = struct.pack(f">{len(table)}I", *table) + body
    meta = {**KEY.to_meta(), "batch": k}
    frame = decode_frame(encode_frame(FrameType.DATA, meta, payload, channel_id=KEY.id, seq=seq), payload)
    return frame.header, payload, frame.meta


def test_a_length_table_that_does_not_add_up_refuses_the_whole_batch_in_its_place():
    rx = Receiver(KEY)
    # three messages claimed, lengths summing past the payload: none may be cut out of it
    got = take(rx, [_forged(3, [2, 2, 400], b"aabbcc")])
    assert len(got) == 3 and all(g.error is not None for g in got)
    assert "batch of 3" in str(got[0].error) and "table" in str(got[0].error)
    # the stream goes on at #4; a table summing to less than the payload (bytes smuggled after the last message)
    # is refused the same way (a table shorter than its count never gets here: the frame parser refuses it)
    tx = Sender(KEY, window_bytes=1 << 30)
    tx.next_seq = 4
    (m,), _ = submitted(tx, [b"after"])
    assert [g.data for g in take(rx, [_alone(tx, m)])] == [b"after"]
    extra = take(rx, [_forged(2, [1, 1], b"ab" + b"smuggled", seq=5)])
    assert len(extra) == 2 and all(g.error is not None for g in extra) and rx.ack_state() == (6, 0)
    # part lists that do not sum to their message, or claim more parts than the protocol allows
    parts = take(rx, [_forged(2, [2, 1], b"abc", seq=7, counts=[2, 0], part_lengths=[1, 5])])
    many = take(rx, [_forged(2, [0, 0], b"", seq=9, counts=[600, 0], part_lengths=[0] * 600)])
    assert all(g.error is not None for g in parts + many) and rx.ack_state() == (10, 0)
    assert "summing to 6" in str(parts[0].error) and "more than 512 parts" in str(many[0].error)


def test_messages_sent_in_parts_keep_their_parts_in_a_batch():
    tx, rx = Sender(KEY, window_bytes=1 << 30), Receiver(KEY)
    ms = [msg(b"abcdef", [2, 0, 4]), msg(b"whole"), msg(b"xy", [1, 1])]
    admitted = []
    for m in ms:
        admitted += tx.submit(m)
    (run,) = batches(admitted, CHUNK)
    got = take(rx, [on_wire(tx, run)])
    assert [(g.data, g.parts) for g in got] == [(b"abcdef", [2, 0, 4]), (b"whole", None), (b"xy", [1, 1])]


def test_a_batched_message_over_the_receivers_limit_is_refused_and_its_neighbours_arrive():
    rx = Receiver(KEY)
    got = take(rx, [_forged(3, [3, 50, 3], b"abc" + b"x" * 50 + b"def")], limit=10)
    assert [g.data for g in got] == [b"abc", b"", b"def"]
    assert got[1].error is not None and "link.max_message_bytes=10" in str(got[1].error)


@pytest.mark.parametrize("meta_extra, header, why", [
    ({"batch": 1}, {}, "batch"),
    ({"batch": MAX_BATCH + 1}, {}, "batch"),
    ({"batch": True}, {}, "batch"),
    ({"batch": 2, "parts": [1, 7]}, {}, "not both"),
    ({"batch": 2}, {"chunk_count": 2, "total_len": 16}, "one chunk"),
    ({"batch": 4}, {"total_len": 8}, "one chunk"),
])
def test_batch_meta_beyond_what_the_protocol_defines_is_refused_by_the_parser(meta_extra, header, why):
    payload = b"\0" * 8
    head = encode_frame(FrameType.DATA, {**KEY.to_meta(), **meta_extra}, payload, channel_id=KEY.id, **header)
    with pytest.raises(WireError, match=why):
        decode_frame(head, payload)


def test_a_refusal_naming_a_batch_frame_fails_every_message_it_carried():
    from nebula.channel.errors import ChannelError

    tx = Sender(KEY, window_bytes=1 << 30)
    ms, admitted = submitted(tx, [b"a", b"b", b"c", b"d"])
    on_wire(tx, admitted[:3])  # 1-3 share a frame; 4 went alone
    _alone(tx, admitted[3])
    tx.on_refused(1, ChannelError("not_authorized: no route"))  # (a switch names a frame by its first message)
    assert sorted(tx.unacked) == [4] and tx.inflight == 1
    # a message sent again alone after its batch is refused alone
    (m5, m6), _ = submitted(tx, [b"e", b"f"])
    on_wire(tx, [m5, m6])
    _alone(tx, m5)
    tx.on_refused(5, ChannelError("not_authorized: no route"))
    assert sorted(tx.unacked) == [4, 6]


def test_the_link_meter_sees_a_batch_as_one_delivery():
    """Messages that crossed the link in one batch frame are acknowledged together: the throughput meter gets them
    as one delivery of their bytes (apart, the first batch's bytes would seem to come after its clock started)."""

    class Meter:
        def __init__(self) -> None:
            self.records: list[tuple] = []

        def record(self, nbytes, sent_at, acked_at) -> None:
            self.records.append((nbytes, sent_at, acked_at))

    tx = Sender(KEY, window_bytes=1 << 30)
    tx.meter = Meter()
    ms, admitted = submitted(tx, [b"a" * 100] * 5)
    on_wire(tx, admitted[:3], now=1.0)
    _alone(tx, admitted[3], now=1.5)
    on_wire(tx, admitted[4:] + submitted(tx, [b"b" * 10])[1], now=2.0)
    tx.on_ack(6, 0, now=3.0)
    assert tx.meter.records == [(300, 1.0, 3.0), (100, 1.5, 3.0), (110, 2.0, 3.0)]
