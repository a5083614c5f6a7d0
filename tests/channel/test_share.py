"""The slots a worker's payloads share (`nebula.wire.share`) as pure state: the worker's cache and the switch's slots
stay in step through any sequence of payloads, and a descriptor that breaks the grant is refused."""
from __future__ import annotations

import random

import pytest

from nebula.wire import WireError
from nebula.wire.share import (MAX_SLOTS, PUT, SHARE_MIN_BYTES, SHARE_TAG, USE, ShareCache, ShareSlots, pack_ask,
                               pack_grant, pack_op, read_ask, read_grant, read_op)


def _frame_parts(cache: ShareCache, key: int, content: bytes) -> list[bytes]:
    op, slot = cache.lookup(key)
    return [b"head", SHARE_TAG, pack_op(op, slot), content] if op == PUT else [b"head", SHARE_TAG, pack_op(op, slot)]


@pytest.mark.parametrize("slots", [1, 3, 8])
def test_the_switch_resolves_every_payload_the_worker_named(slots):
    """Random keys (some repeated soon, some late) through a cache of `slots`: every frame the switch resolves
    carries the bytes its key names, repeats within the cache's reach go as USE, and the switch holds at most
    `slots` payloads."""
    rng = random.Random(slots)
    contents = {k: bytes([k]) * (SHARE_MIN_BYTES + k) for k in range(12)}
    cache, held = ShareCache(slots, SHARE_MIN_BYTES + 100), ShareSlots(slots, SHARE_MIN_BYTES + 100)
    uses = 0
    recent: list[int] = []
    for _ in range(500):
        key = rng.choice(recent[-slots:]) if recent and rng.random() < 0.6 else rng.randrange(12)
        parts = _frame_parts(cache, key, contents[key])
        uses += len(parts) == 3
        head, payload = held.resolve(parts)
        assert head == b"head" and bytes(payload) == contents[key]
        recent.append(key)
    assert uses > 100 and sum(p is not None for p in held.held) <= slots
    assert held.tally["put"] + held.tally["used"] == sum(len(contents[k]) for k in recent)


def test_the_least_recently_used_payload_makes_room():
    cache = ShareCache(2, 1 << 20)
    assert [cache.lookup(k) for k in ("a", "b", "a", "c", "a", "b")] == [
        (PUT, 0), (PUT, 1), (USE, 0), (PUT, 1), (USE, 0), (PUT, 1)]


def test_only_payloads_worth_a_slot_go_through_one():
    cache = ShareCache(4, 1 << 20)
    assert not cache.fits(SHARE_MIN_BYTES - 1) and cache.fits(SHARE_MIN_BYTES) and not cache.fits((1 << 20) + 1)
    assert not ShareCache(0, 1 << 20).fits(SHARE_MIN_BYTES)


def test_parts_without_the_tag_pass_unchanged():
    parts = [b"head", b"payload"]
    assert ShareSlots(2, 1 << 20).resolve(parts) is parts


@pytest.mark.parametrize("parts, why", [
    ([b"h", SHARE_TAG, pack_op(USE, 1)], "holds nothing"),
    ([b"h", SHARE_TAG, pack_op(PUT, 4), b"x"], "granted 4 slots"),
    ([b"h", SHARE_TAG, pack_op(PUT, 0), b"x" * 101], "a PUT of 101 bytes into a slot of 100"),
    ([b"h", SHARE_TAG, pack_op(PUT, 0)], "not 3 parts"),
    ([b"h", SHARE_TAG, pack_op(USE, 0), b"x"], "not 4 parts"),
    ([b"h", SHARE_TAG, b"\x01\x00"], "3 bytes, not 2"),
    ([b"h", SHARE_TAG, b"\x09\x00\x00"], "neither PUT"),
])
def test_a_descriptor_against_the_grant_is_refused(parts, why):
    with pytest.raises(WireError, match=why) as err:
        ShareSlots(4, 100).resolve(parts)
    assert err.value.code == "bad_share"


def test_asks_and_grants_are_bounded():
    assert read_ask(pack_ask(1000)) == MAX_SLOTS and read_ask(b"\x00") == 0
    assert read_grant(pack_grant(8, 1 << 20)) == (8, 1 << 20)
    assert read_grant(pack_grant(0, 1 << 20)) is None and read_grant(b"junk") is None
    assert read_op(pack_op(USE, 7)) == (USE, 7)


@pytest.mark.parametrize("slots", [-1, MAX_SLOTS + 1, True, 2.0])
def test_an_endpoint_asking_for_slots_it_cannot_have_is_told_before_it_connects(slots):
    from nebula.channel import Endpoint

    with pytest.raises(ValueError, match=rf"share_slots={slots!r} must be a whole number from 0 \(none\) to 64"):
        Endpoint.connect("/nonexistent/worker.yaml", job="j", rank=0, share_slots=slots)
