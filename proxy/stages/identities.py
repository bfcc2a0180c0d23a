"""The `ClientIdentity` of each (principal, client id) pair, made once: the same object for every
request, so the quota managers' lookups by it compare by identity (equal either way: the same
decisions). At most `MAX_IDENTITIES` pairs are kept; beyond it, the cache starts over."""

from __future__ import annotations

from quotas.entity import ClientIdentity

#: (principal, client id) pairs kept; beyond it, the cache starts over.
MAX_IDENTITIES = 10_000


class Identities(dict[tuple[str, str | None], ClientIdentity]):
    """A dict (its `get` is the hot path's lookup) that `make`s what it misses, bounded."""

    def make(self, names: tuple[str, str | None]) -> ClientIdentity:
        if len(self) >= MAX_IDENTITIES:
            self.clear()
        identity = self[names] = ClientIdentity.of(*names)
        return identity
