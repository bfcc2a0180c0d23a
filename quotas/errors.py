"""Errors raised by the quotas package.

Nothing on the hot path raises: quota checks return a `ThrottleDecision`. These errors are for
configuration that cannot be applied.
"""

from __future__ import annotations

from collections.abc import Iterable


class QuotaError(Exception):
    """Base class of every error the quotas package raises."""


class QuotaConfigError(QuotaError, ValueError):
    """A quota configuration value or shape is invalid.

    `key` names where the problem is (a key path such as ``quotas.entries[2].producer_byte_rate``,
    or a bare key such as ``producer_byte_rate`` when raised outside a parser), `reason` says what
    is wrong. When several problems were found at once, `problems` lists all of them, first one
    first; `key` and `reason` are the first.
    """

    key: str
    reason: str
    problems: tuple[tuple[str, str], ...]

    def __init__(self, key: str, reason: str, *, more: Iterable[tuple[str, str]] = ()) -> None:
        self.key = key
        self.reason = reason
        self.problems = ((key, reason), *more)
        super().__init__("\n".join(_format(k, r) for k, r in self.problems))

    @classmethod
    def of(cls, problems: Iterable[tuple[str, str]]) -> QuotaConfigError:
        """One error carrying several problems (at least one)."""
        first, *rest = problems
        return cls(first[0], first[1], more=rest)

    def under(self, prefix: str) -> QuotaConfigError:
        """The same problems, with every key placed under `prefix` (``entries[2]`` + ``user``)."""
        return QuotaConfigError.of((join_key(prefix, k), r) for k, r in self.problems)


def join_key(prefix: str, key: str) -> str:
    """Join key-path parts: ``join_key("quotas.entries[2]", "user") == "quotas.entries[2].user"``."""
    if not prefix:
        return key
    if not key:
        return prefix
    if key.startswith("["):
        return prefix + key
    return f"{prefix}.{key}"


def _format(key: str, reason: str) -> str:
    return f"{key}: {reason}" if key else reason
