"""The combiner's checks on an update's header: every refusal reason, and late updates in synchronous rounds."""
from __future__ import annotations

import pytest

from nebula.federated._actor import check_update_header

TENSORS = [["w", "float32", [4, 3]], ["b", "float32", [3]]]


def _check(**over):
    head = {"type": "update", "job": "j", "round": 5, "version": 7, "num_examples": 10, "tensors": TENSORS}
    head.update(over)
    why = check_update_header(head, job="j", round=5, version=7, known_version=7, expected={"A/2", "B/2"},
                              seen={"B/2"}, who="A/2", tensors=TENSORS, max_examples=1000)
    return None if why is None else str(why)


def test_a_good_update_passes():
    assert _check() is None


@pytest.mark.parametrize("over,needle", [
    ({"job": "other"}, "belongs to job 'other'"),
    ({"version": 9}, "future model version 9"),
    ({"version": 0}, "unknown model version 0"),
    ({"version": "x"}, "unknown model version 'x'"),
    ({"round": 4, "version": 6}, "late: trained for round 4 from version 6"),
    ({"num_examples": 0}, "num_examples=0"),
    ({"num_examples": 10**15}, "num_examples=1000000000000000 exceeds the job's max_examples_per_client=1000"),
    ({"num_examples": True}, "num_examples=True"),
    ({"tensors": [["w", "float32", 4], TENSORS[1]]}, "malformed tensors list"),
    ({"tensors": [[f"x{i}", "float32", [1]] for i in range(1000)]}, "and 995 more"),
    ({"tensors": TENSORS[:1]}, "missing ['b']"),
    ({"tensors": [["w", "float64", [4, 3]], TENSORS[1]]}, "'w' has dtype float64, expected float32"),
    ({"tensors": [["w", "float32", [5, 3]], TENSORS[1]]}, "'w' has shape (5, 3), expected (4, 3)"),
])
def test_bad_headers_are_refused_with_their_reason(over, needle):
    assert needle in _check(**over)


def test_duplicates_and_uninvited_clients_are_refused():
    ok = {"type": "update", "job": "j", "round": 5, "version": 7, "num_examples": 10, "tensors": TENSORS}
    kw = dict(job="j", round=5, version=7, known_version=7, expected={"A/2", "B/2"}, tensors=TENSORS,
              max_examples=1000)
    dup = check_update_header(ok, seen={"B/2"}, who="B/2", **kw)
    assert dup.kind == "duplicate" and "duplicate update in round 5" in str(dup)
    assert "not asked to take part" in str(check_update_header(ok, seen=set(), who="C/9", **kw))
