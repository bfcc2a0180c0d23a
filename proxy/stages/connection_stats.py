"""Counts each completed request into its connection's `ConnectionStats` (the connection inventory).

In the pipeline only while `connections_endpoint.enabled` (`proxy.server`): without it a request
pays nothing. Per request it adds a few integers and notes the client id and the quota entities the
quota stage matched (`entry.quota`, written by `proxy.stages.quota.QuotaStage` before any stage's
`on_complete`, so its place in the pipeline does not matter).
"""

from __future__ import annotations

from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, StageBase


class ConnectionStatsStage(StageBase):
    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        stats = ctx.stats
        note = entry.quota
        throttle_ms = 0
        if note is not None:
            throttle_ms = note.enforced_ms
            entities = stats.quota_entities
            for decision in note.decisions:
                entity = decision.entity
                if entity is not None and not entity.is_topic:  # topic entries: not the client's
                    entities[decision.kind] = entity
        stats.count(entry.api_key, entry.request_bytes, entry.response_bytes, throttle_ms)
        if entry.client_id is not None:
            stats.client_id = entry.client_id
