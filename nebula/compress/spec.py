"""Parser for codec spec strings: ``name`` or ``name(arg, key=value, ...)``, nestable (``fp16(svd(0.6))``)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Union

__all__ = ["SpecNode", "SpecError", "parse_spec", "format_spec"]


class SpecError(ValueError):
    """A codec spec string is malformed, names an unknown codec or carries invalid arguments."""


Arg = Union[int, float, "SpecNode"]


@dataclass(frozen=True)
class SpecNode:
    """One parsed ``name(args, kwargs)`` call; args are numbers or nested SpecNodes."""

    name: str
    args: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = field(default=())

    def __str__(self) -> str:
        return format_spec(self)


_TOKEN = re.compile(
    r"\s*(?:(?P<num>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[(),=]))"
)


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise SpecError(f"codec spec {text!r}: unexpected character {text[pos:].lstrip()[:1]!r} at position "
                            f"{pos}; write specs as name or name(arg, key=value), e.g. 'fp16(svd(0.6))'")
        kind = m.lastgroup
        tokens.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    return tokens


def parse_spec(text: str) -> SpecNode:
    """Parse a codec spec string into a SpecNode tree (syntax only; codec names are checked by get_codec)."""
    if not isinstance(text, str):
        raise SpecError(f"codec spec must be a string such as 'fp16' or 'fp16(svd(0.6))', got {type(text).__name__}")
    tokens = _tokenize(text)
    if not tokens:
        raise SpecError("codec spec is empty; use 'none' for no compression")
    node, i = _parse_call(text, tokens, 0)
    if i != len(tokens):
        raise SpecError(f"codec spec {text!r}: unexpected {tokens[i][1]!r} at position {tokens[i][2]}")
    return node


def _expect(text: str, tokens: list, i: int, what: str) -> tuple[str, str, int]:
    if i >= len(tokens):
        raise SpecError(f"codec spec {text!r}: ended early, expected {what}")
    return tokens[i]


def _number(s: str) -> int | float:
    return int(s) if re.fullmatch(r"[-+]?\d+", s) else float(s)


def _parse_value(text: str, tokens: list, i: int) -> tuple[Arg, int]:
    kind, value, pos = _expect(text, tokens, i, "a number or a codec")
    if kind == "num":
        return _number(value), i + 1
    if kind == "name":
        return _parse_call(text, tokens, i)
    raise SpecError(f"codec spec {text!r}: expected a number or a codec at position {pos}, got {value!r}")


def _parse_call(text: str, tokens: list, i: int) -> tuple[SpecNode, int]:
    kind, name, pos = _expect(text, tokens, i, "a codec name")
    if kind != "name":
        raise SpecError(f"codec spec {text!r}: expected a codec name at position {pos}, got {name!r}")
    i += 1
    if i >= len(tokens) or tokens[i][1] != "(":
        return SpecNode(name.lower()), i
    i += 1
    args: list[Arg] = []
    kwargs: dict[str, Arg] = {}
    if i < len(tokens) and tokens[i][1] == ")":
        return SpecNode(name.lower()), i + 1
    while True:
        kind, value, pos = _expect(text, tokens, i, "an argument")
        if kind == "name" and i + 1 < len(tokens) and tokens[i + 1][1] == "=":
            if value in kwargs:
                raise SpecError(f"codec spec {text!r}: argument {value!r} given twice")
            kwargs[value], i = _parse_value(text, tokens, i + 2)
        else:
            if kwargs:
                raise SpecError(f"codec spec {text!r}: positional argument after keyword arguments at position {pos}")
            arg, i = _parse_value(text, tokens, i)
            args.append(arg)
        kind, value, pos = _expect(text, tokens, i, "',' or ')'")
        if value == ")":
            return SpecNode(name.lower(), tuple(args), tuple(kwargs.items())), i + 1
        if value != ",":
            raise SpecError(f"codec spec {text!r}: expected ',' or ')' at position {pos}, got {value!r}")
        i += 1


def _format_value(v: Arg) -> str:
    if isinstance(v, SpecNode):
        return format_spec(v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def format_spec(node: SpecNode) -> str:
    """Canonical text of a SpecNode (inverse of parse_spec)."""
    items = [_format_value(a) for a in node.args] + [f"{k}={_format_value(v)}" for k, v in node.kwargs]
    return f"{node.name}({', '.join(items)})" if items else node.name
