"""nebula.channel.sendfuture: a send's future behaves as a standard Future whoever looks, and whenever."""
from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, InvalidStateError, as_completed, wait

import pytest

from nebula.channel.sendfuture import SendFuture


def test_a_future_completed_before_anyone_looks_reports_its_outcome():
    ok, bad = SendFuture(), SendFuture()
    assert not ok.done() and ok.running() and not ok.cancel()  # a send is running from the start
    ok.set_result(7)
    bad.set_exception(ValueError("refused"))
    assert ok.done() and ok.result(timeout=0) == 7 and ok.exception() is None
    assert bad.done() and isinstance(bad.exception(timeout=0), ValueError)
    with pytest.raises(ValueError, match="refused"):
        bad.result()
    for f in (ok, bad):
        with pytest.raises(InvalidStateError):
            f.set_result(1)
        with pytest.raises(InvalidStateError):
            f.set_exception(RuntimeError())
    assert "finished" in repr(ok)
    quiet = SendFuture()
    quiet.set_result(None)  # nobody waited or added a callback: no lock and no list was made for them
    assert quiet.done() and (quiet._cond, quiet._waiting, quiet._callbacks) == (None, None, None)
    assert quiet.result() is None


def test_waiters_and_callbacks_that_came_first_are_told():
    fs = [SendFuture() for _ in range(6)]
    seen: list[int] = []
    fs[0].add_done_callback(lambda f: seen.append(f.result()))
    results: list[int] = []
    blocked = threading.Thread(target=lambda: results.append(fs[1].result(timeout=10)))
    blocked.start()
    for i, f in enumerate(fs):
        threading.Timer(0.02 * (i + 1), f.set_result, (i,)).start()
    first = wait(fs[2:], timeout=10, return_when=FIRST_COMPLETED)
    assert first.done and all(f.done() for f in first.done)
    assert sorted(f.result() for f in as_completed(fs, timeout=10)) == list(range(6))
    blocked.join(10)
    assert seen == [0] and results == [1]
    late: list[int] = []
    fs[3].add_done_callback(lambda f: late.append(f.result()))  # a callback added after: called at once
    assert late == [3]


def test_completion_racing_the_first_look_never_loses_a_wake_up():
    for _ in range(300):
        f = SendFuture()
        t = threading.Thread(target=f.set_result, args=(1,))
        t.start()
        assert f.result(timeout=10) == 1
        t.join()
