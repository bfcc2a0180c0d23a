"""The fetch-session partition memory of the quota stage (KIP-227; share sessions alike)."""

from __future__ import annotations

from protocol.fetch import FetchRequestTopics, TopicPartitions
from proxy.stages.fetch_sessions import FetchSessions


def listed(epoch: int, topics: dict[str, list[int]], forgotten: dict[str, list[int]] | None = None
           ) -> FetchRequestTopics:
    def parts(by_topic: dict[str, list[int]]) -> tuple[TopicPartitions, ...]:
        return tuple(TopicPartitions(t, None, tuple(p)) for t, p in by_topic.items())
    return FetchRequestTopics(epoch, parts(topics), parts(forgotten or {}))


def names(refs: object) -> set[str | None]:
    return {name for name, _id in refs}  # type: ignore[attr-defined]


def test_a_session_keeps_its_partitions_until_they_are_forgotten() -> None:
    sessions = FetchSessions()
    assert names(sessions.fetched((1, 1), listed(0, {"t": [0, 1], "u": [0]}))) == {"t", "u"}
    assert names(sessions.fetched((1, 1), listed(1, {}))) == {"t", "u"}
    assert names(sessions.fetched((1, 1), listed(2, {}, forgotten={"t": [0]}))) == {"t", "u"}
    assert names(sessions.fetched((1, 1), listed(3, {}, forgotten={"t": [1]}))) == {"u"}
    assert names(sessions.fetched((2, 1), listed(1, {}))) == set()  # another connection's own
    # a sessionless fetch (epoch -1) lists what it fetches and leaves no session behind
    assert names(sessions.fetched((1, 1), listed(-1, {"v": [0]}))) == {"v"}
    assert names(sessions.fetched((1, 1), listed(4, {}))) == set()


def test_sessions_are_bounded_and_the_longest_idle_is_forgotten_first() -> None:
    sessions = FetchSessions(max_sessions=2)
    for connection in (1, 2):
        sessions.fetched((connection, 1), listed(0, {f"t{connection}": [0]}))
    sessions.fetched((1, 1), listed(1, {}))  # connection 1 fetched last: 2 is the longest idle
    sessions.fetched((3, 1), listed(0, {"t3": [0]}))
    assert len(sessions) == 2
    assert names(sessions.fetched((1, 1), listed(2, {}))) == {"t1"}
    assert names(sessions.fetched((2, 1), listed(1, {}))) == set()  # forgotten: only what it lists
