"""The one hardened YAML reader: every YAML file Nebula reads (config files, federation files, kits, signed
updates) is read here, within fixed limits, every refusal one line naming the file, the key path, the line and the fix.

PyYAML's safe loader builds what a file describes, however large: nine nested levels of nine aliases (850 bytes)
describe 9^9 values, a few hundred nested brackets exhaust the recursion limit, a 5,000-digit integer trips Python's
int-string limit. The loader here composes the document itself (libyaml parses when present) and refuses, before
anything is built:
- files over MAX_YAML_BYTES, bytes that are not UTF-8, and characters YAML does not allow (NUL, other controls);
- aliases (an alias bomb would expand without bound; no file Nebula writes or documents uses one);
- nesting deeper than MAX_DEPTH;
- integers beyond the signed 64-bit range, and floats that are not finite (`.inf`, `.nan`, `1.0e+999`);
- a key given twice in one mapping (YAML keeps the last silently), and a key that is a list or a mapping.
`check_keys` then checks a mapping key by key, an unknown one named with its full path and the closest allowed key.
"""
from __future__ import annotations

import difflib
import math
import reprlib
from pathlib import Path
from typing import Any, Mapping

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingEndEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.reader import Reader
from yaml.resolver import Resolver

__all__ = ["MAX_DEPTH", "MAX_INT", "MAX_MESSAGE", "MAX_YAML_BYTES", "NoAliases", "YamlError", "check_keys",
           "one_line", "parse_yaml", "read_yaml", "show"]

MAX_YAML_BYTES = 1 << 20  # 1 MiB: config files are a few KiB; a 5,000-layer profile is 0.44 MiB
MAX_DEPTH = 64  # nested collections; every schema read here nests a handful of levels
MAX_INT = 2**63 - 1
MAX_MESSAGE = 600  # characters of one error line; longer ones keep their start and their end (the fix)
_INT_CHARS = 80  # longer integer literals are refused unread (int() of 5,000 digits raises deep inside)
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_SHOWN = 80  # characters of a quoted value

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxtuple, _repr.maxdict, _repr.maxset = 2, 4, 4, 4, 4
_repr.maxstring, _repr.maxlong, _repr.maxother = 40, 40, 40


class YamlError(ValueError):
    """A file or value a person wrote cannot be used; the message names the file, the key path and the fix.
    (nebula.config.ConfigError is this class: one refusal for every file, whichever layer reads it.)"""


def show(value: Any) -> str:
    """`value` quoted for an error message: its repr, cut short (a value built in memory can be huge)."""
    text = _repr.repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def one_line(message: str) -> str:
    """`message` as one line of at most MAX_MESSAGE characters (line breaks escaped, the middle cut if long)."""
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    if len(message) <= MAX_MESSAGE:
        return message
    tail = MAX_MESSAGE // 3
    return f"{message[: MAX_MESSAGE - tail - 5]} ... {message[-tail:]}"


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


class _Refused(yaml.YAMLError):
    """A limit was hit at `mark` while composing key path `where` (a YAMLError: `yaml.load` callers catch it)."""

    def __init__(self, where: str, mark: Any, problem: str) -> None:
        super().__init__(problem)
        self.where, self.line, self.problem = where, (mark.line + 1 if mark is not None else None), problem

    def __str__(self) -> str:
        at = f" (line {self.line})" if self.line else ""
        return f"{self.where or '<top>'}{at}: {self.problem}"


_KEY = "\0key"  # path segment of a mapping key being composed (dropped from paths: a key's path is its own text)
_BINARY = ("cannot be read: binary or non-UTF-8 bytes (or control characters); a YAML file is UTF-8 text: rewrite "
           "this value (is this the right file?)")


class _BoundedComposer(Composer):
    """PyYAML's composer with a key path, a depth limit, no aliases and checked scalars and keys."""

    def __init__(self, bad_at: int | None) -> None:
        super().__init__()
        self._path: list[str] = []
        self._depth = 0
        self._bad_at = bad_at  # character index of the first byte refused by _decode, if any
        self.error_where: str | None = None  # key path where PyYAML's parser gave up
        self.finite_only = True  # refuse .inf and .nan (a measurements file may mean "unbounded" by .inf)

    def where(self, key: str | None = None) -> str:
        """The key path being composed, then mapping key `key` if given (a key's own path is its mapping's)."""
        out = ""
        for seg in [s for s in self._path if s != _KEY] + ([] if key is None else [_key_text(key)]):
            out += seg if seg.startswith("[") or not out else "." + seg
        return out

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._path.append(_segment(parent, index))
        try:
            event = self.peek_event()
            if isinstance(event, AliasEvent):
                raise _Refused(self.where(), event.start_mark, f"alias *{show(event.anchor)[1:-1]}: aliases are not "
                               "accepted here (an alias bomb expands without bound); write the values out")
            if self._depth >= MAX_DEPTH and isinstance(event, (SequenceStartEvent, MappingStartEvent)):
                raise _Refused(self.where(), event.start_mark, f"nests too deeply (more than {MAX_DEPTH} levels); "
                               "these files are shallow: check the brackets and the indentation")
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
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
            digits = len(node.value.lstrip("+-"))
            if digits > _INT_CHARS or abs(self.construct_yaml_int(node)) > MAX_INT:
                raise _Refused(self.where(key), node.start_mark, f"integer {show(node.value)} ({digits} digits) is "
                               f"out of range; write a number between -{MAX_INT} and {MAX_INT}")
        elif node.tag == _FLOAT_TAG and self.finite_only and not math.isfinite(self.construct_yaml_float(node)):
            raise _Refused(self.where(key), node.start_mark, f"{show(node.value)} is not a finite number; write a "
                           "finite number (or leave the key out for its default)")
        return node

    def compose_mapping_node(self, anchor: str | None) -> Node:
        """PyYAML's, refusing a key given twice and a key that is not a scalar."""
        start = self.get_event()
        tag = start.tag if start.tag not in (None, "!") else self.resolve(MappingNode, None, start.implicit)
        node = MappingNode(tag, [], start.start_mark, None, flow_style=start.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        seen: set[str] = set()
        while not self.check_event(MappingEndEvent):
            key = self.compose_node(node, None)
            if not isinstance(key, ScalarNode):
                raise _Refused(self.where(), key.start_mark, "a key is a list or a mapping; keys are plain names")
            if key.value in seen:
                raise _Refused(self.where(key.value), key.start_mark, f"key {show(key.value)} is given twice in one "
                               "mapping; keep one (YAML would silently use the last)")
            seen.add(key.value)
            node.value.append((key, self.compose_node(node, key)))
        node.end_mark = self.get_event().end_mark
        return node


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


class NoAliases(_BoundedComposer, _Parser, SafeConstructor, Resolver):
    """libyaml's (or PyYAML's) parser, the bounded composer, PyYAML's safe constructor: usable as
    `yaml.load(text, Loader=NoAliases)`, whose refusals are YAMLErrors (prefer `read_yaml`: it also bounds the size
    and writes the refusal as one line)."""

    def __init__(self, text: str, bad_at: int | None = None) -> None:
        _parser_init(self, text)
        _BoundedComposer.__init__(self, bad_at)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


def read_yaml(path: str | Path, what: str = "", *, finite: bool = True) -> Any:
    """The document in YAML file `path` (None when empty), read within this module's limits; YamlError naming
    `what` (e.g. "federation file", or nothing), the path, the key path and the fix otherwise. `finite=False` lets
    `.inf` and `.nan` through (files a program writes with measurements, e.g. an unbounded bandwidth)."""
    path = Path(path)
    where = f"{what} {path}" if what else str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)  # (a bounded read: a file growing after a stat is no way around it)
    except FileNotFoundError:
        raise YamlError(one_line(f"{where} does not exist; check the path")) from None
    except OSError as exc:
        raise YamlError(one_line(f"{where} cannot be read ({exc.strerror or exc}); check the file")) from None
    return parse_yaml(data, where, finite=finite)


def parse_yaml(data: bytes, where: str, *, finite: bool = True) -> Any:
    """The document in `data` (what `read_yaml` reads, e.g. a file from an archive), within the same limits;
    YamlError naming `where` and the fix otherwise."""
    if len(data) > MAX_YAML_BYTES:
        raise YamlError(one_line(f"{where} is larger than {MAX_YAML_BYTES} bytes, the limit for a YAML file; is it "
                                 "the right file? (these files are a few KiB)"))
    text, bad = _decode(data)
    loader = NoAliases(text, bad)
    loader.finite_only = finite
    try:
        doc = loader.get_single_data()
        if bad is None:
            return doc
        refusal = _Refused("", None, _BINARY)  # refused bytes outside any value (a comment)
    except _Refused as exc:
        refusal = exc
    except yaml.MarkedYAMLError as exc:
        if bad is None:
            raise YamlError(one_line(f"{where}: {_describe(exc, loader.error_where)}")) from None
        refusal = _Refused(loader.error_where or "", None, _BINARY)  # the refused bytes come first
    except RecursionError:  # (MAX_DEPTH keeps the composer shallow; this is a last guard)
        refusal = _Refused(loader.error_where or "", None, "nests too deeply; flatten it")
    finally:
        loader.dispose()
    if refusal.line is None and bad is not None:
        refusal.line = text.count("\n", 0, bad) + 1
    raise YamlError(one_line(f"{where}: {refusal}"))


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


def _describe(exc: yaml.MarkedYAMLError, where: str | None) -> str:
    """PyYAML's several-line syntax error as one line: where, in which key, what."""
    mark = exc.problem_mark or exc.context_mark
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    inside = f" (in {where})" if where else ""
    what = "; ".join(x for x in (exc.context, exc.problem) if x)
    if "nesting depth" in what:  # libyaml's own limit on flow levels, hit while scanning ahead
        return f"nests too deeply{at}{inside}: {what}; these files are shallow: check the brackets"
    return f"not valid YAML{at}{inside}: {what}; fix the syntax there"


def check_keys(data: Any, path: str, allowed: Mapping[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """`data` if it is a mapping whose keys are all in `allowed` (key -> type or tuple of types, None = any) and
    hold values of those types, with every `required` key; YamlError naming the key path otherwise."""
    where = path or "<top>"
    if not isinstance(data, dict):
        raise YamlError(f"{where}: expected a mapping, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise YamlError(f"unknown key {_join(path, key)}; {hint}allowed here: {', '.join(allowed)}")
    for key in required:
        if key not in data:
            raise YamlError(f"missing required key {_join(path, key)}")
    for key, kind in allowed.items():
        if kind is None or key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            ok = False  # (a bool is an int to Python, never to a config file)
        else:
            ok = isinstance(value, kind)
        if not ok:
            names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise YamlError(f"{_join(path, key)}: expected {names}, got {type(value).__name__} {value!r:.60}")
    return data


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)
