"""Memory goes back to the operating system after a peak of queued bytes or of unidentified connections."""
from __future__ import annotations

from switch_server.memtrim import TRIM_AFTER_BYTES, TRIM_AFTER_CONNECTIONS, MemoryTrim, malloc_trim


def test_trims_only_once_a_peak_has_gone():
    t = MemoryTrim()
    assert not t.maybe(0, 0)
    assert not t.maybe(TRIM_AFTER_BYTES * 2, 0)  # at the peak: nothing to give back yet
    assert not t.maybe(TRIM_AFTER_BYTES * 2 - 1024, 0)
    assert not t.maybe(TRIM_AFTER_BYTES // 2, 0)  # most of it has gone, but it is still going
    assert t.maybe(TRIM_AFTER_BYTES // 2, 0)  # and now it has stopped
    assert not t.maybe(TRIM_AFTER_BYTES // 2, 0)  # (the new peak is where it stands now)
    assert not t.maybe(0, TRIM_AFTER_CONNECTIONS)
    assert t.maybe(0, 0)


def test_malloc_trim_runs_on_glibc():
    assert malloc_trim() is True
