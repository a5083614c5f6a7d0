"""The switch's memory budget: the total cap holds back the whole local side, a party's share holds back only it."""
from __future__ import annotations

import pytest

from switch_server.budget import ALL, MemoryBudget


def test_total_cap_holds_back_until_well_below_it():
    events = []
    b = MemoryBudget(1000, lambda party, held: events.append((party, held)))
    b.charge(600)
    b.charge(300, hold=False)
    assert events == [] and b.used == 900
    b.charge(200)
    assert events == [(ALL, True)] and b.over()
    b.release(250)  # 850: under the cap but not under 80 % of it
    assert events == [(ALL, True)]
    b.release(100)
    assert events == [(ALL, True), (ALL, False)] and b.used == 750


def test_a_party_over_its_share_is_held_alone():
    events = []
    b = MemoryBudget(10_000, lambda party, held: events.append((party, held)))
    a, other = ("account", "a"), ("account", "b")
    b.set_share(a, 100)
    b.set_share(other, 100)
    b.charge(150, a)
    b.charge(50, other)
    assert events == [(a, True)] and b.over(a) and not b.over(other) and not b.over()
    b.release(100, a)
    assert events == [(a, True), (a, False)] and b.share(a).used == 50


def test_a_cap_that_is_not_positive_is_refused_with_the_setting_to_fix():
    with pytest.raises(ValueError, match="memory_cap_bytes"):
        MemoryBudget(0, lambda *_: None)
