"""The channels of one actor of a federated job and who they lead to: one channel per peer, named for the peer's role,
its restarts and ours, polled fairly.

Every actor is one rank of the federation's job behind its cluster's switch: the controller is rank 0 of its
cluster, each cluster's combiner rank 1, clients ranks 2 and up. A channel's sequence numbers live as long as both
its ends, so a restarted controller cannot reuse its channels: each start of the controller takes the next epoch
(kept with its trail) and talks on channels named fl.c<epoch>; the others listen on the next EPOCH_WINDOW epochs
and follow the newest they hear from. Clients likewise: each start of a client process takes the next incarnation
(kept in its state directory) and talks to the combiners on channels named fl.k<incarnation>; a combiner listens
on a client's current and next incarnation, so a client that crashed and restarted rejoins with fresh channels.
"""
from __future__ import annotations

import logging
import time
from typing import Collection

from nebula.channel import Channel, ChannelError, Endpoint
from nebula.messaging import Peer
from nebula.wire import ChannelKey

__all__ = ["ActorChannels", "CONTROLLER_RANK", "COMBINER_RANK", "FIRST_CLIENT_RANK", "CHANNEL",
           "EPOCH_WINDOW", "CLIENT_WINDOW"]

log = logging.getLogger(__name__)
CONTROLLER_RANK = 0
COMBINER_RANK = 1
FIRST_CLIENT_RANK = 2
CHANNEL = "fl"
EPOCH_WINDOW = 4
CLIENT_WINDOW = 2
PRIMARY_WAIT_S = 0.25  # a poll blocked on its primary peer looks at the others this often
FRESH_WAIT_S = 5.0  # a channel opened for a message that came before it: how long its registration may take
RawMessage = tuple["Peer", list[memoryview]]


class ActorChannels:
    """This actor's channels (one per peer, all called `fl`, with the epoch or incarnation they belong to) and a
    fair poll over them; what travels on them is the business of `nebula.federated.transport.Messenger`."""

    def __init__(self, ep: Endpoint, controller: Peer | None = None, epoch: int = 0, incarnation: int = 0) -> None:
        self.ep = ep
        self.me = Peer(ep.cluster, ep.rank)
        self.controller = controller
        self.epoch = epoch  # ours when we are the controller, else the newest controller epoch heard from
        self.incarnation = incarnation  # a client's own incarnation
        self.incarnations: dict[Peer, int] = {}  # a combiner's view: the newest incarnation heard from each client
        self._turn = 0
        self._ready: dict[ChannelKey, None] | None = None  # watch(): channels with messages, oldest first
        self._opened: set[ChannelKey] = set()

    def watch(self) -> None:
        """Have `poll` look only at the channels that received something (Endpoint.watch) instead of sweeping
        every listed peer: a poll then costs the same with 1000 peers as with 10, and a waiting actor sleeps until
        a message comes (no wake-ups to look)."""
        self._ready = {}
        self.ep.watch()

    def channel(self, peer: Peer, epoch: int | None = None) -> Channel:
        """The channel to `peer` (for the controller's channels: of `epoch`, default the current one)."""
        if self.controller is not None and self.controller in (peer, self.me):
            return self.ep.channel(peer.cluster, peer.rank, f"{CHANNEL}.c{self.epoch if epoch is None else epoch}")
        if self.me.rank == COMBINER_RANK and peer.rank >= FIRST_CLIENT_RANK:
            inc = self.incarnations.get(peer, 0) if epoch is None else epoch
            return self.ep.channel(peer.cluster, peer.rank, f"{CHANNEL}.k{inc}")
        if self.me.rank >= FIRST_CLIENT_RANK and peer.rank == COMBINER_RANK:
            return self.ep.channel(peer.cluster, peer.rank, f"{CHANNEL}.k{self.incarnation}")
        return self.ep.channel(peer.cluster, peer.rank, CHANNEL)

    def _listen(self, peer: Peer) -> list[tuple[Channel, int | None, str]]:
        if self.controller is not None and peer == self.controller and self.me != self.controller:
            return [(self.channel(peer, e), e, "c") for e in range(self.epoch, self.epoch + EPOCH_WINDOW)]
        if self.me.rank == COMBINER_RANK and peer.rank >= FIRST_CLIENT_RANK:
            inc = self.incarnations.get(peer, 0)
            return [(self.channel(peer, e), e, "k") for e in range(inc, inc + CLIENT_WINDOW)]
        return [(self.channel(peer), None, "")]

    def poll_parts(self, peers: Collection[Peer], timeout_s: float, primary: Peer | None = None,
                   wake: Collection[Peer] = ()) -> RawMessage | None:
        """The next message (its parts) from any of `peers` (fair turns), or None after `timeout_s`, or as soon as
        one of `wake` (peers not polled) has a message, which is left unread.

        Between sweeps it sleeps with back-off, or, given a `primary` peer (the one most messages come from),
        blocks on that peer's channel instead, which costs no CPU however many actors wait in one process.
        """
        if self._ready is not None:
            return self._poll_ready(peers, timeout_s, wake)
        deadline = time.monotonic() + timeout_s
        nap = 0.0005
        while True:
            if any(self.channel(p).pending() for p in wake):
                return None
            n = len(peers)
            for i in range(n):
                peer = peers[(self._turn + i) % n]
                parts = None
                for ch, epoch, kind in self._listen(peer):
                    try:
                        parts = ch.recv_parts(0)
                    except TimeoutError:
                        continue
                    except ChannelError:
                        continue  # the peer's cluster is unreachable: its actors time out like silent ones
                    if kind == "c" and epoch > self.epoch:
                        self.epoch = epoch  # a restarted controller: follow it
                    elif kind == "k" and epoch > self.incarnations.get(peer, 0):
                        self.incarnations[peer] = epoch  # a restarted client: talk on its new channels
                    break
                if parts is not None:
                    self._turn = (self._turn + i + 1) % max(n, 1)
                    return peer, parts
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if primary is not None:
                try:
                    return primary, self.channel(primary).recv_parts(min(left, PRIMARY_WAIT_S))
                except (TimeoutError, ChannelError):
                    continue
            time.sleep(min(nap, left))
            nap = min(nap * 2, 0.02)

    def _poll_ready(self, peers: Collection[Peer], timeout_s: float, wake: Collection[Peer] = ()
                    ) -> RawMessage | None:
        """`poll_parts` of a watching actor: the channels that received something, oldest first, are the only ones
        looked at; a channel is visited for one message at a time, so a busy peer cannot starve the others."""
        wanted = peers if isinstance(peers, (set, frozenset)) else set(peers)
        deadline = time.monotonic() + timeout_s
        while True:
            for key in list(self._ready):
                got = self._take(key, wanted)
                if got is not None:
                    return got
            left = deadline - time.monotonic()
            if left <= 0 or any(self.channel(p).pending() for p in wake):
                return None
            for key in self.ep.ready(left):
                self._ready[key] = None

    def _take(self, key: ChannelKey, wanted: Collection[Peer]) -> RawMessage | None:
        """One message of the channel whose receiving key is `key`, or None (its entry dropped unless the peer
        is merely not wanted by this poll)."""
        peer = Peer(key.src_cluster, key.src_rank)
        if peer not in wanted:
            return None
        name, n = key.name, None
        kind = name[len(CHANNEL) + 1] if name.startswith(CHANNEL + ".") else ""
        if kind:
            try:
                n = int(name[len(CHANNEL) + 2:])
            except ValueError:
                kind = "?"
        client = self.me.rank >= FIRST_CLIENT_RANK  # a client talks on its own incarnation only
        oldest = (self.incarnation if client else self.incarnations.get(peer, 0)) if kind == "k" else self.epoch
        stale = (name != CHANNEL and kind not in ("c", "k")) or (kind in ("c", "k") and n < oldest) \
            or (client and kind == "k" and n != self.incarnation)
        ch = None if stale else self.ep.channel(key.src_cluster, key.src_rank, name)
        # a channel opened just now gets the messages that came before it once the I/O thread has registered it
        fresh = ch is not None and key not in self._opened
        if ch is None or not (fresh or ch.pending()):
            del self._ready[key]  # an old epoch's or incarnation's channel, or one read empty since
            return None
        self._opened.add(key)
        try:
            parts = ch.recv_parts(FRESH_WAIT_S if fresh else 0)
        except (TimeoutError, ChannelError):
            del self._ready[key]
            return None
        del self._ready[key]
        if ch.pending():
            self._ready[key] = None  # more waiting: to the back of the queue
        if kind == "c" and n > self.epoch:
            self.epoch = n  # a restarted controller: follow it
        elif kind == "k" and not client and n > self.incarnations.get(peer, 0):
            self.incarnations[peer] = n  # a restarted client: talk on its new channels
        return peer, parts
