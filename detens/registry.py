"""A small name → object registry whose unknown-name errors list the valid names."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from detens.checks import did_you_mean

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to callables (fusers, adapters, heads).

    >>> FUSERS = Registry("fuser")
    >>> @FUSERS.register("nms")
    ... def nms(...): ...
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        # checked here: one name that is not a string would break names() and every error listing them
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} names must be non-empty strings, got {type(name).__name__}: {name!r}")

        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if not isinstance(name, str):
            raise TypeError(f"{self.kind} name must be a string, got {type(name).__name__}")
        try:
            return self._items[name]
        except KeyError:
            raise unknown_name_error(self.kind, name, self._items) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._items  # a list or dict is no name, not an error

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


def unknown_name_error(kind: str, name: str, valid: Iterable[str]) -> ValueError:
    """``unknown <kind> 'x'; valid names: a, b, c. Did you mean 'a'?``"""
    valid = sorted(valid)
    return ValueError(f"unknown {kind} {name!r}; valid names: {', '.join(valid)}.{did_you_mean(name, valid)}")
