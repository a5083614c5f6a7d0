"""The config schema: parsed YAML into frozen dataclasses, rejecting unknown keys and wrong types with their full path.

Every config file of the project (switch, worker, job, federated job) is loaded through `from_dict` / `load_yaml`;
`ConfigError` is the one error they raise (one line: the file, the key path, the value and the fix).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from nebula.config._errors import ConfigError, one_line, show
from security._yaml import read_yaml

__all__ = ["Check", "ConfigError", "check_fields", "from_dict", "load_yaml", "resolve_path", "to_dict"]

T = TypeVar("T")
_NAMED = 5  # unknown keys named in one message


@dataclass(frozen=True, slots=True)
class Check:
    """A field type's rule, as `Annotated[str, Check(fn, "codec spec")]`: `fn(value)` raises ValueError for a bad
    value. `from_dict` applies it with the field's full key path; `check_fields` on direct construction."""

    fn: Callable[[Any], object]
    what: str

    def __call__(self, value: Any, path: str) -> None:
        try:
            self.fn(value)
        except ValueError as exc:
            raise ConfigError(one_line(f"{path}={show(value)} is not a valid {self.what}: {exc}")) from None


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def check_fields(obj: Any) -> None:
    """Apply the `Check`s of a dataclass's annotated fields (a config built in code, not loaded by `from_dict`)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        tp = hints[f.name]
        if typing.get_origin(tp) is typing.Annotated:
            for check in tp.__metadata__:
                if isinstance(check, Check):
                    check(getattr(obj, f.name), f.name)


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass `cls` from `data` (a mapping), checking keys and types recursively.

    `path` is the dotted key path of `data` inside its file, used in error messages.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{path or '<top>'}: expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise ConfigError(_unknown(unknown, path, sorted(fields)))
    kwargs = {}
    for name, field in fields.items():
        key_path = _join(path, name)
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], key_path)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key {key_path}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(one_line(f"{path or '<top>'}: {exc}")) from exc


def load_yaml(cls: type[T], file: str | Path) -> T:
    """Load YAML `file` into dataclass `cls` (within `read_yaml`'s limits); errors are one line naming the file,
    the key path and the fix."""
    data = read_yaml(file)
    if data is None:
        data = {}
    try:
        return from_dict(cls, data)
    except ConfigError as exc:
        raise ConfigError(one_line(f"{file}: {exc}")) from None


def resolve_path(p: str | None, base: Path) -> str | None:
    """`p` made absolute against `base` (the directory of the config file that names it) if it is relative;
    absolute paths and None pass through. The one rule for every path in a config file."""
    return p if p is None or Path(p).is_absolute() else str((base / p).resolve())


def to_dict(obj: Any) -> Any:
    """Inverse of `from_dict`: plain dicts, lists and scalars, ready for `yaml.safe_dump`."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _unknown(unknown: list[str], path: str, allowed: list[str]) -> str:
    """The message for keys `unknown` under `path`: the first few, the closest allowed key, the allowed keys."""
    named = ", ".join(_join(path, k if len(k) <= 40 else show(k)) for k in unknown[:_NAMED])
    more = f" and {len(unknown) - _NAMED} more" if len(unknown) > _NAMED else ""
    close = difflib.get_close_matches(unknown[0], allowed, n=1) if len(unknown[0]) <= 40 else []
    hint = f" (did you mean {_join(path, close[0])}?)" if close else ""
    return f"unknown key {named}{more}{hint}; allowed keys here: {', '.join(allowed)}"


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Annotated:
        value = _convert(args[0], value, path)
        for check in tp.__metadata__:
            if isinstance(check, Check):
                check(value, path)
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {show(value)} matches none of {tp}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path}: {show(value)} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__} {show(value)}")
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items)  # tuples keep frozen configs hashable and immutable
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__} {show(value)}")
        kt, vt = (args or (Any, Any))
        return {_convert(kt, k, path): _convert(vt, v, _join(path, k)) for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {show(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{path}: {value} is not a finite number; write a finite number (or leave the key "
                              "out for its default)")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {show(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {show(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {show(value)}")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {show(value)}")
    return value
