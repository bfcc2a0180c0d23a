"""Quota callbacks for tests that load one into a real Sluice process by class path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from quotas.cluster import ClusterView
from quotas.entity import ClientIdentity, QuotaEntity, QuotaKind, SensorKey


class TeamQuotaCallback:
    """Groups client ids by a team of their own, a tag Kafka's entities do not have (KIP-257's
    ``quotaMetricTags`` returns any map): the client ids of one team share one budget per kind in
    `limits`; a client id of no team is its own group, unlimited.

    Config: ``teams: {client_id: team}``, ``limits: {team: {quota key: value}}``."""

    quota_kinds: ClassVar[frozenset[QuotaKind]] = frozenset(QuotaKind)

    def __init__(self, *, broker_id: int | None = None, teams: Mapping[str, str],
                 limits: Mapping[str, Mapping[str, float]]) -> None:
        self.broker_id = broker_id
        self.teams = dict(teams)
        self.limits = {team: {QuotaKind(k): float(v) for k, v in values.items()}
                       for team, values in limits.items()}

    def quota_metric_tags(self, kind: QuotaKind, identity: ClientIdentity) -> dict[str, str]:
        team = self.teams.get(identity.client_id)
        return {"team": team} if team is not None else {"client-id": identity.client_id}

    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        return SensorKey.from_tags(kind, self.quota_metric_tags(kind, identity))

    def quota_limit(self, key: SensorKey) -> float | None:
        team = dict(key.tags).get("team")
        return None if team is None else self.limits.get(team, {}).get(key.kind)

    def update_quota(self, entity: QuotaEntity, kind: QuotaKind, value: float) -> None:
        pass

    def remove_quota(self, entity: QuotaEntity, kind: QuotaKind) -> None:
        pass

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        return False

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        return False

    def close(self) -> None:
        pass
