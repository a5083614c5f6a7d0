"""`nebula bench`: the device benchmark of one cluster, run on its real ranks, written as a profiles file.

The cluster's ranks start under paddle.distributed.launch exactly as for training; each runs the probe
(nebula.hybrid.probe) and rank 0 writes every rank's `DeviceProfile` and the cluster seen as one device (its
slowest rank's seconds per FLOP divided by its data-parallel ranks, its smallest memory) to a YAML file, which
the between-cluster allocation (`allocation:` in the job file) reads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from security._yaml import YamlError, read_yaml

__all__ = ["write_profiles", "read_profiles", "cluster_profile"]

def cluster_profile(ranks: list[dict], name: str) -> Any:
    """The cluster as one device for the between-cluster allocation: its data-parallel ranks share each stage's
    work (seconds per FLOP of the slowest over their number), every rank holds the whole stage (least memory)."""
    from nebula.balance import DeviceProfile

    tpf = max(r["compute_s"] / r["probe_flops"] for r in ranks) / len(ranks)
    return DeviceProfile(tpf, min(r["free_memory_bytes"] for r in ranks), name=name)


def write_profiles(path: str | Path, cluster: str, device: str, ranks: list[dict]) -> Path:
    """Write the benchmark of one cluster: per-rank measurements and profiles, and the cluster as one device."""
    def prof(p: Any) -> dict:
        return {"time_per_flop_s": p.time_per_flop_s, "memory_bytes": p.memory_bytes, "latency_s": p.latency_s,
                "bandwidth_bytes_per_s": p.bandwidth_bytes_per_s}  # YAML writes inf as .inf

    from nebula.hybrid.probe import RankProbe

    probes = [RankProbe(**r) for r in ranks]
    doc = {"cluster": cluster, "device": device,
           "ranks": [{**r, "profile": prof(p.profile())} for r, p in zip(ranks, probes)],
           "profile": prof(cluster_profile(ranks, cluster))}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def read_profiles(path: str | Path) -> dict:
    """A profiles file: {'cluster', 'device', 'ranks': [...], 'profile': {...}}; ValueError naming what is wrong."""
    path = Path(path)
    try:
        doc = read_yaml(path, "profiles file", finite=False)  # (.inf: a bandwidth without limit)
    except YamlError as exc:
        raise ValueError(f"{exc}; run nebula bench to write it") from None
    if not isinstance(doc, dict) or not {"cluster", "profile", "ranks"} <= set(doc):
        raise ValueError(f"profiles file {path} has no cluster/profile/ranks; write it with nebula bench")
    return doc
