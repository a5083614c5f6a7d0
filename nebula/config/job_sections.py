"""The sections of a job file (`nebula.config.job`): clusters, stages, recipe, training, codecs, one-way and
data-parallel options, checkpoints, metrics and the allocation between clusters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from nebula.compress import get_codec
from nebula.compress.delta import is_keyed
from nebula.config.fields import CodecSpec
from nebula.config.schema import check_fields

__all__ = ["PipelineSpec", "ClusterSpec", "StageSpec", "RecipeSpec", "TrainSpec", "OneWaySpec", "OuterSpec",
           "StreamingSpec", "DataParallelSpec", "CheckpointSpec", "MetricsSpec", "WanSpec", "AllocationSpec",
           "CompressionConfig", "DEVICES"]

DEVICES = ("cpu", "gpu", "npu", "xpu")


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSpec:
    """A layer pipeline inside one cluster (hybrid DP x PP): its ranks form num_stages stages x replicas.

    The recipe's layers (its `layered()` model) are cut into `num_stages` contiguous ranges, by `bounds` when given,
    else by the `allocation` method (nebula.balance) from the device profiles the ranks measure at start-up.
    """

    num_stages: int = 2
    allocation: str = "even"  # allocator method of nebula.balance used when bounds is not given
    bounds: tuple[int, ...] | None = None  # explicit partition index, length num_stages + 1 (0 .. num_layers)
    slowdown: tuple[float, ...] = ()  # per rank: compute takes this many times longer (>= 1; simulated devices)
    probe: bool = True  # measure each rank (compute, memory, link) before allocating; false: identical devices
    # time all ranks at once (ranks sharing a host's cores see their contention); None: where a host's CPU ranks
    # outnumber its cores
    probe_together: bool | None = None

    def __post_init__(self) -> None:
        if self.num_stages < 1:
            raise ValueError(f"pipeline.num_stages={self.num_stages} must be >= 1")
        if self.bounds is not None:
            b = list(self.bounds)
            if len(b) != self.num_stages + 1 or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:])):
                raise ValueError(f"pipeline.bounds={b} must be {self.num_stages + 1} strictly increasing layer "
                                 "indices starting at 0 (the last is the number of layers)")
        if any(not f >= 1.0 for f in self.slowdown):
            raise ValueError(f"pipeline.slowdown={list(self.slowdown)} must hold factors >= 1 (1 = full speed)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """One cluster of the job: where its ranks run and how they reach their switch server."""

    id: str
    device: Literal["cpu", "gpu", "npu", "xpu"] = "cpu"  # passed to paddle.set_device on every rank
    nodes: int = 1  # machines of this cluster taking part
    procs_per_node: int = 1  # ranks per machine (paddle.distributed.launch --nproc_per_node)
    worker: str | None = None  # worker.yaml of this cluster's switch; required when the job spans clusters
    master: str | None = None  # host:port of node 0's rendezvous, needed only when nodes > 1
    pipeline: PipelineSpec | None = None  # layer pipeline over this cluster's ranks (None: ranks are data parallel)

    def __post_init__(self) -> None:
        if not self.id or not self.id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"cluster id {self.id!r} must be a non-empty name of letters, digits, '-' or '_'")
        if self.nodes < 1:
            raise ValueError(f"cluster {self.id}: nodes={self.nodes} must be >= 1")
        if self.procs_per_node < 1:
            raise ValueError(f"cluster {self.id}: procs_per_node={self.procs_per_node} must be >= 1")
        if self.nodes > 1 and not self.master:
            raise ValueError(f"cluster {self.id}: nodes={self.nodes} needs master: <host:port of node 0>")
        pp = self.pipeline
        if pp is not None and self.world_size % pp.num_stages:
            raise ValueError(f"cluster {self.id}: {self.world_size} ranks do not split into pipeline.num_stages="
                             f"{pp.num_stages} stages of equal replicas; use a divisor of {self.world_size}")
        if pp is not None and pp.slowdown and len(pp.slowdown) != self.world_size:
            raise ValueError(f"cluster {self.id}: pipeline.slowdown has {len(pp.slowdown)} factors for "
                             f"{self.world_size} ranks; give one per rank")

    @property
    def world_size(self) -> int:
        """Ranks of this cluster (data-parallel replicas of its stages)."""
        return self.nodes * self.procs_per_node


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSpec:
    """A stage of the model (named by the recipe) and the cluster that runs it."""

    name: str
    cluster: str


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipeSpec:
    """Which recipe builds the stages: `factory` is "module:attr", called as factory(**args)."""

    factory: str
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        mod, sep, attr = self.factory.partition(":")
        if not sep or not mod or not attr:
            raise ValueError(f"recipe.factory {self.factory!r} must be 'module:attr', e.g. 'recipes.toy:ToyRecipe'")


MAX_STALE = 4  # steps in flight with stale weights: each holds a copy of the upstream stages' parameters


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSpec:
    """Training loop: steps, batch split and seed (shared by all clusters, which keeps their data aligned)."""

    steps: int
    global_batch: int  # examples per optimizer step over all ranks of a stage's cluster
    micro_batches: int = 1  # micro-batches per rank and step (the pipeline depth)
    seed: int = 0
    # N >= 1: clusters before the last start a step's forwards before the previous N steps' gradients are back, with
    # N-step-stale weights (PipeDream-2BW's weight stashing, nebula/pipeline/stale.py); 0: synchronous steps
    stale_weights: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"train.steps={self.steps} must be >= 1")
        if self.global_batch < 1 or self.micro_batches < 1:
            raise ValueError("train.global_batch and train.micro_batches must be >= 1")
        if isinstance(self.stale_weights, bool) or self.stale_weights not in range(MAX_STALE + 1):
            raise ValueError(f"train.stale_weights={self.stale_weights!r} must be 0 (synchronous steps) or a number "
                             f"of steps from 1 to {MAX_STALE} (N-step-stale weights before the last cluster)")


@dataclass(frozen=True, kw_only=True, slots=True)
class OneWaySpec:
    """Scenario I: one sender rank feeds k receiver ranks through a root; sync tensor after every step."""

    k: int | str = 1  # receivers per sender rank, or "auto": chosen from both sides' measured step times
    sync_lag: int = 1  # steps the sender may run ahead of the receivers' last sync (0 = lock-step)
    probe_micro_batches: int = 3  # with k auto: micro-batches each side times before training

    def __post_init__(self) -> None:
        if self.k != "auto" and (isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"oneway.k={self.k!r} must be an integer >= 1 or 'auto'")
        if self.probe_micro_batches < 1:
            raise ValueError(f"oneway.probe_micro_batches={self.probe_micro_batches} must be >= 1")
        if self.sync_lag < 0:
            raise ValueError(f"oneway.sync_lag={self.sync_lag} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class OuterSpec:
    """The outer step on the clusters' mean pseudo-gradient D = anchor - replica, taken every `sync_every` steps.

    `average`: anchor <- anchor - D, the plain mean of the replicas (lr, momentum, nesterov unused). `diloco`: SGD
    with (Nesterov) momentum on D (Douillard et al. 2023: lr 0.7, momentum 0.9). `codec` compresses each cluster's
    pseudo-gradient on the WAN (a nebula.compress spec, e.g. int8, ef(int8), fp16(lowrank(rank=4))).
    """

    algorithm: Literal["average", "diloco"] = "diloco"
    lr: float = 0.7
    # 0, not the paper's 0.9: WAN jobs take few outer steps, and over 12 of them the momentum overshoots the replicas'
    # mean (weights 3.4x larger, held-out loss 0.31 vs 0.20 for the language-ID recipe, recipes/federated/README.md);
    # set 0.9 for runs of many outer steps
    momentum: float = 0.0
    nesterov: bool = True
    codec: CodecSpec = "none"

    def __post_init__(self) -> None:
        if not self.lr > 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"data_parallel.outer: lr={self.lr} must be > 0 and momentum={self.momentum} in [0, 1)")
        check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamingSpec:
    """Streaming DiLoCo (Douillard et al. 2025): the model's values, in layer order, cut into `fragments` equal
    slices, each synced once every `sync_every` steps at its own offset, so one slice crosses the WAN at a time.

    `delay` inner steps run while a slice's pseudo-gradient is on the WAN; its outer result is then merged as
    replica <- merge_alpha * replica + (1 - merge_alpha) * outer (delay 0: the replica becomes the outer result at
    once, as plain DiLoCo does)."""

    fragments: int = 1
    delay: int = 0
    merge_alpha: float = 0.5

    def __post_init__(self) -> None:
        for key in ("fragments", "delay"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"data_parallel.streaming.{key}={v!r} must be an integer")
        if self.fragments < 1:
            raise ValueError(f"data_parallel.streaming.fragments={self.fragments} must be >= 1 (slices of the model "
                             "synced in turn; 1 = the whole model at once)")
        if self.delay < 0:
            raise ValueError(f"data_parallel.streaming.delay={self.delay} must be >= 0 (inner steps a slice's sync "
                             "overlaps; 0 = merge at once)")
        if isinstance(self.merge_alpha, bool) or not 0.0 <= self.merge_alpha <= 1.0:
            raise ValueError(f"data_parallel.streaming.merge_alpha={self.merge_alpha!r} must be in [0, 1] (the "
                             "replica's share when a delayed outer result is merged; the paper's 0.5)")


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallelSpec:
    """Cross-cluster data parallelism: every cluster trains a whole replica on its own share of every step's data and
    the clusters average over the WAN every `sync_every` steps (and after the last step); with `streaming`, in
    fragments synced in turn (Streaming DiLoCo, `StreamingSpec`)."""

    sync_every: int = 1
    outer: OuterSpec = field(default_factory=OuterSpec)
    streaming: StreamingSpec | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sync_every, bool) or not isinstance(self.sync_every, int) or self.sync_every < 1:
            raise ValueError(f"data_parallel.sync_every={self.sync_every!r} must be an integer >= 1 (steps between "
                             "averaging; 1 = every step)")
        st = self.streaming
        if st is None:
            return
        h = self.sync_every
        if st.fragments > h:
            raise ValueError(f"data_parallel.streaming.fragments={st.fragments} must be from 1 to "
                             f"data_parallel.sync_every ({h}): each fragment syncs once per interval at its own step; "
                             f"lower fragments or raise sync_every")
        if st.delay > h - 1:
            raise ValueError(f"data_parallel.streaming.delay={st.delay} must be from 0 to data_parallel.sync_every - 1 "
                             f"({h - 1}): a fragment's outer result merges before its next send; lower delay or "
                             "raise sync_every")
        if self.outer.algorithm not in ("diloco", "average"):
            raise ValueError(f"data_parallel.streaming needs data_parallel.outer.algorithm diloco or average, got "
                             f"{self.outer.algorithm!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSpec:
    """Consistent checkpoints: every cluster saves its stages at the same steps."""

    dir: str | None = None  # None disables saving
    every: int = 0  # save every this many steps (0: only at the end)
    keep: int = 3  # newest checkpoints kept per cluster
    resume: bool = True  # continue from the newest step that every cluster has
    init_from: str | None = None  # hot start: a step directory (e.g. from an intra-cluster run) to load weights from

    def __post_init__(self) -> None:
        if self.every < 0 or self.keep < 1:
            raise ValueError(f"checkpoint.every={self.every} must be >= 0 and checkpoint.keep={self.keep} >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsSpec:
    """Per-step metrics as JSON lines (one file per cluster and rank) and a progress bar on rank 0."""

    dir: str | None = "metrics"
    progress: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class WanSpec:
    """The WAN link between consecutive clusters, as the between-cluster allocation charges it."""

    latency_ms: float = 30.0
    rate_mbit: float = 100.0  # measured with nebula-switch probe

    def __post_init__(self) -> None:
        if self.latency_ms < 0 or self.rate_mbit <= 0:
            raise ValueError(f"allocation.wan latency_ms={self.latency_ms} must be >= 0 and rate_mbit="
                             f"{self.rate_mbit} > 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class AllocationSpec:
    """Cut the recipe's layers between the clusters (one stage per cluster) from their measured profiles.

    A preflight step (nebula.hybrid.plan) reads each cluster's profiles file (written by `nebula bench`), charges
    the WAN link to every cluster but the last, runs the allocator and passes the cut to the recipe as `bounds`.
    `allocation: optimal` is short for `{method: optimal}` with profiles at profiles/<cluster>.yaml.
    """

    method: str = "optimal"
    profiles: dict[str, str] = field(default_factory=dict)  # cluster id -> profiles file (default profiles/<id>.yaml)
    wan: WanSpec = field(default_factory=WanSpec)
    # a cut already made (nebula allocate --write-job writes these): bounds are used as they are, no profiles read
    devices: tuple[str, ...] = ()  # the clusters in pipeline order
    bounds: tuple[int, ...] = ()
    bottleneck_s: float | None = None  # predicted, for the record
    stage_times_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.bounds:
            b = list(self.bounds)
            if len(b) != len(self.devices) + 1 or b[0] != 0 or any(y <= x for x, y in zip(b, b[1:])):
                raise ValueError(f"allocation.bounds={b} must be 0 = b0 < b1 < ... with one more entry than "
                                 f"allocation.devices ({len(self.devices)}); rerun nebula allocate --write-job")
        if self.stage_times_s and len(self.stage_times_s) != len(self.devices):
            raise ValueError("allocation.stage_times_s needs one entry per device; rerun nebula allocate --write-job")

    def layers_of(self, device: str) -> range:
        """Layer indices the named device holds (ValueError naming the known devices)."""
        if device not in self.devices:
            raise ValueError(f"device {device!r} is not in allocation.devices ({', '.join(self.devices)})")
        k = self.devices.index(device)
        return range(self.bounds[k], self.bounds[k + 1])


DIRECTIONS = ("forward", "backward")


@dataclass(frozen=True, kw_only=True, slots=True)
class CompressionConfig:
    """Codecs for activations sent forward and gradients sent back; before `start_step` both send 'none'.

    Defaults: forward 'none', backward 'none', start_step 0 (compress from the first step, as in Table 5).
    The paper's best setting is forward 'fp16(svd(0.6))', backward 'int8', start_step 2000 (Figure 10).
    """

    forward: CodecSpec = "none"
    backward: CodecSpec = "none"
    start_step: int = 0

    def __post_init__(self) -> None:
        check_fields(self)
        if isinstance(self.start_step, bool) or not isinstance(self.start_step, int) or self.start_step < 0:
            raise ValueError(f"compression.start_step = {self.start_step!r} must be an integer >= 0 (0 compresses "
                             f"from the first step)")
        if is_keyed(get_codec(self.backward)):
            raise ValueError(f"compression.backward = {self.backward!r}: gradients carry no example ids, so "
                             "delta(...) applies to compression.forward only; set backward to a codec such as "
                             "int4_block or int8")

    def spec_at(self, direction: str, step: int) -> str:
        """Codec spec to use for `direction` ('forward' or 'backward') at training step `step`."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r} must be 'forward' or 'backward'")
        return "none" if step < self.start_step else getattr(self, direction)
