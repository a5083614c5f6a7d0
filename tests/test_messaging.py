"""The messaging layer below the runtimes: it imports no runtime, and a model larger than one push goes in pieces
through real switches while packed arrays still come through the same receiver."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from nebula.channel import Endpoint
from nebula.federated.fedoptima.messages import TO_DEVICE, AggregatedModel
from nebula.messaging import PUSH_BYTES, Messenger, Peer, decode, pack_message
from testbed.fedjob import federation


def test_messaging_imports_no_runtime():
    out = subprocess.run([sys.executable, "-c", "import sys, nebula.messaging; print(sorted(m for m in sys.modules "
                          "if m.startswith(('nebula.federated', 'nebula.dataparallel', 'nebula.recovery'))))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_model_larger_than_push_bytes_goes_in_pieces_and_packed_arrays_still_come_through(procs, tmp_path):
    workers = federation(procs, tmp_path)
    a = Endpoint.connect(workers["A"], job="fltest", rank=0, timeout_s=30)
    b = Endpoint.connect(workers["B"], job="fltest", rank=2, timeout_s=30)
    try:
        ma, mb = Messenger(a, TO_DEVICE, channel="x"), Messenger(b, TO_DEVICE, channel="x", piece_bytes=64 * 1024)
        w = {"d.w": np.arange(PUSH_BYTES // 2, dtype=np.float32).reshape(-1, 8), "a.b": np.ones(3, np.int64)}
        mb.send_model(Peer("A", 0), AggregatedModel(version=7), w, lane="bulk", inline=True)
        mb.channel(Peer("A", 0)).send(pack_message(AggregatedModel(version=8), {"z": np.zeros(2)}), lane="bulk")
        ch = ma.channel(Peer("B", 2))
        head, arrays = ma.receive_arrays(Peer("B", 2), ch.recv_parts(timeout_s=30), 30)
        msg = decode(head, TO_DEVICE)
        assert msg.version == 7 and msg.model is not None and not msg.model.inline
        assert set(arrays) == set(w) and all(np.array_equal(arrays[k], w[k]) for k in w)
        head, arrays = ma.receive_arrays(Peer("B", 2), ch.recv_parts(timeout_s=30), 30)
        assert decode(head, TO_DEVICE).version == 8 and np.array_equal(arrays["z"], np.zeros(2))
    finally:
        a.close(flush_s=1)
        b.close(flush_s=1)
