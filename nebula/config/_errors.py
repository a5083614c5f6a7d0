"""The configuration error and the rules that keep its message one short line whatever a file holds."""
from __future__ import annotations

import reprlib
from typing import Any

MAX_MESSAGE = 600  # characters of one error line; longer ones keep their start and their end (the fix)
_SHOWN = 80  # characters of a quoted value

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxtuple, _repr.maxdict, _repr.maxset = 2, 4, 4, 4, 4
_repr.maxstring, _repr.maxlong, _repr.maxother = 40, 40, 40


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the key path and the fix."""


def show(value: Any) -> str:
    """`value` quoted for an error message: its repr, cut short (a value expanded from YAML aliases can be huge)."""
    text = _repr.repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def one_line(message: str) -> str:
    """`message` as one line of at most MAX_MESSAGE characters (line breaks escaped, the middle cut if long)."""
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    if len(message) <= MAX_MESSAGE:
        return message
    tail = MAX_MESSAGE // 3
    return f"{message[: MAX_MESSAGE - tail - 5]} ... {message[-tail:]}"


__all__ = ["ConfigError", "show", "one_line", "MAX_MESSAGE"]
