"""Text others chose (names, reasons) is copied into records, messages and terminals only as one bounded,
printable line; names with a trailing newline are no valid names."""
from __future__ import annotations

import pytest

from security.audit import safe_text
from security.errors import IdentityError
from security.identity import check_name


@pytest.mark.parametrize("raw, shown", [
    ("switch-B", "switch-B"),  # printable text comes back unchanged
    ("a\nb\r\tc", r"a\nb\r\tc"),
    ("\x1b[31mred\x1b[0m", r"\x1b[31mred\x1b[0m"),  # ANSI colour: the ESC is shown, not sent
    ("\u202egnp.exe", r"\u202egnp.exe"),  # a bidi override would reorder what follows on screen
    ("zero\u200bwidth\x00\x7f", r"zero\u200bwidth\x00\x7f"),
    ("\U000e0041tag", r"\U000e0041tag"),
    ("ünïcödé 名前", "ünïcödé 名前"),  # printable non-ASCII stays readable
])
def test_safe_text_escapes_what_a_terminal_or_log_reader_would_act_on(raw, shown):
    assert safe_text(raw) == shown and safe_text(raw).isprintable()


def test_safe_text_bounds_the_length_and_counts_what_it_left_out():
    assert safe_text("x" * 10_000, 40) == "x" * 24 + "...(+9976 chars)"
    cut = safe_text("\x00" * 100, 40)  # escapes count towards the limit and are never split
    assert len(cut) <= 40 and cut == "\\x00" * 6 + "...(+94 chars)"
    assert safe_text("y" * 40, 40) == "y" * 40
    assert safe_text(12345) == "12345"
    with pytest.raises(ValueError, match="limit"):
        safe_text("x", 3)


def test_a_name_with_a_trailing_newline_is_not_a_valid_name():
    assert check_name("A", "cluster") == "A"
    for bad in ("A\n", "A\r\n", "\nA", "A" * 64):
        with pytest.raises(IdentityError, match="is not a valid name") as info:
            check_name(bad, "cluster")
        assert str(info.value).isprintable()
    with pytest.raises(IdentityError) as info:
        check_name("x" * 100_000 + "\n", "cluster")
    assert len(str(info.value)) < 300
