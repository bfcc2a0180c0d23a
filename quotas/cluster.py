"""What Sluice knows of the cluster behind it: topics, partitions and their leaders.

Built from the Metadata responses Sluice forwards (a client asks for some topics at a time, so the
view is the union of what was seen, each topic as of its newest response). Frozen: a callback may
keep a reference; a change produces a new view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: A partition without a leader (Kafka's -1).
NO_LEADER = -1


@dataclass(frozen=True)
class ClusterView:
    """``topics[name][partition] == leader broker id`` (``NO_LEADER`` when there is none)."""

    topics: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", MappingProxyType({t: tuple(p) for t, p in self.topics.items()}))

    def __hash__(self) -> int:
        return hash(frozenset(self.topics.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterView):
            return dict(self.topics) == dict(other.topics)
        return NotImplemented

    @property
    def brokers(self) -> frozenset[int]:
        """Every broker that leads at least one partition."""
        return frozenset(b for leaders in self.topics.values() for b in leaders if b != NO_LEADER)

    def leader_counts(self, topics: Iterable[str] | None = None) -> dict[int, int]:
        """How many partitions of `topics` (all when None) each broker leads."""
        counts: dict[int, int] = {}
        names = self.topics.keys() if topics is None else topics
        for name in names:
            for leader in self.topics.get(name, ()):
                if leader != NO_LEADER:
                    counts[leader] = counts.get(leader, 0) + 1
        return counts

    def leader_share(self, broker_id: int, topics: Iterable[str] | None = None) -> float | None:
        """The fraction of `topics`' led partitions whose leader is `broker_id`; None if none is led."""
        counts = self.leader_counts(topics)
        total = sum(counts.values())
        return None if total == 0 else counts.get(broker_id, 0) / total

    def merged(self, seen: Mapping[str, Iterable[tuple[int, int]]], gone: Iterable[str] = ()) -> ClusterView:
        """A view where each topic in `seen` (``[(partition, leader)]``) replaces the old one and
        topics in `gone` are removed. Returns `self` when nothing changed."""
        topics = dict(self.topics)
        for name, partitions in seen.items():
            pairs = sorted(partitions)
            leaders = [NO_LEADER] * (pairs[-1][0] + 1 if pairs else 0)
            for index, leader in pairs:
                leaders[index] = leader
            topics[name] = tuple(leaders)
        for name in gone:
            topics.pop(name, None)
        if topics == self.topics:
            return self
        return ClusterView(topics)
