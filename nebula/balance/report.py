"""What `nebula allocate` does: resolve the model and devices, allocate, format the table, write the job file."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from security._yaml import parse_yaml

from nebula.balance.base import allocate
from nebula.balance.cost import Allocation, LayerCost

__all__ = ["model_costs", "allocate_model", "format_table", "write_allocation", "human_bytes"]


def model_costs(model: str, **changes) -> list[LayerCost]:
    """Layer costs of a preset name (nebula.balance.bert.PRESETS, with optional shape changes) or a profile file."""
    from nebula.balance.bert import PRESETS, bert_costs, preset
    from nebula.balance.profile import load_profile

    if model in PRESETS:
        return bert_costs(preset(model, **changes))
    if Path(model).is_file():
        if changes:
            raise ValueError(f"{', '.join(changes)} only apply to preset models, not to the profile file {model}")
        return load_profile(model)
    raise ValueError(f"--model {model!r} is neither a preset ({', '.join(PRESETS)}) nor an existing profile file")


def allocate_model(model: str, devices: str | Path, method: str, **changes) -> tuple[Allocation, list[str]]:
    """Allocate the model's layers onto the devices of a devices.yaml file; returns the allocation and layer names."""
    from nebula.balance.devices import load_devices

    layers = model_costs(model, **changes)
    alloc = allocate(layers, load_devices(devices), method)
    return alloc, [x.name or str(k) for k, x in enumerate(layers)]


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    if n == float("inf"):
        return "unlimited"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_table(alloc: Allocation, layer_names: list[str] | None = None) -> str:
    """The allocation as a text table: device, layers, predicted time, memory used / limit."""
    n = alloc.bounds[-1]
    head = (f"method {alloc.method}: {n} layers on {alloc.num_devices} devices, predicted iteration time "
            f"{alloc.bottleneck_s:.4g} s (bottleneck)")
    if alloc.gap is not None and alloc.gap > 0:
        head += f", within {alloc.gap:.1%} of the best lower bound known"
    rows = [("device", "layers", "count", "first .. last", "time_s", "memory used / limit")]
    for r in alloc.rows():
        names = ""
        if layer_names:
            names = f"{layer_names[r['first_layer']]} .. {layer_names[r['last_layer']]}"
        rows.append((r["device"], f"{r['first_layer']}-{r['last_layer']}", str(r["num_layers"]), names,
                     f"{r['time_s']:.4g}",
                     f"{human_bytes(r['memory_bytes'])} / {human_bytes(r['memory_limit_bytes'])}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [head] + ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def write_allocation(path: Path, alloc: Allocation) -> None:
    """Put the allocation under `allocation:` in a job YAML file, replacing an old block and keeping the rest."""
    from nebula.balance.spec import spec_of
    from nebula.config.schema import to_dict

    text = path.read_text(encoding="utf-8")  # OSError names a missing file
    data = parse_yaml(text.encode("utf-8"), f"job file {path}") if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a job file (its top level is not a mapping)")
    cut = {k: v for k, v in to_dict(spec_of(alloc)).items() if k not in ("profiles", "wan")}  # a made cut reads none
    block = yaml.safe_dump({"allocation": cut}, sort_keys=False, default_flow_style=None)
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if re.match(r"allocation\s*:", ln)), None)
    if start is None:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.append(block)
    else:
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
            end += 1
        lines[start:end] = [block]
    new = "".join(lines)
    if parse_yaml(new.encode("utf-8"), str(path)).get("allocation") != yaml.safe_load(block)["allocation"]:
        raise ValueError(f"{path}: could not place the allocation block; remove its `allocation:` key and retry")
    path.write_text(new, encoding="utf-8")
