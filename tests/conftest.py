"""Shared fixtures: a reaper for every child process a test starts, and small helpers."""
from __future__ import annotations

import pytest

from testbed.procs import REPO, Procs

__all__ = ["REPO", "Procs", "procs"]


@pytest.fixture
def procs():
    """Start real subprocesses; all of them (and their process groups) are killed after the test."""
    p = Procs()
    try:
        yield p
    finally:
        p.reap()
