"""Implementations registered by name: the one mechanism behind codecs, allocators, aggregation strategies, run modes
and federated message types.

A `Registry` maps names to implementations; a second registration of a name is refused (two modules claiming one
name is a bug, not an override), and an unknown name is refused with the known ones listed. Implementations that are
costly to import (scipy, paddle) can be named up front with the module that registers them (`lazy`): the module is
imported on first use.
"""
from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, Mapping, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> implementations of one kind (`kind` names them in errors: "codec", "allocation method", ...).

    `known` is the word before the list of names in an unknown name's error ("known codecs: a, b"; empty: "known:
    a, b"); `error` the exception type raised for an unknown name; `lazy` maps names to the module that registers
    them when imported.
    """

    def __init__(self, kind: str, *, known: str = "", error: type[Exception] = ValueError,
                 lazy: Mapping[str, str] | None = None) -> None:
        self.kind, self.known, self.error = kind, known, error
        self._items: dict[str, T] = {}
        self._lazy = dict(lazy or {})

    def add(self, name: str, item: T) -> T:
        """Register `item` as `name`; ValueError when the name is taken."""
        if name in self._items:
            raise ValueError(f"{self.kind} name {name!r} registered twice ({self._items[name]!r} and {item!r})")
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""
        def deco(item: T) -> T:
            return self.add(name, item)
        return deco

    def get(self, name: str) -> T:
        """The implementation registered as `name` (importing its module if it is lazy); `error` naming the known
        names when there is none."""
        item = self._items.get(name)
        if item is None and name in self._lazy:
            importlib.import_module(self._lazy[name])
            item = self._items.get(name)
        if item is None:
            raise self.error(self.unknown(name))
        return item

    def unknown(self, name: object) -> str:
        """The message for an unknown name: the name and the known ones."""
        label = f"known {self.known}: " if self.known else "known: "
        return f"unknown {self.kind} {name!r}; {label}{', '.join(self.names())}"

    def names(self) -> list[str]:
        """Every known name (registered or lazy), sorted."""
        return sorted(set(self._items) | set(self._lazy))

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
