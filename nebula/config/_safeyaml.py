"""Reading a YAML config file within fixed limits, every refusal one line naming the file and the key path.

PyYAML's safe loader builds what a file describes, however large: nine nested levels of nine aliases (850 bytes)
describe 9^9 values, a few hundred nested brackets exhaust the recursion limit, a 5,000-digit integer trips Python's
int-string limit. The loader here composes the document itself (libyaml parses when present) and refuses, before
anything is built:
- files over MAX_FILE_BYTES, bytes that are not UTF-8, and characters YAML does not allow (NUL, other controls);
- nesting deeper than MAX_DEPTH;
- documents of more than MAX_NODES values or MAX_CHARS characters counted with every alias expanded (aliases
  stay usable for small repeats; an alias to the collection that contains it is refused);
- integers beyond the signed 64-bit range, and floats that are not finite (`.inf`, `.nan`, `1.0e+999`);
- a key given twice in one mapping (YAML keeps the last silently).
A refusal is a ConfigError of one line, with the key path (as `from_dict` writes it), the line, and the fix.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingEndEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.reader import Reader
from yaml.resolver import Resolver

from nebula.config._errors import ConfigError, one_line, show

MAX_FILE_BYTES = 1 << 20  # 1 MiB: config files are a few KiB; a 5,000-layer profile is 0.44 MiB
MAX_DEPTH = 64  # nested collections; the config schemas nest a handful of levels
MAX_NODES = 50_000  # values (keys included) with every alias expanded: a 3,000-layer profile holds 45,000
MAX_CHARS = 4 * MAX_FILE_BYTES  # characters of its scalars, every alias expanded
MAX_INT = 2**63 - 1
_INT_CHARS = 80  # longer integer literals are refused unread (int() of 5,000 digits raises deep inside)
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"

if yaml.__with_libyaml__:
    from yaml._yaml import CParser as _Parser

    def _parser_init(self: Any, text: str) -> None:
        _Parser.__init__(self, text)
else:  # pure-Python fallback: same rules, slower parse
    from yaml.parser import Parser as _PyParser
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, _PyParser):  # type: ignore[no-redef]
        """Reader, scanner and parser of PyYAML in one class (what libyaml's CParser is)."""

    def _parser_init(self: Any, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        _PyParser.__init__(self)


class _Refused(Exception):
    """A limit was hit at `mark` while composing key path `where`."""

    def __init__(self, where: str, mark: Any, problem: str) -> None:
        super().__init__(problem)
        self.where, self.line, self.problem = where, (mark.line + 1 if mark is not None else None), problem

    def __str__(self) -> str:
        at = f" (line {self.line})" if self.line else ""
        return f"{self.where or '<top>'}{at}: {self.problem}"


class _BoundedComposer(Composer):
    """PyYAML's composer with a key path, a depth, an expanded-node budget and checked scalars."""

    def __init__(self, bad_at: int | None) -> None:
        super().__init__()
        self._path: list[str] = []
        self._depth = 0
        self._nodes = self._chars = 0
        self._weight: dict[str, tuple[int, int]] = {}  # anchor -> (values, characters), once its node is complete
        self._bad_at = bad_at  # character index of the first byte refused by _decode, if any
        self.error_where: str | None = None  # key path where PyYAML's parser gave up

    def where(self, key: str | None = None) -> str:
        """The key path being composed, then mapping key `key` if given (a key's own path is its mapping's)."""
        out = ""
        for seg in [s for s in self._path if s != _KEY] + ([] if key is None else [_key_text(key)]):
            out += seg if seg.startswith("[") or not out else "." + seg
        return out

    def _count(self, nodes: int, chars: int, mark: Any) -> None:
        self._nodes += nodes
        self._chars += chars
        if self._nodes > MAX_NODES or self._chars > MAX_CHARS:
            raise _Refused(self.where(), mark, f"the document expands to over {MAX_NODES:,} values or {MAX_CHARS:,} "
                           "characters (a YAML alias counts each time it is used); write the values out or use "
                           "fewer aliases")

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._path.append(_segment(parent, index))
        try:
            if self.check_event(AliasEvent):
                event = self.peek_event()
                if event.anchor in self.anchors and event.anchor not in self._weight:
                    raise _Refused(self.where(), event.start_mark, f"alias *{show(event.anchor)[1:-1]} refers to a "
                                   "collection that contains it; YAML config files cannot be recursive")
                node = super().compose_node(parent, index)  # undefined aliases: PyYAML's error
                self._count(*self._weight.get(event.anchor, (1, 0)), event.start_mark)
                return node
            event = self.peek_event()
            if self._depth >= MAX_DEPTH and isinstance(event, (SequenceStartEvent, MappingStartEvent)):
                raise _Refused(self.where(), event.start_mark, f"nested more than {MAX_DEPTH} levels deep; config "
                               "files are shallow: check the brackets and the indentation")
            start = (self._nodes, self._chars)
            self._count(1, len(getattr(event, "value", "")), event.start_mark)
            self._depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            if event.anchor is not None:
                self._weight[event.anchor] = (self._nodes - start[0], self._chars - start[1])
            return node
        except yaml.YAMLError:
            if self.error_where is None:
                self.error_where = self.where()
            raise
        finally:
            self._path.pop()

    def compose_scalar_node(self, anchor: str | None) -> Node:
        node = super().compose_scalar_node(anchor)
        key = node.value if self._path and self._path[-1] == _KEY else None
        if self._bad_at is not None and node.start_mark.index <= self._bad_at < node.end_mark.index:
            raise _Refused(self.where(key), node.start_mark, _BINARY)
        if node.tag == _INT_TAG:
            self._check_int(node, key)
        elif node.tag == _FLOAT_TAG:
            value = self.construct_yaml_float(node)
            if not math.isfinite(value):
                raise _Refused(self.where(key), node.start_mark, f"{show(node.value)} is not a finite number; write "
                               "a finite number (or leave the key out for its default)")
        return node

    def _check_int(self, node: ScalarNode, key: str | None) -> None:
        digits = len(node.value.lstrip("+-"))
        if digits > _INT_CHARS or abs(self.construct_yaml_int(node)) > MAX_INT:
            raise _Refused(self.where(key), node.start_mark, f"integer {show(node.value)} ({digits} digits) is out "
                           f"of range; write a number between -{MAX_INT} and {MAX_INT}")

    def compose_mapping_node(self, anchor: str | None) -> Node:
        """PyYAML's, refusing a key given twice."""
        start = self.get_event()
        tag = start.tag if start.tag not in (None, "!") else self.resolve(MappingNode, None, start.implicit)
        node = MappingNode(tag, [], start.start_mark, None, flow_style=start.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        seen: set[str] = set()
        while not self.check_event(MappingEndEvent):
            key = self.compose_node(node, None)
            if isinstance(key, ScalarNode) and key.value != "<<":
                if key.value in seen:
                    raise _Refused(self.where(key.value), key.start_mark, "this key is given twice in one mapping; "
                                   "keep one (YAML would silently use the last)")
                seen.add(key.value)
            node.value.append((key, self.compose_node(node, key)))
        node.end_mark = self.get_event().end_mark
        return node


_KEY = "\0key"  # path segment of a mapping key being composed (dropped from paths: a key's path is its own text)
_BINARY = ("binary or non-UTF-8 bytes (or control characters); a config file is UTF-8 text: rewrite this value "
           "(is this the right file?)")


def _segment(parent: Node | None, index: Any) -> str:
    if parent is None:
        return ""
    if isinstance(index, int):
        return f"[{index}]"
    if index is None:
        return _KEY
    return _key_text(index.value) if isinstance(index, ScalarNode) else "?"


def _key_text(key: str) -> str:
    return key if key and len(key) <= 40 and key.isprintable() and " " not in key else show(key)


class _Loader(_BoundedComposer, _Parser, SafeConstructor, Resolver):
    """libyaml's (or PyYAML's) parser, the bounded composer, PyYAML's safe constructor."""

    def __init__(self, text: str, bad_at: int | None) -> None:
        _parser_init(self, text)
        _BoundedComposer.__init__(self, bad_at)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


def _read(file: Path) -> bytes:
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config ({exc.strerror or exc}); check the path") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{file}: over {MAX_FILE_BYTES:,} bytes, the limit for a config file; is this the right "
                          "file? (config files are a few KiB)")
    return data


def _decode(data: bytes) -> tuple[str, int | None]:
    """(the text, the character index of its first refused byte or None); refused bytes become U+FFFD."""
    bad: int | None = None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = len(data[: exc.start].decode("utf-8"))
        text = data.decode("utf-8", errors="replace")
    m = Reader.NON_PRINTABLE.search(text, 0, bad if bad is not None else len(text))
    if m is not None:
        bad = m.start()
    if bad is not None:
        text = Reader.NON_PRINTABLE.sub("\ufffd", text)
    return text, bad


def read_yaml(file: str | Path) -> Any:
    """The data in YAML file `file` (None when empty), read within this module's limits; ConfigError otherwise."""
    file = Path(file)
    text, bad = _decode(_read(file))
    loader = _Loader(text, bad)
    try:
        data = loader.get_single_data()
        if bad is None:
            return data
        refusal = _Refused("", None, _BINARY)  # refused bytes outside any value (a comment)
    except _Refused as exc:
        refusal = exc
    except yaml.MarkedYAMLError as exc:
        if bad is None:
            raise ConfigError(one_line(f"{file}: {_describe(exc, loader.error_where)}")) from None
        refusal = _Refused(loader.error_where or "", None, _BINARY)  # the refused bytes come first
    finally:
        loader.dispose()
    if refusal.line is None and bad is not None:
        refusal.line = text.count("\n", 0, bad) + 1
    raise ConfigError(one_line(f"{file}: {refusal}"))


def _describe(exc: yaml.MarkedYAMLError, where: str | None) -> str:
    """PyYAML's several-line syntax error as one line: where, in which key, what."""
    mark = exc.problem_mark or exc.context_mark
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    inside = f" (in {where})" if where else ""
    what = "; ".join(x for x in (exc.context, exc.problem) if x)
    return f"not valid YAML{at}{inside}: {what}; fix the syntax there"


__all__ = ["read_yaml", "MAX_FILE_BYTES", "MAX_DEPTH", "MAX_NODES", "MAX_CHARS", "MAX_INT"]
