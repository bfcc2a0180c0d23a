"""The effective quotas of a caller: which configured entry gives each quota, and what it overrides.

Resolution is `DefaultQuotaCallback`'s (with its client-id-prefix levels) for a caller and
`TopicQuotaCallback`'s for a topic, the ones enforcement uses, so a description can never
disagree with what is enforced: the winning entry is the callback's `matched_entity` for the
caller's sensor key. The overridden entries are found the same way, by asking the callback again
with the winner taken out, until nothing matches: each is what would apply if every more specific
entry were deleted.
"""

from __future__ import annotations

from dataclasses import dataclass

from quotas.callback import (
    DefaultQuotaCallback,
    EntityMatcher,
    QuotaCallback,
    TopicQuotaCallback,
    topic_identity,
)
from quotas.config import QuotaConfig
from quotas.entity import ClientIdentity, QuotaEntity, QuotaKind


@dataclass(frozen=True, slots=True)
class QuotaSource:
    """One configured value and the entry it comes from."""

    entity: QuotaEntity
    value: float
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class EffectiveQuota:
    """The quota of one kind that applies to a caller, and the less specific entries it overrides
    (most specific first)."""

    kind: QuotaKind
    source: QuotaSource
    overridden: tuple[QuotaSource, ...] = ()

    @property
    def value(self) -> float:
        return self.source.value


def effective_quotas(config: QuotaConfig, identity: ClientIdentity) -> dict[QuotaKind, EffectiveQuota]:
    """Per kind with a quota for `identity`: the applied value, its entry, and the entries it overrides.

    `identity` is the caller as enforcement sees it (principal name, ``""`` for no client id).
    Kinds with no applicable quota are absent.
    """
    out: dict[QuotaKind, EffectiveQuota] = {}
    for kind in QuotaKind:
        chain = _chain(config, kind, identity)
        if chain:
            out[kind] = EffectiveQuota(kind, chain[0], tuple(chain[1:]))
    return out


def effective_topic_quotas(config: QuotaConfig, topic: str) -> dict[QuotaKind, EffectiveQuota]:
    """Per kind with a topic quota for `topic`: the applied value, its topic or topic-prefix entry
    and the entries it overrides (an exact topic overrides prefixes, a longer prefix a shorter).
    Topic quotas apply to every client beside its own quota; the larger throttle wins."""
    out: dict[QuotaKind, EffectiveQuota] = {}
    for kind in QuotaKind:
        chain = _chain(config, kind, topic_identity(topic), TopicQuotaCallback())
        if chain:
            out[kind] = EffectiveQuota(kind, chain[0], tuple(chain[1:]))
    return out


def _chain(config: QuotaConfig, kind: QuotaKind, identity: ClientIdentity,
           callback: QuotaCallback | None = None) -> list[QuotaSource]:
    if callback is None:
        callback = DefaultQuotaCallback(sticky_levels=False)
    assert isinstance(callback, EntityMatcher)
    shadows: dict[QuotaEntity, bool] = {}
    for entry in config:
        value = entry.values.get(kind)
        if value is not None:
            callback.update_quota(entry.entity, kind, value)
            shadows[entry.entity] = entry.shadow or config.shadow_all
    chain: list[QuotaSource] = []
    while True:
        key = callback.sensor_key(kind, identity)
        entity = callback.matched_entity(key)
        value = callback.quota_limit(key)
        if entity is None or value is None:
            return chain
        chain.append(QuotaSource(entity, value, shadows[entity]))
        callback.remove_quota(entity, kind)
