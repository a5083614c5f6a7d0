"""`nebula allocate` end to end, devices.yaml and profile files, BERT-style costs and real Paddle layer profiles."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nebula.balance import allocate
from nebula.balance.bert import bert_costs, bert_layers, example_input, preset
from nebula.balance.devices import load_devices
from nebula.balance.profile import load_profile, measure_layers, save_profile
from nebula.balance.spec import AllocationSpec
from nebula.config import ConfigError, load_job_config

from ..conftest import REPO

NEBULA = str(Path(sys.executable).parent / "nebula")  # the console script, loading this tree via PYTHONPATH

DEVICES = """\
devices:
  - {name: fast, flops_per_s: 1e13, memory_bytes: 30e9, latency_s: 0.001, bandwidth_bytes_per_s: 1.25e+9}
  - {name: slow, flops_per_s: 1.0e+13, memory_bytes: 30.0e+9, slowdown: 4}
  - {name: mid, time_per_flop_s: 2e-13, memory_bytes: 30e9}
"""


def _nebula(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([NEBULA, *args], capture_output=True, text=True, env=env, timeout=120, cwd=REPO)


def test_cli_prints_the_table_and_writes_the_job(tmp_path):
    devices = tmp_path / "devices.yaml"
    devices.write_text(DEVICES)
    job = tmp_path / "job.yaml"
    job.write_text((REPO / "recipes/toy/job.yaml").read_text())
    out = _nebula("allocate", "--model", "bert-40", "--devices", str(devices), "--write-job", str(job))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("method optimal: 43 layers on 3 devices, predicted iteration time")
    rows = {ln.split()[0]: ln.split() for ln in lines[2:5]}
    assert set(rows) == {"fast", "slow", "mid"}
    assert int(rows["slow"][2]) < int(rows["mid"][2]) < int(rows["fast"][2])  # layers follow speed
    assert "GiB / 27.9 GiB" in lines[2]
    spec = AllocationSpec(**{k: tuple(v) if isinstance(v, list) else v
                             for k, v in yaml.safe_load(job.read_text())["allocation"].items()})
    assert spec.method == "optimal" and spec.devices == ("fast", "slow", "mid") and spec.bounds[-1] == 43
    expected = allocate(bert_costs(preset("bert-40")), load_devices(devices), "optimal")
    assert spec.bounds == expected.bounds
    assert "job: toy" in job.read_text()  # the rest of the job file is kept
    again = _nebula("allocate", "--model", "bert-40", "--devices", str(devices), "--method", "even",
                    "--write-job", str(job))
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load(job.read_text())["allocation"]["method"] == "even"  # replaced, not duplicated
    assert job.read_text().count("allocation:") == 1


def test_cli_bad_input_gets_clear_errors(tmp_path):
    devices = tmp_path / "devices.yaml"
    devices.write_text(DEVICES.replace("30e9", "1e9").replace("30.0e+9", "1e9"))
    out = _nebula("allocate", "--model", "bert-40", "--devices", str(devices))
    assert out.returncode == 2 and "bytes missing" in out.stderr and "device " in out.stderr
    out = _nebula("allocate", "--model", "gpt-9", "--devices", str(devices))
    assert out.returncode == 2 and "neither a preset (bert-40" in out.stderr
    out = _nebula("allocate", "--model", "bert-40", "--devices", str(devices), "--method", "fastest")
    assert out.returncode == 2 and "invalid choice: 'fastest'" in out.stderr
    devices.write_text("devices:\n  - {name: a, flops_per_s: 0, memory_bytes: 1e9}\n")
    out = _nebula("allocate", "--model", "bert-40", "--devices", str(devices))
    assert out.returncode == 2 and "flops_per_s=0.0 must be > 0" in out.stderr
    devices.write_text("devices:\n  - {name: a, flops_per_s: 1e12, memory: 1e9}\n")
    with pytest.raises(ConfigError, match=r"unknown key devices\[0\].memory"):
        load_devices(devices)


def test_profile_of_real_paddle_layers_matches_the_analytic_costs(tmp_path):
    shape = preset("toy")
    profiles = measure_layers(bert_layers(shape), example_input(shape), warmup=1, repeat=2,
                              names=[c.name for c in bert_costs(shape)])
    analytic = bert_costs(shape)
    assert [p.kind for p in profiles] == ["Embedding"] + ["TransformerEncoderLayer"] * 6 + ["Pooler", "Linear"]
    for p, a in zip(profiles, analytic):
        assert p.flops_source == "analytic" and p.time_s > 0
        assert p.flops == pytest.approx(a.flops, rel=0.35)  # analytic model vs per-sublayer count
        assert p.output_bytes == a.activation_bytes
        assert p.grad_bytes == p.param_bytes and p.optimizer_bytes == 2 * p.param_bytes  # fp32 Adam
    enc = profiles[1]
    assert enc.param_bytes == 4 * (4 * 32 * 32 + 4 * 32 + 2 * 32 * 64 + 64 + 32 + 4 * 32)
    path = tmp_path / "profile.yaml"
    save_profile(path, profiles)
    costs = load_profile(path)
    assert [c.name for c in costs] == [p.name for p in profiles]
    assert costs[1].memory_bytes == enc.param_bytes * 4 + enc.activation_bytes
    out = _nebula("allocate", "--model", str(path), "--devices", str(_devices(tmp_path)))
    assert out.returncode == 0 and "9 layers on 3 devices" in out.stdout


def _devices(tmp_path):
    p = tmp_path / "d.yaml"
    p.write_text(DEVICES)
    return p


def test_allocation_spec_checks_and_job_file_still_loads_without_it(tmp_path):
    with pytest.raises(ValueError, match="one more entry than allocation.devices"):
        AllocationSpec(devices=("a", "b"), bounds=(0, 3))
    spec = AllocationSpec(devices=("a", "b"), bounds=(0, 3, 5))
    assert spec.layers_of("b") == range(3, 5)
    assert load_job_config(REPO / "recipes/toy/job.yaml").job == "toy"


def test_allocation_spec_loads_through_the_config_schema():
    from nebula.config import from_dict

    spec = from_dict(AllocationSpec, {"method": "sky", "devices": ["a", "b"], "bounds": [0, 2, 4]}, "allocation")
    assert spec.bounds == (0, 2, 4) and spec.devices == ("a", "b")
    with pytest.raises(ConfigError, match="unknown key allocation.cuts"):
        from_dict(AllocationSpec, {"method": "sky", "cuts": [0, 4]}, "allocation")
