"""The worker's shared-memory arena client against a real sealed arena made in this process (as a switch would)."""
from __future__ import annotations

import os

import pytest

from nebula.channel.arena import SHM_WAIT_S, ArenaClient
from nebula.wire import FrameType, WireError, decode_frame
from nebula.wire.shm import SHM_MIN_BYTES, Arena, pack_desc, unpack_desc

HALF = 1 << 16


def offer(arena: Arena) -> dict:
    return {"pid": os.getpid(), "fd": arena.fd, "token": arena.token, "bytes": arena.half}


@pytest.fixture
def arenas():
    made = [Arena.create(HALF), Arena.create(HALF)]
    yield made
    for a in made:
        a.close_fd()


def test_upward_payloads_go_into_the_arena_and_wait_for_room_then_go_inline(arenas):
    sw = arenas[0]
    client = ArenaClient(wanted=True)
    assert not client.fits(SHM_MIN_BYTES)  # nothing mapped yet
    assert client.take(offer(sw)) and not client.take(offer(sw))  # the same arena is mapped once
    assert client.fits(SHM_MIN_BYTES) and not client.fits(SHM_MIN_BYTES - 1) and not client.fits(HALF + 1)
    payload = bytes(range(256)) * 64
    desc, off = client.put(payload, now=0.0)
    token, at, n = unpack_desc(desc)
    assert (token, at, n) == (sw.token, off, len(payload)) and bytes(sw.up[at : at + n]) == payload
    filled = 0
    while client.put(payload, now=0.0) is not False:  # fill the upward half
        filled += 1
    assert filled > 0
    assert client.waiting and client.put(payload, now=SHM_WAIT_S / 2) is False
    assert client.put(payload, now=SHM_WAIT_S * 2) is True  # waited long enough: inline
    client.on_release({"token": sw.token, "offsets": [off]})  # the switch hands the first region back
    assert client.full_since is None and client.put(payload, now=1.0) == (pack_desc(sw.token, 0, n), 0)


def test_downward_regions_are_checked_batched_and_never_freed_in_a_replaced_arena(arenas):
    old, new = arenas
    client = ArenaClient(wanted=True)
    client.take(offer(old))
    old.down[:5] = b"hello"
    view, region = client.payload(pack_desc(old.token, 0, 5))
    assert bytes(view) == b"hello" and region.nbytes == 5
    with pytest.raises(WireError, match="outside the arena"):
        client.payload(pack_desc(old.token, HALF - 2, 5))
    with pytest.raises(WireError, match="not mapped"):
        client.payload(pack_desc(new.token, 0, 5))
    client.release(region)
    assert client.release_frames() == [] and client.release_due is not None  # a small batch waits a while
    _, big = client.payload(pack_desc(old.token, 8, HALF // 4))
    client.release(big)  # a quarter of the half waits: the batch goes back at once
    (head,) = client.release_frames()
    f = decode_frame(head)
    assert f.type == FrameType.SHM_RELEASE and f.meta == {"token": old.token, "offsets": [0, 8]}
    assert client.release_due is None
    _, late = client.payload(pack_desc(old.token, 100, HALF // 2))
    assert client.take(offer(new))  # the switch restarted and offered another arena
    client.release(late)  # a region of the old arena: its offset must not free a live region of the new one
    assert client.release_frames() == [] and client.release_due is None
