"""A process that keeps freed memory (nebula.heap: every federated actor's, the switch's) reuses model-sized buffers
instead of faulting fresh pages in; an operator's own malloc settings stand."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nebula.heap import keep_freed_memory

# a process that frees and allocates model-sized buffers as a round does (a received piece, assembled arrays, new
# weights), and prints whether the thresholds were set and the page faults of the rounds after the first
_CHURN = """
import json, resource, sys
import numpy as np
from nebula.heap import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tune" else None
model = np.ones(1 << 20, np.float32)
def round_():
    piece = bytearray(model.nbytes + 64)
    arrays = np.frombuffer(piece, np.float32, model.size, 64).copy()
    new = arrays + np.float32(0.01)
    return float(new[0])
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(30):
    round_()
print(json.dumps({"tuned": tuned, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _churn(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, timeout=120,
                         env={**clean, **env}, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux)")
def test_a_tuned_process_faults_in_no_fresh_pages_for_each_rounds_buffers():
    plain, tuned = _churn("plain"), _churn("tune")
    assert tuned["tuned"] is True
    # 30 rounds of three 4 MiB buffers: 90,000 pages when each is fresh
    assert plain["faults"] > 30 * 1024, plain
    assert tuned["faults"] * 20 < plain["faults"], (plain, tuned)


def test_an_operators_malloc_settings_are_kept(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576")
    assert keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux)")
def test_with_the_operators_settings_the_process_behaves_as_they_chose():
    kept = _churn("tune", MALLOC_MMAP_THRESHOLD_="1048576")
    assert kept["tuned"] is False
    assert kept["faults"] > 30 * 1024, kept  # (their threshold maps every buffer afresh, as they asked)
