"""Hostile config files through the real CLIs: each refused in one line naming the file and the key path, by a
process that stays small (alias bombs, deep nesting, binary bytes, huge integers, non-finite floats)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nebula.config._errors import MAX_MESSAGE

REPO = Path(__file__).resolve().parents[2]
NEBULA = str(Path(sys.executable).parent / "nebula")
ADDRESS_SPACE = 1 << 30  # the child's cap: an expanding bomb ends in MemoryError here instead of taking the machine
RSS_BOUND_KB = 100 * 1024  # what refusing any of these may cost, interpreter and imports included

JOB = """job: j
recipe: {factory: "recipes.toy:ToyRecipe"}
train: {steps: 1, global_batch: 1}
clusters: [{id: A}]
stages: [{name: s, cluster: A}]
"""
SWITCH = """cluster: A
listen: "127.0.0.1:0"
tls: {ca: ca.pem, cert: switch.pem, key: switch.key, crl: crl.pem}
local: {endpoint: "tcp://127.0.0.1:7000", curve_secret_key: switch.key_secret, workers: []}
audit: {log: audit.log, signing_key: audit.key}
peers: []
"""


def bomb(levels: int) -> str:
    """A flow list of anchors: nine strings, then per level nine aliases of the one before (9^levels strings)."""
    rows = ["&a0 [" + ", ".join(['"xxxxxxxxx"'] * 9) + "]"]
    rows += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "[" + ",\n  ".join(rows) + "]"


# Runs the CLI under the address-space cap and writes its peak RSS. The CLI is started from this small process, not
# from pytest: a child's peak RSS counts the memory of the process it was forked from.
LAUNCHER = """
import os, resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
rc = subprocess.call(sys.argv[3:])
with open(sys.argv[2], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
"""


def run_cli(args: list[str], cwd: Path) -> tuple[int, list[str], int]:
    """(exit code, output lines, peak RSS in KiB) of a CLI run under a 1 GiB address-space cap."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    rss = cwd / "rss.txt"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(ADDRESS_SPACE), str(rss), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)  # a hang fails the test; the group goes with it
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out.decode("utf-8", "replace").splitlines(), int(rss.read_text())


def assert_one_line(rc: int, lines: list[str], rss_kb: int, file: Path, key_path: str, *needles: str) -> str:
    assert rc == 2, lines[-5:]
    assert len(lines) == 1, [line[:200] for line in lines[-8:]]
    line = lines[0]
    assert len(line) < MAX_MESSAGE + 100, len(line)
    assert str(file) in line and key_path in line, line
    for needle in needles:
        assert needle in line, line
    assert "Traceback" not in line
    assert rss_kb < RSS_BOUND_KB, rss_kb
    return line


@pytest.mark.parametrize("name,text,key_path,needle", [
    # 850 bytes describing 9^8 strings: before, 23 s to MemoryError while quoting the value in the error
    ("bomb", JOB.replace("recipe: {", f"recipe: {{args: {{bomb: {bomb(8)}}}, ") + "peer_timeout_s: *a8\n",
     "recipe.args.bomb[", "aliases are not accepted here"),
    ("deep", JOB.replace("train: {", "train: {seed: " + "[" * 5000 + "]" * 5000 + ", "), "train.seed",
     "maximum nesting depth"),  # libyaml's own limit (1,000 flow levels)
    ("deep_block", JOB + "metrics:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 400)) + " " * 400 + "x\n",
     "metrics.k1.k2.k3", "nests too deeply (more than 64 levels)"),
    ("binary", JOB.encode().replace(b"job: j", b"job: j\xff\x00\x89PNG"), "job", "non-UTF-8"),
    ("bigint", JOB.replace("steps: 1,", "steps: " + "7" * 5000 + ","), "train.steps", "(5000 digits) is out of range"),
    ("inf", JOB + "peer_timeout_s: .inf\n", "peer_timeout_s", "not a finite number"),
])
def test_hostile_job_file_is_refused_in_one_line(tmp_path, name, text, key_path, needle):
    job = tmp_path / f"{name}.yaml"
    job.write_bytes(text if isinstance(text, bytes) else text.encode())
    rc, lines, rss = run_cli([NEBULA, "launch", str(job), "--cluster", "A", "--check"], tmp_path)
    line = assert_one_line(rc, lines, rss, job, key_path, needle)
    assert line.startswith("nebula launch: invalid job: ")


def test_alias_bomb_in_switch_yaml_is_one_short_line(tmp_path):
    """A switch.yaml under 1 KB whose federation name quotes 9^7 strings: before, a 44 MB error line."""
    cfg = tmp_path / "switch.yaml"
    cfg.write_text(f"federation: {bomb(7)}\n" + SWITCH)
    assert cfg.stat().st_size < 1024
    rc, lines, rss = run_cli([sys.executable, "-m", "switch_server.cli", "serve", "--config", str(cfg)], tmp_path)
    line = assert_one_line(rc, lines, rss, cfg, "federation[", "aliases are not accepted here")
    assert line.startswith("nebula-switch: ")


def test_infinite_float_in_switch_yaml_names_its_key(tmp_path):
    cfg = tmp_path / "switch.yaml"
    cfg.write_text("federation: f\n" + SWITCH + "link: {shape: {rate_mbit: .inf}}\n")
    rc, lines, rss = run_cli([sys.executable, "-m", "switch_server.cli", "serve", "--config", str(cfg)], tmp_path)
    assert_one_line(rc, lines, rss, cfg, "link.shape.rate_mbit", "'.inf' is not a finite number")


def test_federated_job_refuses_an_infinite_deadline(tmp_path):
    """Federated job files are checked by the same schema functions: `deadline_s: .inf` named, not accepted."""
    from nebula.config import ConfigError
    from nebula.federated.config import load_federated_job

    job = tmp_path / "job.yaml"
    job.write_text("job: j\nmode: federated\ncontroller: {cluster: A}\n"
                   "clusters: [{id: A, worker: w.yaml, num_clients: 2}]\ndeadline_s: .inf\n")
    with pytest.raises(ConfigError, match=r"job.yaml: deadline_s \(line 5\): '.inf' is not a finite number"):
        load_federated_job(job)
