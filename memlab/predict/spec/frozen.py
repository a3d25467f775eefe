"""A read-only mapping that pickles and deep-copies (the per-dtype tables of frozen dataclasses).

``types.MappingProxyType`` is read-only but cannot be pickled (so neither can a dataclass holding one, nor can
``copy.deepcopy`` copy it, nor can a row cross to a ``multiprocessing`` worker). :class:`FrozenDict` holds a
private dict copy, offers only the read methods of :class:`collections.abc.Mapping`, refuses item and attribute
assignment, and pickles as its items. No torch, no numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(Mapping[K, V], Generic[K, V]):
    """An immutable mapping: ``FrozenDict({"bf16": 1e15})["bf16"]``; ``d["bf16"] = 0`` raises TypeError."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        object.__setattr__(self, "_data", dict(data))

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._data!r})"

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy.deepcopy rebuild it from its items
        return (type(self), (dict(self._data),))
