"""The recovery agreement over the job's channels: each cluster's coordinator (one rank of it, rank 0 by default)
runs its `Agreement` and talks to every other cluster's coordinator on the channel `nebula.recovery`, through the
switches (ordered, exactly once; messages for a coordinator that died wait at its switch for the next launch, which
ignores them as stale).

A cluster's launch count is kept on its own disk (`<state_dir>/<cluster>.launches.json`, written atomically), so a
launch compares newer than every earlier one without any clock; a launch whose file was lost is numbered above the
ones its peers know (`Renumbered`). The caller is the training runtime: `start` before the first step, then
`pause_requested` at every step boundary and `recover` when it stopped (because it lost a peer, or because another
cluster began a recovery). `RecoveryAbandoned` means exit 3 with its message (today's message for a lost peer).
"""
from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from nebula.channel import ChannelError
from nebula.recovery import durable
from nebula.recovery.durable import CheckpointError
from nebula.recovery.messages import Incarnation, RecoveryRefused, decode_recovery, encode_recovery
from nebula.recovery.protocol import (Agreement, Event, GiveUp, Paused, Received, Renumbered, RequestPause, Resume,
                                      Send, Started, Superseded, Tick)

__all__ = ["CHANNEL", "Coordinator", "RecoveryAbandoned", "RecoverySuperseded", "launch_incarnation"]

log = logging.getLogger(__name__)

CHANNEL = "nebula.recovery"
_LOGGED_REFUSALS = 20  # refused messages logged one by one per coordinator; then every 100th


class RecoveryAbandoned(RuntimeError):
    """The recovery could not finish within recovery_timeout_s (or a peer does not follow it): exit 3."""

    def __init__(self, cluster: str, message: str) -> None:
        super().__init__(message)
        self.cluster = cluster


class RecoverySuperseded(RuntimeError):
    """A newer launch of this cluster exists: this process must stop without touching the job."""


def _launches_file(state_dir: Path, cluster: str) -> Path:
    return state_dir / f"{cluster}.launches.json"


def _save_count(state_dir: Path, cluster: str, count: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    durable.write_marker(_launches_file(state_dir, cluster), {"cluster": cluster, "launches": count})


def launch_incarnation(state_dir: str | Path, cluster: str) -> Incarnation:
    """This launch of `cluster`: one more than the launches its state directory records, and a random nonce."""
    state_dir = Path(state_dir)
    f = _launches_file(state_dir, cluster)
    count = 0
    if f.is_file():
        try:
            count = int(durable.read_marker(f)["launches"])
        except (CheckpointError, KeyError, TypeError, ValueError) as exc:
            log.warning("%s is unreadable (%s); counting launches afresh: the peers' view numbers this launch", f,
                        exc)
    inc = Incarnation(count + 1, secrets.randbits(63))
    _save_count(state_dir, cluster, inc.count)
    return inc


class Coordinator:
    """One cluster's side of the recovery agreement, over channels of `endpoint` to rank `peer_rank` of every other
    cluster of the job (`clusters`, in the job's order)."""

    def __init__(self, endpoint: Any, *, job: str, clusters: Sequence[str], timeout_s: float,
                 state_dir: str | Path, peer_rank: int = 0, poll_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster, self.job, self.clusters = endpoint.cluster, job, tuple(clusters)
        self.state_dir, self.poll_s, self.clock, self.timeout_s = Path(state_dir), poll_s, clock, timeout_s
        self.machine = Agreement(job, self.clusters, self.cluster, launch_incarnation(self.state_dir, self.cluster),
                                 timeout_s)
        self.channels = {c: endpoint.channel(c, peer_rank, CHANNEL) for c in self.clusters if c != self.cluster}
        self._pause = False
        self._resumed: Resume | None = None
        self._refused = 0

    @property
    def incarnation(self) -> Incarnation:
        return self.machine.incarnation

    @property
    def round(self) -> Any:
        """The round of the last agreement (its epoch counts the recoveries)."""
        return self.machine.round

    def start(self, steps: Sequence[int], timeout_s: float | None = None) -> int:
        """Before the first step: agree with every cluster on the step to start from (-1: from scratch), waiting
        up to `timeout_s` (default: the recovery timeout; the runtime passes its startup_timeout_s) for them."""
        self.machine.timeout_s = timeout_s or self.timeout_s
        self._act(Started(tuple(steps)))
        return self._wait()

    def pause_requested(self) -> bool:
        """At a step boundary: read what arrived; True when another cluster began a recovery (call `recover`)."""
        self._pump()
        return self._pause

    def recover(self, steps: Sequence[int], lost: Sequence[str] = (), timeout_s: float | None = None) -> int:
        """Stopped at the boundary (after losing `lost`, or as asked): agree on the step to resume from, waiting up
        to `timeout_s` (default: the recovery timeout) for a lost cluster to come back."""
        self.machine.timeout_s = timeout_s or self.timeout_s
        self._pause = False
        self._act(Paused(tuple(steps), tuple(lost)))
        return self._wait()

    # ---- I/O --------------------------------------------------------------------------------------------------
    def _wait(self) -> int:
        while self._resumed is None:
            self._pump()
            if self._resumed is None:
                self._act(Tick())
                time.sleep(self.poll_s)
        step, self._resumed = self._resumed.step, None
        return step

    def _pump(self) -> None:
        for cluster, ch in self.channels.items():
            while ch.pending():
                try:
                    data = ch.recv(timeout_s=0)
                    msg = decode_recovery(data, job=self.job, clusters=self.clusters, sender=cluster)
                except (RecoveryRefused, ChannelError) as exc:  # a malformed message, or one the switch refused
                    self._refuse(cluster, exc)
                    continue
                self._act(Received(msg))

    def _refuse(self, cluster: str, exc: Exception) -> None:
        self._refused += 1
        if self._refused <= _LOGGED_REFUSALS or self._refused % 100 == 0:
            log.warning("recovery message from cluster %s refused (%d so far): %s", cluster, self._refused, exc)

    def _act(self, event: Event) -> None:
        for a in self.machine.handle(event, self.clock()):
            if isinstance(a, Send):
                self.channels[a.to].send(encode_recovery(a.message, self.clusters), lane="control")
            elif isinstance(a, RequestPause):
                log.warning("cluster %s: %s; pausing at the next step boundary", self.cluster, a.reason)
                self._pause = True
            elif isinstance(a, Resume):
                log.info("cluster %s: recovery round %d agreed on step %d", self.cluster, a.round.epoch, a.step)
                self._resumed, self._pause = a, False
            elif isinstance(a, Renumbered):
                log.warning("cluster %s: its launch count was behind its peers'; this launch is number %d",
                            self.cluster, a.incarnation.count)
                _save_count(self.state_dir, self.cluster, a.incarnation.count)
            elif isinstance(a, GiveUp):
                raise RecoveryAbandoned(a.cluster, a.message)
            elif isinstance(a, Superseded):
                raise RecoverySuperseded(a.message)
