"""tools/list answers, reused for a few seconds.

A listing is one OPA query over the whole catalog: with 500 tools that is 15-40 ms of
policy evaluation and a 100 KB input, and agents list at every session start. The set of
visible names OPA returned is kept for `ttl` seconds under everything in the policy
input that could change it — the principal's claims, the request facts (protocol,
source address, weekday and hour) — except the request id and the clock's finer digits.

What a principal *sees* may therefore lag a policy or role change by up to `ttl`
seconds; what it may *do* never does, because every tools/call is decided on its own.
A failed query (fail-closed: nothing visible) is never kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_VOLATILE = ("id", "time", "time_ns")


def listing_key(input_doc: dict[str, Any]) -> str:
    """The cache key of a listing input: all of it but the catalog and the volatile request facts."""
    request = {k: v for k, v in input_doc.get("request", {}).items() if k not in _VOLATILE}
    rest = {k: v for k, v in input_doc.items() if k not in ("tools", "request")}
    return json.dumps([rest, request], sort_keys=True, separators=(",", ":"), default=str)


@dataclass
class ListingCache:
    ttl: float
    max_entries: int = 4096
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)

    def get(self, key: str) -> frozenset[str] | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] <= self.clock():
            del self._entries[key]
            return None
        return hit[1]

    def put(self, key: str, names: frozenset[str]) -> None:
        if self.ttl <= 0:
            return
        now = self.clock()
        if len(self._entries) >= self.max_entries:
            for k in [k for k, (expires, _) in self._entries.items() if expires <= now]:
                del self._entries[k]
            while len(self._entries) >= self.max_entries:
                del self._entries[next(iter(self._entries))]  # the oldest insertion
        self._entries.pop(key, None)
        self._entries[key] = (now + self.ttl, names)

    def __len__(self) -> int:
        return len(self._entries)
