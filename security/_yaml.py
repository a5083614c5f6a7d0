"""YAML the security layer reads: bounded (size, no aliases, no key given twice) and checked key by key.

A file found on disk may be planted, and an admin's file may hold a typo: aliases are refused (an alias bomb would
expand without bound), so is a key given twice in one mapping (YAML would keep the last silently), and every key
is checked against the ones allowed where it stands, an unknown one named with its full path and the closest
allowed key.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Mapping

import yaml

__all__ = ["MAX_YAML_BYTES", "NoAliases", "YamlError", "check_keys", "parse_yaml", "read_yaml"]

MAX_YAML_BYTES = 1 << 20


class YamlError(ValueError):
    """A YAML file cannot be used; the message names the file, the key path and the fix."""


class NoAliases(yaml.SafeLoader):
    """A SafeLoader that refuses aliases and keys given twice."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("aliases are not accepted here")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice; keep one",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path, what: str) -> Any:
    """The document in `path` (at most MAX_YAML_BYTES, no aliases, no key twice); YamlError naming the fix."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_YAML_BYTES:
            raise YamlError(f"{what} {path} is larger than {MAX_YAML_BYTES} bytes; is it the right file?")
        data = path.read_bytes()
    except FileNotFoundError:
        raise YamlError(f"{what} {path} does not exist; check the path") from None
    except OSError as exc:
        raise YamlError(f"{what} {path} cannot be read ({exc}); check the file") from None
    return parse_yaml(data, f"{what} {path}")


def parse_yaml(data: bytes, where: str) -> Any:
    """The document in `data` (what `read_yaml` reads, e.g. a file from an archive), within the same limits;
    YamlError naming `where` and the fix otherwise."""
    if len(data) > MAX_YAML_BYTES:
        raise YamlError(f"{where} is larger than {MAX_YAML_BYTES} bytes; is it the right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(f"{where} cannot be read ({exc}); check the file") from None
    try:
        return yaml.load(text, Loader=NoAliases)  # noqa: S506 - a SafeLoader without aliases
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlError(f"{where}{at}: {' '.join(str(problem).split())}") from None
    except RecursionError:
        raise YamlError(f"{where} nests too deeply; flatten it") from None


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
