"""The ``fleet:`` section: one budget shared by every Sluice process that names the same fleet id."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class FleetConfig(BaseModel):
    """One budget per entity across every Sluice process naming the same fleet id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
                    description="shared by every member of the fleet; reports of other fleets are ignored")
    bootstrap: str | None = Field(default=None, description="the Kafka cluster carrying the usage reports "
                                                            "(default: upstream.bootstrap)")
    topic: str = Field(default="_sluice_fleet", pattern=r"^[A-Za-z0-9._-]{1,249}$",
                       description="created if missing: 1 partition, deleted after retention_ms")
    report_interval_ms: int = Field(default=500, ge=50, le=10_000,
                                    description="how often each member publishes its usage report")
    member_timeout_ms: int | None = Field(default=None, ge=100, le=120_000,
                                          description="a member silent this long has left the fleet "
                                                      "(default: 3 report intervals)")
    fallback: Literal["split", "full"] = Field(
        default="split", description="while the exchange is down: split = quota / last known member "
                                     "count (the fleet never exceeds one budget); full = every member "
                                     "enforces the whole quota (fails open)")
    expected_members: int = Field(default=1, ge=1, le=10_000,
                                  description="the member count the fallback splits by before this "
                                              "process has heard from the fleet")
    headroom: float = Field(default=0.2, ge=0.0, le=10.0,
                            description="an unthrottled member is allotted what it used times 1 + headroom")
    retention_ms: int = Field(default=60_000, ge=1_000, description="for a topic Sluice creates")
    replication_factor: int = Field(default=-1,
                                    description="for a topic Sluice creates; -1 = the brokers' default")
    kafka_config: dict[str, SecretStr] = Field(
        default_factory=dict, description="extra librdkafka settings (security); never logged")

    @model_validator(mode="after")
    def _timeout_after_interval(self) -> FleetConfig:
        if self.member_timeout_ms is not None and self.member_timeout_ms <= self.report_interval_ms:
            raise ValueError("member_timeout_ms must be longer than report_interval_ms")
        return self

    @property
    def timeout_ms(self) -> int:
        return self.member_timeout_ms if self.member_timeout_ms is not None else 3 * self.report_interval_ms

    def librdkafka_config(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.kafka_config.items()}
