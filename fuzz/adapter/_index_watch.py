"""Which prefix-cache entries may need judging again, without walking the
index each step.

The contents model judges each entry of vLLM's prefix-cache map once and
remembers the verdict until the block's contents change
(``ScriptedRunner.index_entries``). Walking the whole map each step only to
skip what was judged right was most of its cost. :class:`IndexChanges`
hands over just the entries that may need judging: those under a key the
map's ``insert`` / ``pop`` touched since the last call (wrapped on the map
object), those of a block whose contents changed, and those left unjudged
or judged wrong last time (which a whole walk would report again). A new
map object (a reset replaces it), a map whose size differs from the keys
seen in it (written some way other than ``insert`` / ``pop``), and a map
that cannot be wrapped are walked whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fuzz.adapter._events import watch_map

__all__ = ["IndexChanges"]


class IndexChanges:
    """The entries of one block pool's prefix-cache map that may need judging."""

    def __init__(self) -> None:
        self._holder: Any = None  # the map object wrapped
        self._touched: set[Any] = set()  # keys insert/pop touched since the last call
        self._blocks: dict[Any, tuple[Any, ...]] = {}  # key -> the blocks the map held under it at the last look
        self._keys_of: dict[int, set[Any]] = {}  # block id -> keys it was seen under
        self._standing: set[Any] = set()  # keys to judge again next call

    def _look(self, key: Any, cached: Mapping[Any, Any]) -> None:
        for block in self._blocks.pop(key, ()):
            keys = self._keys_of.get(block.block_id)
            if keys is not None:
                keys.discard(key)
        held = cached.get(key)
        if held is None:
            return
        blocks = tuple(held.values()) if isinstance(held, dict) else (held,)
        self._blocks[key] = blocks
        for block in blocks:
            self._keys_of.setdefault(block.block_id, set()).add(key)

    def to_judge(self, holder: Any, cached: Mapping[Any, Any], changed: Iterable[int]) -> list[tuple[Any, Any]]:
        """(key, block) of each entry that may need judging now; ``holder``
        the map object, ``cached`` its key -> block(s) dict, ``changed`` the
        blocks whose contents changed since the last call."""
        if holder is not self._holder or self._holder is None:
            self._touched.update(self._blocks)
            self._touched.update(cached)
            self._holder = holder if watch_map(holder, self._touched) else None
        keys = self._standing
        keys.update(self._touched)
        for key in self._touched:
            self._look(key, cached)
        self._touched.clear()
        if len(self._blocks) != len(cached):
            for key in [*self._blocks, *cached]:
                self._look(key, cached)
            keys.update(cached)
        for block_id in changed:
            keys.update(self._keys_of.get(block_id, ()))
        self._standing = set()
        return [(key, block) for key in keys for block in self._blocks.get(key, ())]

    def stand(self, key: Any) -> None:
        """Judge ``key``'s entries again next call."""
        self._standing.add(key)
