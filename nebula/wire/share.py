"""Payloads a worker sends its switch once for many frames: the slots a stream connection shares (pure state).

A combiner sends the same model to every client: the same bytes, once per client, through its switch. Over a
stream connection (`nebula.wire.stream`) the worker may instead put a payload into one of a few numbered slots the
switch keeps for that connection, and then name the slot in place of the payload. A frame's parts are then its
head, `SHARE_TAG`, a descriptor (`>BH`: PUT or USE, the slot) and, for PUT, the payload; the switch turns them
back into head and payload before anything else reads them, so routing, checks and delivery are those of any frame.

Both ends hold the same state: the worker's `ShareCache` decides every PUT and USE, the switch's `ShareSlots`
follows them in stream order, and both start empty with each connection. The number of slots is asked in the
connection's AUTH and granted in AUTH_OK (`nebula.wire.stream`), each slot holding at most one frame's payload;
a descriptor outside the grant, a USE of an empty slot or a PUT over a slot's bytes breaks that agreement, and the
switch ends the connection (its worker connects again and sends what was not acknowledged).
"""
from __future__ import annotations

__all__ = ["MAX_SLOTS", "PUT", "SHARE_MIN_BYTES", "SHARE_TAG", "USE", "ShareCache", "ShareSlots", "pack_ask",
           "pack_grant", "pack_op", "read_ask", "read_grant", "read_op"]

import struct
from collections import OrderedDict
from typing import Any, Hashable

from nebula.wire.header import WireError

SHARE_TAG = b"NEBULA-SHARE"
PUT, USE = 1, 2
MAX_SLOTS = 64  # the most slots one connection may be granted
SHARE_MIN_BYTES = 64 * 1024  # smaller payloads are sent as they are: a slot saves little and costs a frame's bytes
_OP = struct.Struct(">BH")
_ASK = struct.Struct(">H")  # AUTH's fourth part: the slots asked for
_GRANT = struct.Struct(">HI")  # AUTH_OK's third part: the slots granted and the bytes each may hold


def pack_ask(slots: int) -> bytes:
    """AUTH's part asking for `slots` slots."""
    return _ASK.pack(min(slots, MAX_SLOTS))


def read_ask(part: Any) -> int:
    """The slots an AUTH asks for, at most MAX_SLOTS (0 for a part that is not an ask)."""
    return min(_ASK.unpack(part)[0], MAX_SLOTS) if len(part) == _ASK.size else 0


def pack_grant(slots: int, slot_bytes: int) -> bytes:
    """AUTH_OK's part granting `slots` slots of `slot_bytes`."""
    return _GRANT.pack(slots, slot_bytes)


def read_grant(part: Any) -> tuple[int, int] | None:
    """(slots, slot_bytes) an AUTH_OK grants; None for none, or for a part that is not a grant."""
    if len(part) != _GRANT.size:
        return None
    slots, slot_bytes = _GRANT.unpack(part)
    return (min(slots, MAX_SLOTS), slot_bytes) if slots and slot_bytes else None


def pack_op(op: int, slot: int) -> bytes:
    """The descriptor of a PUT or USE of `slot`."""
    return _OP.pack(op, slot)


def read_op(desc: Any) -> tuple[int, int]:
    """(op, slot) of a descriptor; WireError when it is not one."""
    if len(desc) != _OP.size:
        raise WireError("bad_share", f"a share descriptor has {_OP.size} bytes, not {len(desc)}")
    op, slot = _OP.unpack(desc)
    if op not in (PUT, USE):
        raise WireError("bad_share", f"share operation {op} is neither PUT ({PUT}) nor USE ({USE})")
    return op, slot


class ShareSlots:
    """The switch's side: what each slot of one connection holds (`slots` of at most `slot_bytes` each)."""

    def __init__(self, slots: int, slot_bytes: int, tally: dict[str, int] | None = None) -> None:
        self.slot_bytes = slot_bytes
        self.held: list[Any] = [None] * slots
        self.tally = {"put": 0, "used": 0} if tally is None else tally  # bytes put, and taken by a USE

    def resolve(self, parts: list[Any]) -> list[Any]:
        """`parts` as head and payload: a PUT's payload is kept in its slot, a USE's taken from it; parts without
        `SHARE_TAG` are returned as they are. WireError when the parts break the connection's grant."""
        if len(parts) < 3 or bytes(parts[1]) != SHARE_TAG:
            return parts
        op, slot = read_op(parts[2])
        if slot >= len(self.held):
            raise WireError("bad_share", f"slot {slot} of a connection granted {len(self.held)} slots")
        if op == PUT:
            if len(parts) != 4:
                raise WireError("bad_share", f"a PUT brings head, tag, descriptor and payload, not {len(parts)} parts")
            payload = parts[3]
            if len(payload) > self.slot_bytes:
                raise WireError("bad_share", f"a PUT of {len(payload)} bytes into a slot of {self.slot_bytes}")
            self.held[slot] = payload
            self.tally["put"] += len(payload)
            return [parts[0], payload]
        if len(parts) != 3:
            raise WireError("bad_share", f"a USE brings head, tag and descriptor, not {len(parts)} parts")
        payload = self.held[slot]
        if payload is None:
            raise WireError("bad_share", f"a USE of slot {slot}, which holds nothing")
        self.tally["used"] += len(payload)
        return [parts[0], payload]


class ShareCache:
    """The worker's side: which payload each slot holds, least recently used first; `lookup` decides and records
    what the switch will hold once the frame it answers for is sent."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slots, self.slot_bytes = slots, slot_bytes
        self.where: OrderedDict[Hashable, int] = OrderedDict()  # payload key -> slot, oldest first

    def fits(self, nbytes: int) -> bool:
        """Whether a payload of `nbytes` goes through a slot."""
        return self.slots > 0 and SHARE_MIN_BYTES <= nbytes <= self.slot_bytes

    def lookup(self, key: Hashable) -> tuple[int, int]:
        """(USE, slot) when the slot holds the payload `key` names, else (PUT, slot) of the slot it goes into (a
        free one, or the least recently used one's)."""
        slot = self.where.get(key)
        if slot is not None:
            self.where.move_to_end(key)
            return USE, slot
        if len(self.where) < self.slots:
            slot = len(self.where)
        else:
            _, slot = self.where.popitem(last=False)
        self.where[key] = slot
        return PUT, slot
