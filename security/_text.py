"""Text from others made safe to print or record: one line, printable, bounded; and durations said briefly."""
from __future__ import annotations

__all__ = ["duration", "safe_text"]


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_text(value: object, limit: int = 200) -> str:
    """`value` as one line of at most `limit` printable characters, safe to copy into an audit record, a log line or
    a terminal: line breaks, control characters (ANSI escapes start with one), and invisible format characters
    (bidi overrides, zero-width) are written as `\\n`, `\\x1b`, `\\u202e`; longer text is cut and ends with
    `...(+N chars)`, N counting the characters left out. Printable text within the limit comes back unchanged.
    """
    if limit < 16:
        raise ValueError(f"limit={limit} must be >= 16 (room for the cut marker)")
    text = value if isinstance(value, str) else str(value)
    pieces: list[str] = []
    size = 0
    for ch in text[:limit + 1]:  # every character gives at least one: no more can fit
        piece = ch if ch.isprintable() else _escape(ch)
        if size + len(piece) > limit:
            break
        pieces.append(piece)
        size += len(piece)
    else:
        return "".join(pieces)
    while True:  # make room for the marker, counting what is left out
        marker = f"...(+{len(text) - len(pieces)} chars)"
        if size + len(marker) <= limit:
            return "".join(pieces) + marker
        size -= len(pieces.pop())


def duration(seconds: float, minutes_only: bool = False) -> str:
    """`seconds` as 45s, 7m12s (7m with `minutes_only`: a table's column), 3h04m or 2d05h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" if minutes_only else f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
