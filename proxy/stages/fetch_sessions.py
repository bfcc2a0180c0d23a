"""The partitions of each connection's fetch sessions, so that an incremental Fetch or ShareFetch
is capped by the topics it fetches from and not only by those it lists.

An incremental request of a fetch session (KIP-227; a share session alike) lists only the
partitions that changed: a full request (epoch 0 or -1) replaces what a session fetches, an
incremental one adds what it lists and drops what it forgets. Sessions are kept by (connection,
API), at most `MAX_FETCH_SESSIONS` of them: beyond it, the one that fetched longest ago is forgotten
(its incremental requests are then capped by the topics they list, until its next full request).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from protocol.fetch import FetchRequestTopics

#: Fetch sessions (one per connection and API) whose topics are kept.
MAX_FETCH_SESSIONS = 10_000

#: a topic of a fetch request: its name, or its id (Fetch v13+, ShareFetch)
TopicRef = tuple[str | None, bytes | None]


class FetchSessions:
    """(connection id, API key) -> the partitions of its fetch session, by topic name or id; LRU-bounded."""

    __slots__ = ("_max_sessions", "_sessions")

    def __init__(self, max_sessions: int = MAX_FETCH_SESSIONS) -> None:
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[int, int], dict[TopicRef, set[int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def fetched(self, key: tuple[int, int], listed: FetchRequestTopics) -> Iterable[TopicRef]:
        """The topics the request `listed` on session `key` fetches from, after it updated the session."""
        sessions = self._sessions
        session: dict[TopicRef, set[int]] | None
        if listed.session_epoch > 0:
            session = sessions.get(key)
            if session is None:
                session = sessions[key] = {}
            else:
                sessions.move_to_end(key)
            for gone in listed.forgotten:
                parts = session.get((gone.name, gone.topic_id))
                if parts is not None:
                    parts.difference_update(gone.partitions)
                    if not parts:
                        del session[(gone.name, gone.topic_id)]
        else:
            session = None
            sessions.pop(key, None)
            if listed.session_epoch == 0:  # opens a session: its incremental requests follow
                session = sessions[key] = {}
        if session is None:
            return [(t.name, t.topic_id) for t in listed.topics]
        for t in listed.topics:
            session.setdefault((t.name, t.topic_id), set()).update(t.partitions)
        if len(sessions) > self._max_sessions:
            sessions.popitem(last=False)  # the longest idle
        return session
