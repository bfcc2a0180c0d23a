"""How usage reports travel between fleet members.

An exchange carries opaque payloads (a member's encoded `quotas.fleet.UsageReport`) from every
member to every member, the sender included. It never blocks the event loop: `publish` queues,
`drain` returns what arrived since the last call. Two implementations:

* `KafkaExchange` (`proxy.fleet.kafka`): a topic every member of every instance writes to and reads
  from the end (the `fleet:` section);
* `LocalExchange` (`proxy.fleet.local`): the workers of one instance, relayed by their supervisor
  over a Unix socket (``--workers N`` without `fleet:`).
"""

from __future__ import annotations

import collections
from typing import Protocol


class Exchange(Protocol):
    def start(self) -> None:
        """Connect; may raise `ExchangeError` with a one-line reason (then nothing was started)."""

    def publish(self, payload: bytes) -> None:
        """Queue one report for every member; never blocks, never raises (a failure is counted)."""

    def drain(self) -> list[bytes]:
        """Every payload received since the last call, oldest first, this member's own included."""

    @property
    def errors(self) -> int:
        """Failures so far (publish or receive), for `sluice_fleet_exchange_errors_total`."""

    @property
    def connected(self) -> bool:
        """False while the channel is known to be down (the fleet then applies its fallback)."""

    def describe(self) -> str:
        """One line for logs: where the reports go."""

    def close(self) -> None: ...


class ExchangeError(Exception):
    """The exchange cannot be set up; the message says why in one line."""


class Inbox:
    """What both exchanges share: payloads a background thread received, handed over by `drain`
    (a deque: appends and pops are atomic, so no lock), and an error count."""

    def __init__(self, max_payloads: int = 100_000) -> None:
        self._inbox: collections.deque[bytes] = collections.deque(maxlen=max_payloads)
        self._errors = 0

    def drain(self) -> list[bytes]:
        out: list[bytes] = []
        inbox = self._inbox
        while inbox:
            out.append(inbox.popleft())
        return out

    @property
    def errors(self) -> int:
        return self._errors
