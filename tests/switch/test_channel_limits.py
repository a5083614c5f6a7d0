"""A receiving worker bounds what a frame from the wire claims (chunk count, length) by its configured maximum,
through two real switch servers: a hostile worker's forged frame is refused in its place and the stream goes on."""
from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest

from nebula.channel import ChannelError, Endpoint
from nebula.wire import ChannelKey, FrameType, encode_frame
from testbed.federation import edit_yaml, start_switch, wait_audit
from tests.switch.conftest import worker_yaml
from tests.switch.test_relay import _next_error, _raw_worker, raw_hello

B_MAX = 8 * 1024**2


@contextlib.contextmanager
def _hostile_sender(fed):
    """A raw worker of A (rank 5, said HELLO) sending on channel 'raw' to B's rank 0, whose endpoint reads it:
    (raw socket, B's endpoint, B's channel, the channel key, the DATA meta with the raw worker's incarnation)."""
    s = _raw_worker(fed, "A")
    try:
        with Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
            ch = eb.channel("A", 5, "raw")
            key = ChannelKey("j", "nebula", "A", 5, "B", 0, "raw")
            yield s, eb, ch, key, {**key.to_meta(), "inc": raw_hello(s)}
    finally:
        s.close(0)


def test_forged_chunk_count_is_refused_by_the_receiver_naming_channel_and_limit(procs, federation):
    fed = federation
    # A relays messages up to its own limit (4 GiB by default); B's workers accept at most B_MAX
    edit_yaml(Path(fed["clusters"]["B"]["switch_yaml"]),
              lambda d: d.setdefault("link", {}).update(max_message_bytes=B_MAX))
    start_switch(procs, Path(fed["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(fed["clusters"]["B"]["switch_yaml"]))
    with _hostile_sender(fed) as (s, eb, ch, key, meta):
        # one 10-byte chunk claiming to be the first of 2^31 chunks of a 1 GiB message: a receiver that sized
        # its reassembly by the header would allocate 16 GiB of slots
        s.send_multipart([encode_frame(FrameType.DATA, meta, b"y" * 10, channel_id=key.id, seq=1,
                                       chunk_count=1 << 31, total_len=1 << 30), b"y" * 10])
        s.send_multipart([encode_frame(FrameType.DATA, meta, b"after", channel_id=key.id, seq=2),
                          b"after"])
        with pytest.raises(ChannelError, match=rf"message #1 on channel 'raw' from A/5 .*1073741824 bytes.*"
                                               rf"link.max_message_bytes={B_MAX}.*split"):
            ch.recv(timeout_s=30)
        assert ch.recv(timeout_s=30) == b"after"  # the stream goes on after the refused message
        with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=1) as ea:  # and B serves everyone else
            ea.channel("B", 0, "ok").send(b"still fine")
            assert eb.channel("A", 1, "ok").recv(timeout_s=30) == b"still fine"


def test_a_forged_batch_is_refused_by_its_switch_audited_and_the_stream_goes_on(two_switches):
    """A worker that sends batch frames the protocol forbids is refused by its switch (bad_meta, named); one whose
    length table lies is refused there too (bad_batch: the table is the one part of a payload a switch reads),
    audited, and never reaches the receiver, while an honest batch on the same channel and every other worker go
    on."""
    fed, a, _b = two_switches
    with _hostile_sender(fed) as (s, eb, ch, key, meta):
        for bad, why in (({"batch": 1}, "'batch'"), ({"batch": 2, "parts": [4, 4]}, "not both")):
            body = struct.pack(">2I", 0, 0)
            s.send_multipart([encode_frame(FrameType.DATA, {**meta, **bad}, body, channel_id=key.id, seq=1), body])
            err = _next_error(s)
            assert err["code"] == "bad_meta" and why in err["message"], err
        for lying, why in ((struct.pack(">4I", 3, 900, 0, 0) + b"abcdef", "does not add up"),  # 903 bytes claimed
                           (struct.pack(">6I", 1, 2, 0, 2, 2, 2) + b"xyz", "parts summing to 4")):
            s.send_multipart([encode_frame(FrameType.DATA, {**meta, "batch": 2}, lying, channel_id=key.id, seq=1),
                              lying])
            err = _next_error(s)
            assert err["code"] == "bad_batch" and why in err["message"] and "nebula.wire.batch" in err["message"], err
            assert err["channel"] == key.to_meta()
        rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "bad_batch")
        assert rec["outcome"] == "denied" and rec["detail"]["account"] == "nebula"
        honest = struct.pack(">6I", 1, 2, 0, 2, 1, 1) + b"xyz"  # the second in two parts
        s.send_multipart([encode_frame(FrameType.DATA, {**meta, "batch": 2}, honest, channel_id=key.id, seq=1),
                          honest])
        assert ch.recv(timeout_s=30) == b"x"  # (nothing of the refused frames came before it)
        assert [bytes(p) for p in ch.recv_parts(timeout_s=30)] == [b"y", b"z"]
        with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=1) as ea:
            ea.channel("B", 0, "ok").send(b"still fine")
            assert eb.channel("A", 1, "ok").recv(timeout_s=30) == b"still fine"
