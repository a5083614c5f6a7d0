"""All-clusters weighted mean over the switch servers: one leader rank per cluster, every leader gets the same mean.

The spine's aggregation runs through a reducer (FEDn's rounds); cross-cluster data parallelism needs the symmetric
primitive instead: each leader sends its tensors, encoded with the job's codec, to every other leader over its
`nebula.messaging.Messenger` and folds every cluster's decoded tensors, in job order, into a
`nebula.mean.RunningMean`. Because every leader decodes the same bytes (its own included) in the same
order, all of them hold bitwise the same mean without a second broadcast. `post` and `collect` are the two halves of
`mean`: the send goes out at once and the peers' shares are read later, so the exchange overlaps the inner steps in
between (streaming DiLoCo's delayed merge). With two clusters this is also the
fewest bytes: each link carries one encoded model each way per mean.

`agree()` is the start-up handshake: the leaders exchange their initial models (the bulk lane, in pieces), refuse
a cluster whose model differs in keys, shapes or dtypes (naming the tensor), and all adopt the first cluster's
weights so that every replica starts from the same point; they also exchange the steps of their checkpoints, so a
restarted job resumes from the newest step every cluster holds.

A leader's codecs (one per tensor) are its only WAN state beyond the outer optimizer's: `codec_state` packs their
whole state (`Codec.export_state`: error-feedback residuals, low-rank warm starts and their generator) for its
cluster's checkpoint (`pack_codec_state`) and `unpack_codec_state` builds them back, checked against the tensors
sent, so that a resumed leader encodes exactly as the uninterrupted one would.
"""
from __future__ import annotations

import logging
import secrets
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from nebula.channel import ChannelError, Endpoint
from nebula.compress import Codec, decode_from_frames, encode_to_frames, get_codec
from nebula.mean import RunningMean, check_model_update
from nebula.messaging import Malformed, Message, MessageFamily, Messenger, Peer

__all__ = ["ClusterMean", "ClusterLost", "ModelMismatch", "TO_LEADER", "LeaderHello", "MeanShare", "Posted",
           "CODEC_KEY", "pack_codec_state", "unpack_codec_state"]

log = logging.getLogger(__name__)
TO_LEADER = MessageFamily("data-parallel leader")  # what one cluster's leader sends another's
LEADER_CHANNEL = "dp"  # the leaders' channels when no recovery round names them


@TO_LEADER.message("hello")
class LeaderHello(Message):
    """The start-up handshake: the leader's cluster, the settings that must match, its checkpoint steps and run
    (its initial model follows)."""

    cluster: str
    plan: dict[str, Any]
    checkpoints: tuple[int, ...] = ()
    run: str


@TO_LEADER.message("mean")
class MeanShare(Message):
    """One leader's share of mean number `seq`: its example count and the byte size of each encoded tensor (the
    tensors follow as one payload)."""

    run: str
    seq: int
    num_examples: int
    sizes: tuple[tuple[str, int], ...]


class ClusterLost(RuntimeError):
    """A peer cluster's leader stayed silent (or unreachable) past the timeout."""

    def __init__(self, cluster: str, message: str) -> None:
        super().__init__(message)
        self.cluster = cluster


class ModelMismatch(ValueError):
    """Two clusters hold models (or plans) that cannot be averaged; the message names what differs."""


class ClusterMean:
    """The leader of `cluster` among `clusters` (job order): `agree()` once, then `mean()` as often as needed.
    `channel` names the leaders' channels (whole-job recovery opens new ones in every round, so nothing a leader
    sent before a recovery is read after it)."""

    def __init__(self, ep: Endpoint, clusters: list[str], *, rank: int = 0, codec: str = "none",
                 timeout_s: float = 120.0, startup_timeout_s: float = 600.0, channel: str | None = None) -> None:
        self.mb = Messenger(ep, TO_LEADER, channel=channel or LEADER_CHANNEL)
        self.me = ep.cluster
        self.order = list(clusters)
        if self.me not in self.order:
            raise ValueError(f"cluster {self.me!r} is not one of {self.order}")
        self.peers = [Peer(c, rank) for c in self.order if c != self.me]
        self.spec = codec
        self._codecs: dict[str, Codec] = {}  # one per tensor: ef residuals and low-rank warm starts are per tensor
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self.num_means = 0
        # this leader's run and each peer's, from the handshake: every mean names its run, so a message that an
        # earlier run of a peer sent before a restart (kept by a switch for this rank) is refused, not averaged
        self.run = secrets.token_hex(8)
        self.peer_runs: dict[str, str] = {}

    @property
    def sent_bytes(self) -> int:
        """Every byte this leader has sent to the other clusters (headers, models, encoded tensors)."""
        return sum(self.mb.sent_bytes.values())

    def _recv(self, peer: Peer, timeout_s: float, what: str) -> tuple[Message, Any]:
        try:
            return self.mb.recv(peer, timeout_s)
        except (TimeoutError, ChannelError) as exc:
            raise ClusterLost(peer.cluster, f"cluster {peer.cluster} sent no {what} within {timeout_s:g} s "
                              f"({type(exc).__name__}: {exc}); it stopped or its link is down: restart every "
                              "cluster of the job") from None

    def agree(self, weights: Mapping[str, np.ndarray], plan: Mapping[str, Any],
              checkpoints: Sequence[int] = ()) -> tuple[dict[str, np.ndarray], int]:
        """Exchange initial models, `plan` (settings that must match) and the steps of the checkpoints each leader
        holds with every other leader: (the first cluster's weights, the newest checkpoint step every cluster
        holds, -1 if none). ModelMismatch names the tensor or setting that differs, ClusterLost a silent peer."""
        weights = {k: np.ascontiguousarray(v) for k, v in weights.items()}
        common = {int(s) for s in checkpoints}
        hello = LeaderHello(cluster=self.me, plan=dict(plan), checkpoints=tuple(sorted(common)), run=self.run)
        for p in self.peers:
            self.mb.send_model(p, hello, weights)
        models = {self.me: weights}
        for p in self.peers:
            got, _ = self._recv(p, self.startup_timeout_s, "start-up handshake")
            if not isinstance(got, LeaderHello):
                what = got.reason if isinstance(got, Malformed) else got.TYPE
                raise ModelMismatch(f"cluster {p.cluster}: expected its start-up handshake, got {what!r}")
            if got.plan != dict(plan):
                diff = sorted(k for k in set(plan) | set(got.plan) if got.plan.get(k) != plan.get(k))
                raise ModelMismatch(f"cluster {p.cluster} runs with different settings ({', '.join(diff)}: "
                                    f"{ {k: got.plan.get(k) for k in diff} } there, { {k: plan.get(k) for k in diff} } "
                                    f"in {self.me}); start every cluster with the same job file")
            try:  # the peer is up (its hello came): pieces that stop coming mean it is lost, not slow to start
                theirs = self.mb.recv_model(p, got, self.timeout_s)
            except TimeoutError as exc:
                raise ClusterLost(p.cluster, f"cluster {p.cluster}'s initial model stopped arriving: {exc}") from None
            except ValueError as exc:
                raise ModelMismatch(f"cluster {p.cluster}'s model cannot be read: {exc}") from None
            try:
                check_model_update(theirs, 1, f"cluster {p.cluster}'s model", like=weights)
            except ValueError as exc:
                raise ModelMismatch(f"{exc} (cluster {self.me} builds it differently); every cluster must build "
                                    "the same model: start them with the same job file and recipe") from None
            models[p.cluster] = theirs
            self.peer_runs[p.cluster] = got.run
            common &= set(got.checkpoints)
        return {k: np.array(v) for k, v in models[self.order[0]].items()}, max(common, default=-1)

    def codec_state(self) -> dict[str, np.ndarray]:
        """The state of this leader's codecs, for its cluster's checkpoint (`pack_codec_state`)."""
        return pack_codec_state(self.spec, self._codecs)

    def restore_codecs(self, codecs: Mapping[str, Codec]) -> None:
        """Send with `codecs` (per tensor, from `unpack_codec_state`) from now on; other tensors get fresh ones."""
        self._codecs = dict(codecs)

    def _codec(self, name: str) -> Codec:
        c = self._codecs.get(name)
        if c is None:
            c = self._codecs[name] = get_codec(self.spec)
        return c

    def mean(self, tensors: Mapping[str, np.ndarray], num_examples: int) -> dict[str, np.ndarray]:
        """The mean of every cluster's `tensors`, weighted by their `num_examples`, identical on every leader."""
        return self.collect(self.post(tensors, num_examples))

    def post(self, tensors: Mapping[str, np.ndarray], num_examples: int) -> Posted:
        """The sending half of `mean`: encode `tensors` and hand them to every peer without waiting for delivery
        (their bytes count in `sent_bytes` at once); `collect` the handle later, in the order posted."""
        self.num_means += 1
        blobs = {k: b"".join(bytes(f) for f in encode_to_frames(self._codec(k), np.ascontiguousarray(v)))
                 for k, v in tensors.items()}
        share = MeanShare(run=self.run, seq=self.num_means, num_examples=int(num_examples),
                          sizes=tuple((k, len(b)) for k, b in blobs.items()))
        payload = b"".join(blobs.values())
        for p in self.peers:
            self.mb.send(p, share, payload, lane="bulk")
        like = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
        return Posted(share, payload, like)

    def collect(self, posted: Posted) -> dict[str, np.ndarray]:
        """The receiving half of `mean`: every peer's share of the mean `posted` was, folded in job order.
        Handles are collected in the order they were posted (the peers' shares arrive in that order)."""
        seq = posted.share.seq
        got = {self.me: (posted.share, memoryview(posted.payload))}
        for p in self.peers:
            m, body = self._recv(p, self.timeout_s, f"tensors for mean {seq}")
            if isinstance(m, MeanShare) and p.cluster in self.peer_runs and m.run != self.peer_runs[p.cluster]:
                raise ModelMismatch(f"cluster {p.cluster} delivered mean #{m.seq} of an earlier run (a message "
                                    "its leader sent before a restart, kept for this rank); restart every cluster of "
                                    "the job: they resume from the last common checkpoint")
            if not isinstance(m, MeanShare) or m.seq != seq:
                what = f"{m.TYPE!r} #{getattr(m, 'seq', None)}" if not isinstance(m, Malformed) else m.reason
                raise ModelMismatch(f"cluster {p.cluster} sent {what} while {self.me} waits for mean "
                                    f"#{seq}; the clusters are out of step: restart every cluster with "
                                    "the same job file")
            got[p.cluster] = (m, body if body is not None else memoryview(b""))
        acc = RunningMean(like=posted.like)
        for c in self.order:  # the same order on every leader: the same floating-point sums
            m, body = got[c]
            acc.add(_unpack(m, body, c), m.num_examples, who=f"cluster {c}")
        return acc.result()


class Posted(NamedTuple):
    """A mean whose share this leader has sent (`ClusterMean.post`) and not yet collected."""

    share: MeanShare
    payload: bytes
    like: dict[str, np.ndarray]


CODEC_KEY = "codec"  # a checkpoint's outer codec spec; each tensor's codec state under codec/<tensor>/<key>


def pack_codec_state(spec: str, codecs: Mapping[str, Codec]) -> dict[str, np.ndarray]:
    """The codecs' state as flat named arrays: `codec` (the spec) and `codec/<tensor>/<key>` for each array of
    each codec's `export_state` (residuals, warm starts; a stateless codec has none)."""
    out = {CODEC_KEY: np.array(spec)}
    for name, c in codecs.items():
        out.update({f"{CODEC_KEY}/{name}/{k}": v for k, v in c.export_state().items()})
    return out


def unpack_codec_state(flat: Mapping[str, np.ndarray], spec: str, shapes: Mapping[str, tuple[int, ...]]
                       ) -> tuple[dict[str, Codec], str | None]:
    """(codecs of `spec` per tensor holding the state `flat` carries, a note for the log when state was lost).

    `shapes` are the tensors the leader sends. A checkpoint saved before codec state was kept, or with another
    codec, gives no codecs (they start from zero) and says so in the note; ValueError (CodecError) names the tensor
    whose state does not fit."""
    stateful = get_codec(spec).stateful
    if CODEC_KEY not in flat:
        return {}, (f"it holds no outer codec state (saved before checkpoints kept it): the state of {spec} "
                    "(error-feedback residuals, low-rank warm starts) starts from zero, so this run differs slightly "
                    "from an uninterrupted one" if stateful else None)
    saved = str(np.asarray(flat[CODEC_KEY]).item())
    states: dict[str, dict[str, np.ndarray]] = {}
    for key, v in flat.items():
        if key.startswith(f"{CODEC_KEY}/"):
            name, _, part = key[len(CODEC_KEY) + 1:].rpartition("/")
            states.setdefault(name, {})[part] = v
    if saved != spec:
        return {}, (f"its outer codec state is for {saved} and this job sends with {spec}: the codec starts from "
                    "zero" if states else None)
    unknown = sorted(set(states) - set(shapes))
    if unknown:
        raise ValueError(f"its outer codec state names tensors {unknown} that this job does not send: it was saved "
                         "by another model or with other streaming settings")
    codecs = {}
    for name, state in states.items():
        c = codecs[name] = get_codec(spec)
        c.import_state(state, shape=tuple(shapes[name]), name=f"tensor {name!r}")
    return codecs, None


def _unpack(share: MeanShare, body: memoryview, cluster: str) -> dict[str, np.ndarray]:
    out, off = {}, 0
    try:
        for name, size in share.sizes:
            out[str(name)] = decode_from_frames([body[off: off + int(size)]], like="numpy")
            off += int(size)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelMismatch(f"cluster {cluster}: malformed tensors ({exc})") from None
    if off != len(body):
        raise ModelMismatch(f"cluster {cluster}: {len(body) - off} bytes beyond the tensors its header lists")
    return out
