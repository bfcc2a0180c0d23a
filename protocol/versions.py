"""Which versions of each Kafka API Sluice advertises in ApiVersions, and why (issue 15).

The rule: nothing is capped without a reason. Per API key, one of:

* **rewrite**: the response carries broker addresses (Metadata, FindCoordinator, DescribeCluster,
  Produce v10+ and Fetch v16+ with KIP-951's leader endpoints, ShareFetch and ShareAcknowledge with
  theirs). Sluice must map every one of them to its own listeners, so it advertises only the
  versions whose layout it knows; a newer version would carry addresses Sluice cannot find.
* **read**: Sluice reads the request or response beyond its header to do its job (ApiVersions:
  its caps and the client software; SASL: the principal). Capped at the versions whose layout is
  verified.
* **answer**: Sluice answers it itself (DescribeClientQuotas, AlterClientQuotas: `proxy/admin`),
  in the versions it implements.
* **throttle**: the response carries `throttle_time_ms`, which Sluice writes when it throttles
  (KIP-219). Capped at the highest version whose layout is known (Kafka 4.3.1's), where the field
  is found with certainty; the client simply negotiates that version.
* **pass**: none of the above (no addresses, no throttle field: the inter-broker, quorum and
  share-state RPCs, WriteTxnMarkers, DescribeQuorum, Envelope). Every version the broker offers
  passes through untouched; a version newer than Kafka 4.3.1's is logged once, not removed.

An API key Sluice has never heard of passes through untouched too (logged once): it is in no
table, so nothing caps it. Against Kafka 4.3.1 the result is that Sluice advertises exactly what
the broker does, API by API and version by version (`tests/integration/test_kafka4_clients.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from protocol.apis import ApiKey
from protocol.throttle import MAX_KNOWN_RESPONSE_VERSION


class Treatment(StrEnum):
    REWRITE = "rewrite"
    READ = "read"
    ANSWER = "answer"
    THROTTLE = "throttle"
    PASS = "pass"


@dataclass(frozen=True, slots=True)
class ApiPolicy:
    """What Sluice does with one API and the highest version it advertises (None: the broker's)."""

    treatment: Treatment
    max_version: int | None
    why: str


# Kafka 4.3.1's highest version of each API (= kio 0.6.5's schemas)
KNOWN_MAX_VERSIONS: Final[dict[int, int]] = dict(MAX_KNOWN_RESPONSE_VERSION)

_SPECIAL: Final[dict[int, tuple[Treatment, str]]] = {
    ApiKey.PRODUCE: (Treatment.REWRITE, "KIP-951 leader endpoints (v10+) after NOT_LEADER_OR_FOLLOWER; "
                                        "metered (producer_byte_rate)"),
    ApiKey.FETCH: (Treatment.REWRITE, "KIP-951 leader endpoints (v16+, also in streamed responses); "
                                      "metered (consumer_byte_rate), emptied when throttled"),
    ApiKey.METADATA: (Treatment.REWRITE, "broker addresses"),
    ApiKey.FIND_COORDINATOR: (Treatment.REWRITE, "coordinator addresses"),
    ApiKey.DESCRIBE_CLUSTER: (Treatment.REWRITE, "broker addresses"),
    ApiKey.SHARE_FETCH: (Treatment.REWRITE, "leader endpoints; metered (consumer_byte_rate), "
                                            "delivered and throttled, never emptied"),
    ApiKey.SHARE_ACKNOWLEDGE: (Treatment.REWRITE, "leader endpoints"),
    ApiKey.API_VERSIONS: (Treatment.READ, "Sluice caps it and reads the client software (KIP-511)"),
    ApiKey.SASL_HANDSHAKE: (Treatment.READ, "the mechanism, for the principal"),
    ApiKey.SASL_AUTHENTICATE: (Treatment.READ, "the principal"),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (Treatment.ANSWER, "Sluice's own quotas (proxy/admin)"),
    ApiKey.ALTER_CLIENT_QUOTAS: (Treatment.ANSWER, "Sluice's own quotas (proxy/admin)"),
}

# Responses without throttle_time_ms in any version (checked against kio's schemas in the tests)
NO_THROTTLE_FIELD: Final = frozenset({
    ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA, ApiKey.UPDATE_METADATA, ApiKey.CONTROLLED_SHUTDOWN,
    ApiKey.SASL_HANDSHAKE, ApiKey.WRITE_TXN_MARKERS, ApiKey.SASL_AUTHENTICATE, ApiKey.VOTE,
    ApiKey.BEGIN_QUORUM_EPOCH, ApiKey.END_QUORUM_EPOCH, ApiKey.DESCRIBE_QUORUM, ApiKey.ENVELOPE,
    ApiKey.INITIALIZE_SHARE_GROUP_STATE, ApiKey.READ_SHARE_GROUP_STATE, ApiKey.WRITE_SHARE_GROUP_STATE,
    ApiKey.DELETE_SHARE_GROUP_STATE, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY,
})

_PASS_WHY: Final[dict[int, str]] = {
    ApiKey.DESCRIBE_QUORUM: "no throttle field; v2 lists controller endpoints, which are not brokers "
                            "Sluice fronts (clients never fetch or produce there)",
}


def _policy(key: ApiKey) -> ApiPolicy:
    special = _SPECIAL.get(key)
    if special is not None:
        return ApiPolicy(special[0], KNOWN_MAX_VERSIONS[key], special[1])
    if key in NO_THROTTLE_FIELD:
        return ApiPolicy(Treatment.PASS, None, _PASS_WHY.get(key, "no addresses, no throttle field"))
    return ApiPolicy(Treatment.THROTTLE, KNOWN_MAX_VERSIONS[key], "throttle_time_ms patched when throttled")


API_POLICIES: Final[dict[int, ApiPolicy]] = {key.value: _policy(key) for key in ApiKey}

# ApiVersions caps: every API with a highest version (a cap below an API's min_version removes it)
VERSION_CAPS: Final[dict[int, int]] = {
    key: policy.max_version for key, policy in API_POLICIES.items() if policy.max_version is not None
}


def unverified_versions(api_key: int, max_version: int) -> str | None:
    """Why a broker's advertised (api_key, max_version) passes through unverified, or None.

    For the note logged once when a broker offers an API or version Sluice has never seen.
    """
    policy = API_POLICIES.get(api_key)
    if policy is None:
        return f"API key {api_key} is unknown to Sluice: passed through untouched"
    known = KNOWN_MAX_VERSIONS.get(api_key)
    if policy.max_version is None and known is not None and max_version > known:
        return f"v{known + 1}-v{max_version} are newer than Sluice knows: passed through untouched"
    return None
