"""Job configuration (`job.yaml`): clusters, the model split into stages, codecs, training, checkpoints.

One file describes the whole federated job; every cluster starts its part with the same file
(`nebula launch job.yaml --cluster A`). Relative paths (worker files, checkpoint and metrics directories,
hot-start checkpoints) are resolved against the job file's directory by `load_job_config`.

Example::

    job: toy
    mode: pipeline                 # pipeline (Scenario II: activations forward, gradients back) | oneway (Scenario I)
    recipe: {factory: "recipes.toy:ToyRecipe", args: {hidden: 16}}
    clusters:
      - {id: A, device: cpu, procs_per_node: 2, worker: prov/A/worker.yaml}
      - {id: B, device: cpu, procs_per_node: 2, worker: prov/B/worker.yaml}
    stages:                        # in model order; consecutive stages on one cluster run there back to back
      - {name: encoder, cluster: A}
      - {name: decoder, cluster: B}
    train: {steps: 20, global_batch: 16, micro_batches: 2, seed: 1}
    compression: {forward: "fp16(svd(0.6))", backward: int8, start_step: 0}
    checkpoint: {dir: ckpt, every: 10}
    metrics: {dir: metrics}

`mode: data_parallel` lists no stages: every cluster trains the whole model on its own share of the data and the
clusters average every `data_parallel.sync_every` steps over the WAN (`DataParallelSpec`, nebula.federated.diloco).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nebula.compress.config import CompressionConfig
from nebula.config.schema import ConfigError, load_yaml
from nebula.config.schema import resolve_path as _resolve

DEVICES = ("cpu", "gpu", "npu", "xpu")
MODES = ("pipeline", "oneway", "data_parallel")


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


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSpec:
    """Training loop: steps, batch split and seed (shared by all clusters, which keeps their data aligned)."""

    steps: int
    global_batch: int  # examples per optimizer step over all ranks of a stage's cluster
    micro_batches: int = 1  # micro-batches per rank and step (the pipeline depth)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"train.steps={self.steps} must be >= 1")
        if self.global_batch < 1 or self.micro_batches < 1:
            raise ValueError("train.global_batch and train.micro_batches must be >= 1")


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
    codec: str = "none"

    def __post_init__(self) -> None:
        if not self.lr > 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"data_parallel.outer: lr={self.lr} must be > 0 and momentum={self.momentum} in [0, 1)")
        from nebula.compress import get_codec

        try:
            get_codec(self.codec)
        except ValueError as exc:
            raise ValueError(f"data_parallel.outer.codec={self.codec!r} is not a valid codec spec: {exc}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallelSpec:
    """Cross-cluster data parallelism: every cluster trains a whole replica on its own share of every step's data and
    the clusters average over the WAN every `sync_every` steps (and after the last step)."""

    sync_every: int = 1
    outer: OuterSpec = field(default_factory=OuterSpec)

    def __post_init__(self) -> None:
        if isinstance(self.sync_every, bool) or not isinstance(self.sync_every, int) or self.sync_every < 1:
            raise ValueError(f"data_parallel.sync_every={self.sync_every!r} must be an integer >= 1 (steps between "
                             "averaging; 1 = every step)")


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


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    """A whole job: every cluster reads this same file and runs its own stages."""

    job: str
    recipe: RecipeSpec
    clusters: tuple[ClusterSpec, ...]
    stages: tuple[StageSpec, ...] = ()  # empty in mode data_parallel (every cluster runs every stage)
    train: TrainSpec
    mode: Literal["pipeline", "oneway", "data_parallel"] = "pipeline"
    data_parallel: DataParallelSpec = field(default_factory=DataParallelSpec)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    oneway: OneWaySpec = field(default_factory=OneWaySpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    peer_timeout_s: float = 120.0  # how long a rank waits for a silent peer cluster before exiting
    startup_timeout_s: float = 600.0  # how long a starting rank waits for the peer clusters to start
    # cut between clusters by an allocator instead of by hand: a method name or an AllocationSpec mapping
    allocation: Any = None

    @property
    def allocation_spec(self) -> AllocationSpec | None:
        """`allocation` as a spec (a bare method name means default profiles and WAN)."""
        return self.allocation

    def __post_init__(self) -> None:
        if isinstance(self.allocation, str):
            object.__setattr__(self, "allocation", AllocationSpec(method=self.allocation))
        elif isinstance(self.allocation, dict):
            from nebula.config.schema import from_dict

            object.__setattr__(self, "allocation", from_dict(AllocationSpec, self.allocation, "allocation"))
        elif self.allocation is not None and not isinstance(self.allocation, AllocationSpec):
            raise ValueError(f"allocation={self.allocation!r} must be a method name (e.g. optimal) or a mapping "
                             "with method, profiles, wan")
        if not self.job or "/" in self.job:
            raise ValueError(f"job {self.job!r} must be a non-empty name without '/'")
        if not self.clusters:
            raise ValueError("clusters is empty; list at least one cluster")
        ids = [c.id for c in self.clusters]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"cluster {sorted(dup)[0]!r} is listed twice under clusters")
        if self.peer_timeout_s <= 0 or self.startup_timeout_s <= 0:
            raise ValueError(f"peer_timeout_s={self.peer_timeout_s} and startup_timeout_s={self.startup_timeout_s} "
                             "must be > 0")
        if self.mode == "data_parallel":
            self._check_data_parallel()
            return
        if not self.stages:
            raise ValueError("stages is empty; list the recipe's stages with the cluster of each")
        for s in self.stages:
            if s.cluster not in ids:
                raise ValueError(f"stage {s.name!r} runs on cluster {s.cluster!r}, which is not under clusters "
                                 f"(known: {', '.join(ids)})")
        segs = [c for i, c in enumerate(s.cluster for s in self.stages) if i == 0 or self.stages[i - 1].cluster != c]
        if len(set(segs)) != len(segs):
            raise ValueError(f"stages visit a cluster twice ({' -> '.join(segs)}); give each cluster one contiguous "
                             "run of stages")
        self._check_pairing(segs)

    def _check_pairing(self, segs: list[str]) -> None:
        if self.mode == "oneway":
            self._check_oneway(segs)
            return
        piped = [c for c in self.clusters if c.pipeline is not None]
        if piped and len(segs) > 1:
            raise ValueError(f"cluster {piped[0].id} has a pipeline: a layer pipeline inside a cluster runs in a "
                             "job of one cluster; remove clusters[].pipeline or run the stages in one cluster")
        if piped:
            pp = piped[0].pipeline
            replicas = piped[0].world_size // pp.num_stages
            if self.train.global_batch % (replicas * self.train.micro_batches):
                raise ValueError(f"train.global_batch={self.train.global_batch} must divide evenly over {replicas} "
                                 f"replicas x {self.train.micro_batches} micro-batches")
            return
        sizes = {c: self.cluster(c).world_size for c in segs}
        if len(set(sizes.values())) != 1:
            raise ValueError("ranks do not pair up: pipeline clusters need equal rank counts (rank r talks to rank r), "
                             f"got {', '.join(f'{c}={n}' for c, n in sizes.items())}; change procs_per_node/nodes")
        world = next(iter(sizes.values()))
        if self.train.global_batch % (world * self.train.micro_batches):
            raise ValueError(f"train.global_batch={self.train.global_batch} must divide evenly over {world} ranks x "
                             f"{self.train.micro_batches} micro-batches")

    def _check_data_parallel(self) -> None:
        """Every cluster runs the whole model on its own `train.global_batch` examples per step."""
        if self.stages:
            raise ValueError("mode data_parallel runs every stage in every cluster; remove stages")
        for c in self.clusters:
            if c.pipeline is not None:
                raise ValueError(f"cluster {c.id}: mode data_parallel runs ranks data parallel; remove "
                                 f"clusters[{c.id}].pipeline")
            if self.train.global_batch % (c.world_size * self.train.micro_batches):
                raise ValueError(f"train.global_batch={self.train.global_batch} (examples per step in each cluster) "
                                 f"must divide evenly over cluster {c.id}'s {c.world_size} ranks x "
                                 f"{self.train.micro_batches} micro-batches")

    def _check_oneway(self, segs: list[str]) -> None:
        """Scenario I: every cluster but the last sends (one generator each, M3), the last receives; sender rank s
        feeds receiver ranks s*k..s*k+k-1 (receiver ranks beyond them idle); all on one cluster: local hand-off."""
        k, t = self.oneway.k, self.train
        if len(segs) == 1:
            c = self.cluster(segs[0])
            if c.world_size != 1:
                raise ValueError(f"mode oneway with every stage on cluster {c.id} (local hand-off) runs on one rank, "
                                 f"it has {c.world_size}; set procs_per_node: 1 or place the stages on several "
                                 "clusters")
            return
        rcv = self.cluster(segs[-1])
        senders = sum(self.cluster(c).world_size for c in segs[:-1])
        if k == "auto":
            if rcv.world_size < senders:
                raise ValueError(f"ranks do not pair up: {senders} sender rank(s) need at least as many ranks on "
                                 f"receiver cluster {rcv.id}, it has {rcv.world_size}; change procs_per_node/nodes")
            return
        if senders * k > rcv.world_size:
            raise ValueError(f"ranks do not pair up: oneway.k={k} needs cluster {rcv.id} to have {senders * k} ranks "
                             f"({senders} sender rank(s) x k), it has {rcv.world_size}: k is larger than the ranks "
                             f"available; lower oneway.k to at most {max(rcv.world_size // senders, 1)}, use k: auto, "
                             f"or give cluster {rcv.id} more ranks (procs_per_node/nodes)")
        if t.global_batch % (senders * k * t.micro_batches):
            raise ValueError(f"train.global_batch={t.global_batch} must divide evenly over {senders * k} receiver "
                             f"ranks x {t.micro_batches} micro-batches")

    def cluster(self, cluster_id: str) -> ClusterSpec:
        """The cluster entry named `cluster_id`, or ConfigError naming the known ones."""
        for c in self.clusters:
            if c.id == cluster_id:
                return c
        raise ConfigError(f"no cluster {cluster_id!r} in this job; known: {', '.join(c.id for c in self.clusters)}")

    @property
    def segments(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(cluster, its stage names) in model order; one segment per cluster taking part."""
        out: list[tuple[str, list[str]]] = []
        for s in self.stages:
            if out and out[-1][0] == s.cluster:
                out[-1][1].append(s.name)
            else:
                out.append((s.cluster, [s.name]))
        return tuple((c, tuple(n)) for c, n in out)

    @property
    def inter_cluster(self) -> bool:
        """True when stages span more than one cluster (boundaries go through the switch servers)."""
        return len(self.segments) > 1

    def intra(self, cluster_id: str) -> "JobConfig":
        """The same job run entirely inside `cluster_id` (the intra-cluster comparison mode)."""
        self.cluster(cluster_id)
        if self.mode == "data_parallel":  # one replica, no WAN: the cluster alone
            return dataclasses.replace(self, clusters=(self.cluster(cluster_id),))
        stages = tuple(dataclasses.replace(s, cluster=cluster_id) for s in self.stages)
        if self.mode == "oneway" and len(self.segments) > 2:  # several senders: hand-off local, not chained
            return dataclasses.replace(self, stages=stages)
        return dataclasses.replace(self, stages=stages, mode="pipeline")


def resolve_job_paths(cfg: JobConfig, base: Path) -> JobConfig:
    """Return `cfg` with relative paths made absolute against `base` (the job file's directory)."""
    clusters = tuple(dataclasses.replace(c, worker=_resolve(c.worker, base)) for c in cfg.clusters)
    ck = cfg.checkpoint
    ck = dataclasses.replace(ck, dir=_resolve(ck.dir, base), init_from=_resolve(ck.init_from, base))
    mt = dataclasses.replace(cfg.metrics, dir=_resolve(cfg.metrics.dir, base))
    al = cfg.allocation_spec
    if al is not None:
        files = {c: al.profiles.get(c, f"profiles/{c}.yaml") for c, _ in cfg.segments}
        al = dataclasses.replace(al, profiles={c: _resolve(f, base) for c, f in {**al.profiles, **files}.items()})
    return dataclasses.replace(cfg, clusters=clusters, checkpoint=ck, metrics=mt, allocation=al)


def load_job_config(file: str | Path) -> JobConfig:
    """Load a job YAML file; structural errors name the file and the key (no recipe import, no file checks)."""
    file = Path(file)
    cfg = load_yaml(JobConfig, file)
    return resolve_job_paths(cfg, file.resolve().parent)

