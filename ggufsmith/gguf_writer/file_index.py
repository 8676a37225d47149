"""Indexes over the names of a mapped GGUF file that hold no names: 8-16 bytes per entry.

A file may hold hundreds of thousands of keys or tensor infos of ~15-35 bytes each; a dict or a
list of objects per entry would cost ten times the file. These keep numpy arrays of hashes and
positions, and decode a name from the file only to confirm a match.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


class NameIndex:
    """Finds entry i of a file by its name, from the names' hashes; `name_of(i)` decodes name i.

    Takes over `hashes` (int64, by entry number) and sorts it in place: no copy of it is made."""

    def __init__(self, hashes: np.ndarray, name_of: Callable[[int], str]) -> None:
        self._order = np.argsort(hashes, kind="stable")  # entry numbers, by hash
        hashes.sort(kind="stable")
        self._hashes = hashes
        self._name_of = name_of

    def _candidates(self, name_hash: int) -> np.ndarray:
        lo = np.searchsorted(self._hashes, name_hash, side="left")
        hi = np.searchsorted(self._hashes, name_hash, side="right")
        return self._order[lo:hi]

    def find(self, name: str) -> int | None:
        """The number of the entry called `name`, or None."""
        for i in self._candidates(hash(name)):
            if self._name_of(int(i)) == name:
                return int(i)
        return None

    def first_duplicate(self) -> int | None:
        """The lowest-numbered entry whose name an earlier entry has, or None."""
        same = np.flatnonzero(self._hashes[1:] == self._hashes[:-1])
        first = None
        for name_hash in np.unique(self._hashes[same]):
            seen: set[str] = set()
            for i in np.sort(self._candidates(int(name_hash))):
                name = self._name_of(int(i))
                if name in seen:
                    first = int(i) if first is None else min(first, int(i))
                    break
                seen.add(name)
        return first


class LazyTable(Sequence, Generic[T]):
    """A read-only list of `n` items built by `make(i)` on each access (a list's API, no storage)."""

    def __init__(self, n: int, make: Callable[[int], T]) -> None:
        self._n = n
        self._make = make

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._make(i) for i in range(*index.indices(self._n))]
        i = index.__index__()
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"index {index} out of range for {self._n} items")
        return self._make(i)

    def __iter__(self):
        return (self._make(i) for i in range(self._n))

    def __repr__(self) -> str:
        return f"LazyTable({self._n} items)"
