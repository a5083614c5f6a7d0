"""The reliable-delivery state machine, driven by hand: frames go from a Sender through the real wire codec to a
Receiver in whatever order, duplication or loss a test chooses; no sockets, no clocks."""
from __future__ import annotations

import random
from concurrent.futures import Future

import pytest

from nebula.channel.delivery import RTO_MAX_S, RTO_S, OutMessage, Receiver, Sender
from nebula.channel.errors import ChannelError
from nebula.wire import ChannelKey, FrameType, Lane, decode_frame, encode_frame

KEY = ChannelKey("j", "acct", "A", 0, "B", 1, "act")
LIMIT = 1 << 20


def msg(data: bytes, parts: list[int] | None = None, lane: Lane = Lane.ACTIVATION) -> OutMessage:
    fut: Future = Future()
    fut.set_running_or_notify_cancel()
    return OutMessage(memoryview(data), parts, lane, fut)


def wire(sender: Sender, m: OutMessage, chunk_bytes: int, now: float = 0.0) -> list[tuple]:
    """The frames of one transmission, as the receiver's parser sees them (each also marked sent)."""
    out = []
    for f in sender.frames(m, chunk_bytes, now):
        frame = decode_frame(f.head, f.payload)
        out.append((frame.header, bytes(f.payload), frame.meta.get("parts")))
        m.frame_sent(now)
    return out


def feed(rx: Receiver, chunks, limit: int = LIMIT):
    got, acks = [], 0
    for i, (h, payload, parts) in enumerate(chunks):
        out = rx.on_chunk(h, payload, parts, limit, region=("r", h.seq, h.chunk_index, i))
        got += out.ready
        acks += out.ack
    return got, acks


def test_multi_chunk_messages_reassemble_from_shuffled_chunks_in_order():
    tx, rx = Sender(KEY, window_bytes=1 << 30), Receiver(KEY)
    rng = random.Random(3)
    data = [rng.randbytes(n) for n in (0, 1, 999, 1000, 1001, 4321)]
    chunks = []
    for d in data:
        (m,) = tx.submit(msg(d, parts=[len(d) - len(d) // 3, len(d) // 3] if d else None))
        chunks += wire(tx, m, chunk_bytes=1000)
    assert max(h.chunk_count for h, _, _ in chunks) == 5
    rng.shuffle(chunks)
    got, _ = feed(rx, chunks)
    assert [g.data for g in got] == data
    assert got[3].parts == [667, 333] and got[0].parts is None
    assert rx.ack_state() == (6, 0) and not rx.partial and not rx.complete


def test_out_of_order_messages_wait_for_the_gap_and_acks_are_cumulative():
    tx, rx = Sender(KEY, window_bytes=1 << 30), Receiver(KEY)
    frames = [wire(tx, m, 100)[0] for d in (b"one", b"two", b"three") for m in tx.submit(msg(d))]
    got, _ = feed(rx, [frames[2], frames[1]])
    assert got == [] and rx.ack_state() == (0, 0) and sorted(rx.complete) == [2, 3]
    got, _ = feed(rx, [frames[0]])
    assert [g.data for g in got] == [b"one", b"two", b"three"] and rx.ack_state() == (3, 0)


def test_duplicates_are_acknowledged_again_delivered_once_and_their_regions_released():
    tx, rx = Sender(KEY, window_bytes=1 << 30), Receiver(KEY)
    (m,) = tx.submit(msg(b"x" * 250))
    first, second, third = wire(tx, m, 100)
    assert rx.on_chunk(*first, LIMIT, region="r0").release == []  # kept until the message is joined
    dup = rx.on_chunk(*first, LIMIT, region="r0-again")  # the same chunk twice while reassembling
    assert dup.release == ["r0-again"] and not dup.ack and not dup.ready
    rx.on_chunk(*second, LIMIT, region="r1")
    done = rx.on_chunk(*third, LIMIT, region="r2")
    assert [d.data for d in done.ready] == [b"x" * 250] and sorted(done.release) == ["r0", "r1", "r2"] and done.ack
    again = rx.on_chunk(*second, LIMIT, region="late")  # a whole retransmission arriving after delivery
    assert again.ack and again.ready == [] and again.release == ["late"]


def test_resend_after_timeout_with_doubling_timer_until_acknowledged():
    tx = Sender(KEY, window_bytes=1 << 30)
    (m,) = tx.submit(msg(b"payload"))
    frames = tx.frames(m, 100, now=0.0)
    assert tx.timed_out(RTO_S + 1) == []  # frames still waiting in a lane do not time out
    for _ in frames:
        m.frame_sent(0.0)
    assert m.future.done() and not tx.idle  # the switch has it; the receiver has not acknowledged it
    assert tx.timed_out(RTO_S - 1) == []
    assert tx.timed_out(RTO_S + 1) == [m] and m.rto == pytest.approx(2 * RTO_S, rel=1e-3)
    wire(tx, m, 100, now=RTO_S + 1)
    assert tx.timed_out(RTO_S + 2) == []
    for _ in range(5):
        late = tx.timed_out(1e6)
        assert late == [m]
    assert m.rto == RTO_MAX_S
    assert tx.resendable() == [m]  # a switch restart resends it at once
    tx.on_ack(1, 0, now=1e6)
    assert tx.idle and tx.timed_out(1e7) == [] and tx.resendable() == []


def test_window_full_holds_messages_until_the_receiver_consumes():
    tx, rx = Sender(KEY, window_bytes=100), Receiver(KEY)
    assert len(tx.submit(msg(b"a" * 60))) == 1
    assert tx.submit(msg(b"b" * 60)) == []  # would exceed the window: waits
    assert tx.submit(msg(b"c" * 10)) == []  # and keeps order behind it
    assert tx.inflight == 60 and len(tx.waiting) == 2
    assert tx.on_ack(1, 0, now=1.0) == []  # received but not consumed: the window stays shut
    rx.consume()
    admitted = tx.on_ack(1, rx.ack_state()[1], now=1.0)
    assert [m.seq for m in admitted] == [2, 3] and tx.inflight == 70
    big = msg(b"d" * 500)  # larger than the window: admitted alone once nothing is in flight
    assert tx.submit(big) == []
    assert [m.seq for m in tx.on_ack(3, 3, now=2.0)] == [4]


def test_messages_on_their_way_are_bounded_apart_from_the_window_and_freed_by_receipt():
    """`transit_bytes` bounds what was sent and not yet received (in the switches, where a receiving worker's arena
    must hold it), however wide the window: a receipt opens it, without waiting for the application to consume."""
    tx = Sender(KEY, window_bytes=1000, transit_bytes=100)
    assert [m.seq for m in tx.submit(msg(b"a" * 60))] == [1]
    assert tx.submit(msg(b"b" * 60)) == []  # 120 on their way: waits, though the window has room
    assert tx.unreceived == 60 and tx.inflight == 60
    assert [m.seq for m in tx.on_ack(1, 0, now=1.0)] == [2]  # received, not consumed: on its way no more
    assert tx.unreceived == 60 and tx.inflight == 120
    big = msg(b"c" * 500)  # larger than the bound: sent alone once nothing is on its way
    assert tx.submit(big) == []
    assert [m.seq for m in tx.on_ack(2, 2, now=2.0)] == [3] and tx.unreceived == 500


def test_transit_bytes_survive_refusals_forged_acknowledgements_and_a_restarted_receiver():
    tx = Sender(KEY, window_bytes=1 << 30, transit_bytes=100)
    tx.submit(msg(b"a" * 50))
    tx.submit(msg(b"b" * 50))
    waiting = msg(b"c" * 50)
    assert tx.submit(waiting) == []
    assert tx.on_refused(2, ChannelError("too_large: no")) == [waiting]  # the refused one is on its way no more
    assert tx.unreceived == 100
    late = msg(b"d" * 80)
    assert tx.submit(late) == []
    # no receiver has a message the window still holds back (numbered, never sent): such a claim is refused
    assert "only 3 were sent" in tx.ack_refusal(4, 0)
    assert tx.on_ack(4, 0, now=1.0) == [] and tx.unreceived == 100 and not late.future.done()
    assert [m.seq for m in tx.on_ack(3, 0, now=1.0)] == [4] and tx.unreceived == 80
    # a restarted receiver has none of them: the unconsumed three are numbered afresh and on their way again
    assert [m.seq for m in tx.restart_stream()] == [1, 2] and tx.unreceived == 100 and len(tx.waiting) == 1


def test_a_refused_message_fails_its_future_and_frees_its_window_share():
    tx = Sender(KEY, window_bytes=100)
    (a,) = tx.submit(msg(b"a" * 80))
    b = msg(b"b" * 80)
    assert tx.submit(b) == []
    err = ChannelError("too_large: no")
    assert tx.on_refused(1, err) == [b]
    assert a.future.exception() is err and tx.inflight == 80
    assert tx.on_refused(99, err) == []  # unknown seq: nothing happens


def test_chunk_count_from_the_wire_is_bounded_by_the_configured_maximum():
    tx, rx = Sender(KEY, window_bytes=1 << 40), Receiver(KEY)
    forged = encode_frame(FrameType.DATA, KEY.to_meta(), b"x" * 10, lane=Lane.BULK, channel_id=KEY.id, seq=1,
                          chunk_count=1 << 31, total_len=1 << 40)
    h = decode_frame(forged, b"x" * 10).header
    out = rx.on_chunk(h, b"x" * 10, None, LIMIT, region="r")
    assert isinstance(out.refused, ChannelError)
    text = str(out.refused)
    assert "'act'" in text and "A/0" in text and f"link.max_message_bytes={LIMIT}" in text and "split" in text
    assert out.ack and out.release == ["r"] and not rx.partial
    assert out.ready[0].error is out.refused  # refused in its place: the stream goes on after it
    tx.submit(msg(b"placeholder"))  # seq 1 is the forged message's
    (after,) = tx.submit(msg(b"after"))
    got, _ = feed(rx, wire(tx, after, 100))
    assert [g.data for g in got] == [b"after"] and rx.ack_state() == (2, 0)


def test_chunk_count_larger_than_the_bytes_and_overlong_chunks_are_refused():
    rx = Receiver(KEY)
    forged = encode_frame(FrameType.DATA, KEY.to_meta(), b"ab", channel_id=KEY.id, seq=1, chunk_count=1 << 20,
                          total_len=1000)
    out = rx.on_chunk(decode_frame(forged, b"ab").header, b"ab", None, LIMIT)
    assert "1048576 chunks for 1000 bytes" in str(out.refused) and not rx.partial
    # chunks that together carry more than the message declares
    heads = [encode_frame(FrameType.DATA, KEY.to_meta(), b"y" * 8, channel_id=KEY.id, seq=2, chunk_index=i,
                          chunk_count=3, total_len=10) for i in range(2)]
    first = rx.on_chunk(decode_frame(heads[0], b"y" * 8).header, b"y" * 8, None, LIMIT, region="k0")
    assert first.refused is None and not first.ready
    second = rx.on_chunk(decode_frame(heads[1], b"y" * 8).header, b"y" * 8, None, LIMIT, region="k1")
    assert "more than the 10 bytes it declares" in str(second.refused)
    assert sorted(second.release) == ["k0", "k1"] and not rx.partial
    assert [d.error is not None for d in out.ready + second.ready] == [True, True] and rx.ack_state() == (2, 0)


@pytest.mark.parametrize("seed", range(3))
def test_random_loss_duplication_and_reordering_deliver_everything_exactly_once(seed):
    rng = random.Random(seed)
    tx, rx = Sender(KEY, window_bytes=1 << 30), Receiver(KEY)
    data = [rng.randbytes(rng.choice([0, 5, 300, 1000])) for _ in range(40)]
    for d in data:
        tx.submit(msg(d))
    got = []
    for rnd in range(60):
        if tx.idle:
            break
        batch = [c for m in tx.resendable() for c in wire(tx, m, 128, float(rnd))]
        batch = [c for c in batch if rng.random() > 0.3] + [c for c in batch if rng.random() < 0.2]
        rng.shuffle(batch)
        ready, _ = feed(rx, batch)
        got += ready
        for _ in ready:
            rx.consume()
        tx.on_ack(*rx.ack_state(), now=float(rnd))
    assert tx.idle and [g.data for g in got] == data


def _wire_meta(sender: Sender, m: OutMessage) -> list[tuple]:
    """Like `wire`, with each frame's whole meta (for the incarnation fields)."""
    out = []
    for f in sender.frames(m, 1 << 20, 0.0):
        frame = decode_frame(f.head, f.payload)
        out.append((frame.header, bytes(f.payload), frame.meta))
        m.frame_sent(0.0)
    return out


def _take(rx: Receiver, frames) -> list[bytes]:
    got = []
    for h, payload, meta in frames:
        got += [d.data for d in rx.on_chunk(h, payload, meta.get("parts"), LIMIT, meta=meta).ready]
    return got


def _ack(rx: Receiver) -> dict:
    recv_seq, consumed = rx.ack_state()
    head = encode_frame(FrameType.ACK, {**KEY.to_meta(), **rx.ack_meta(), "consumed": consumed}, channel_id=KEY.id,
                        seq=recv_seq)
    return decode_frame(head, b"").meta, recv_seq, consumed


def test_a_restarted_receiver_drops_what_was_sent_to_its_predecessor_and_takes_its_new_senders_stream():
    """Both ends restarted while a switch kept messages of the old run: the new receiver must not deliver them,
    though their sequence numbers are those the new sender uses too."""
    old_tx, old_rx = Sender(KEY, 1 << 30, inc=10), Receiver(KEY, inc=20)
    first = old_tx.submit(msg(b"old-1"))[0]
    assert _take(old_rx, _wire_meta(old_tx, first)) == [b"old-1"]
    meta, seq, consumed = _ack(old_rx)
    assert old_tx.ours(meta) and old_tx.peer_inc == 20
    old_tx.on_ack(seq, consumed, 0.0)
    kept = [old_tx.submit(msg(f"old-{i}".encode()))[0] for i in (2, 3)]  # never delivered: both ends die
    stale = [f for m in kept for f in _wire_meta(old_tx, m)]

    new_tx, new_rx = Sender(KEY, 1 << 30, inc=11), Receiver(KEY, inc=21)
    fresh = [new_tx.submit(msg(f"new-{i}".encode()))[0] for i in (1, 2, 3)]
    frames = [f for m in fresh for f in _wire_meta(new_tx, m)]
    assert [h.seq for h, _, _ in stale] == [2, 3] and [h.seq for h, _, _ in frames] == [1, 2, 3]
    assert _take(new_rx, stale[:1] + frames[:2] + stale[1:] + frames[2:]) == [b"new-1", b"new-2", b"new-3"]
    assert new_rx.stale == 2 and new_rx.peer_inc == 11
    # the new receiver's acknowledgement is the new sender's, and names the receiver it reached
    meta, seq, consumed = _ack(new_rx)
    assert not old_tx.ours(meta)
    assert new_tx.ours(meta) and new_tx.peer_inc == 21
    assert not new_tx.on_ack(seq, consumed, 0.0) and new_tx.acked == 3 and not new_tx.unacked


def test_an_acknowledgement_for_a_predecessor_does_not_acknowledge_a_restarted_senders_messages():
    rx = Receiver(KEY, inc=20)
    old_tx = Sender(KEY, 1 << 30, inc=10)
    for i in range(5):
        _take(rx, _wire_meta(old_tx, old_tx.submit(msg(b"x"))[0]))
    meta, seq, _ = _ack(rx)
    assert seq == 5
    new_tx = Sender(KEY, 1 << 30, inc=11)  # the sender restarted; the receiver's last word was to its predecessor
    m = new_tx.submit(msg(b"lost?"))[0]
    assert not new_tx.ours(meta) and new_tx.unacked  # else seq 5 would acknowledge its unseen #1
    # a later incarnation of the sender starts the stream afresh at the receiver, which delivers its #1
    assert _take(rx, _wire_meta(new_tx, m)) == [b"lost?"]
    assert rx.ack_state() == (1, 0) and rx.peer_inc == 11
    # and frames of the earlier sender that arrive late are dropped
    assert _take(rx, _wire_meta(old_tx, old_tx.submit(msg(b"late"))[0])) == [] and rx.stale == 1


def test_incarnation_fields_must_be_integers_on_the_wire():
    from nebula.wire import WireError
    for bad in ({"inc": "1"}, {"to": -1}, {"inc": True}):
        head = encode_frame(FrameType.DATA, {**KEY.to_meta(), **bad}, b"x", channel_id=KEY.id, seq=1)
        with pytest.raises(WireError, match="must be an integer"):
            decode_frame(head, b"x")


def test_acknowledgement_progress_defers_the_timer_of_every_message_in_flight():
    tx = Sender(KEY, window_bytes=1 << 30)
    first, second = tx.submit(msg(b"1"))[0], tx.submit(msg(b"2"))[0]
    for m in (first, second):
        wire(tx, m, 100, now=0.0)
    tx.on_ack(1, 0, now=8.0)  # the first is acknowledged at 8 s: the channel moves, so the second is not stuck
    assert tx.timed_out(RTO_S + 1) == []
    assert tx.stalled_s(second, RTO_S + 1) == pytest.approx(RTO_S - 7)
    assert tx.timed_out(8.0 + RTO_S + 0.5) == [second]
    tx.on_ack(1, 0, now=100.0)  # an acknowledgement that moves nothing is no progress
    assert tx.timed_out(8.0 + 3 * RTO_S + 1) == [second]


@pytest.mark.parametrize("field,value", [("window_bytes", 0), ("transit_bytes", -5), ("transit_bytes", 1.5),
                                         ("window_bytes", True)])
def test_an_endpoint_with_a_window_it_cannot_use_is_told_before_it_connects(field, value):
    from nebula.channel import Endpoint

    with pytest.raises(ValueError, match=rf"{field}={value!r} must be a whole number of bytes, at least 1"):
        Endpoint.connect("/nonexistent/worker.yaml", job="j", rank=0, **{field: value})
