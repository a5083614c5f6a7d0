"""Paddle first imported in a thread that then ends leaves the main thread in static mode; importing it first in the
thread that starts the others (`nebula.paddle_threads`, as `run_actors` does) keeps every thread in dygraph mode.
Each case in a fresh interpreter: this one has Paddle imported already."""
from __future__ import annotations

import subprocess
import sys

import pytest

_SCRIPT = """
import threading
{before}
def train():
    import paddle
    paddle.nn.Linear(4, 2)(paddle.randn([3, 4]))
t = threading.Thread(target=train)
t.start()
t.join()
import paddle
seen = []
later = threading.Thread(target=lambda: seen.append(paddle.in_dynamic_mode()))
later.start()
later.join()
print(paddle.in_dynamic_mode(), type(paddle.randn([2])).__name__, seen[0])
"""


@pytest.mark.parametrize("before, want", [
    ("", "False Value False"),  # Paddle's own behaviour: the case the helper exists for
    ("from nebula.paddle_threads import dygraph_before_threads\ndygraph_before_threads()", "True Tensor True")])
def test_paddle_imported_before_the_threads_keeps_the_main_thread_and_later_threads_in_dygraph_mode(before, want):
    out = subprocess.run([sys.executable, "-c", _SCRIPT.format(before=before)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == want, out.stdout
