"""Storage-driven throttling: poll the brokers' volumes, scale produce quotas (Strimzi's design).

Every `check_interval_ms` the poller learns the active brokers (a Metadata request to a bootstrap
server, Strimzi's ``describeCluster``), asks each for DescribeLogDirs v4 (total and usable bytes
of every log dir) over its own connection with the upstream TLS settings (and ``storage.sasl``),
computes the throttle factor (`quotas.storage.throttle_factor`; an incomplete view holds the last
complete factor for `factor_validity_ms`, `quotas.storage.hold_or_fallback`) and applies it to every
produce limit (`QuotaEngine.set_limit_scale`). With ``source: local`` it reads `shutil.disk_usage` of the
configured paths instead. Changes of the factor are logged, steady polls are not.

Metrics (read at scrape time): ``sluice_storage_throttle_factor``,
``sluice_storage_fallback_applied{reason}`` (polls that fell back, a counter),
``sluice_storage_throttling_volume{broker,log_dir}`` (1 for the volume that throttles),
``sluice_storage_factor_held`` (1 while a failed poll keeps the last complete factor),
``sluice_storage_offline_log_dirs``, ``sluice_storage_active_brokers``, ``sluice_storage_active_log_dirs``,
``sluice_storage_volume_available_bytes`` / ``_ratio{broker,log_dir}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shutil
import ssl
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from protocol.errors import ProtocolError
from protocol.log_dirs import (
    describe_log_dirs_frame,
    metadata_frame,
    parse_brokers,
    parse_log_dirs,
    parse_sasl_authenticate,
    parse_sasl_handshake,
    sasl_authenticate_frame,
    sasl_handshake_frame,
)
from protocol.sasl_client import SaslCredentials, SaslError, mechanism_for
from quotas.entity import QuotaKind
from quotas.errors import QuotaConfigError
from quotas.storage import (
    CompleteView,
    FactorDecision,
    FallbackReason,
    StorageLimits,
    VolumeUsage,
    hold_or_fallback,
    throttle_factor,
)

log = logging.getLogger("sluice.storage")

#: The broker id given to volumes read with ``source: local``.
LOCAL_BROKER = -1
_MAX_FRAME = 100 * 1024 * 1024


class StorageSasl(BaseModel):
    """``storage.sasl``: how the poller authenticates to SASL listeners (PLAIN or SCRAM)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(description="the SASL mechanism")
    username: str = Field(min_length=1, description="the SASL user name")
    password: SecretStr = Field(description="the SASL password (never logged)")

    def credentials(self) -> SaslCredentials:
        return SaslCredentials(self.mechanism, self.username, self.password.get_secret_value())


class StorageConfig(BaseModel):
    """``storage:`` — slow producers down as the brokers' disks fill (docs/quotas.md, Storage-driven
    throttling)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["describe_log_dirs", "local"] = Field(
        default="describe_log_dirs", description="describe_log_dirs: ask the brokers for their volumes "
                                                 "(KIP-827); local: read the filesystems under paths")
    check_interval_ms: int = Field(default=30_000, gt=0, description="how often the volumes are read")
    limits: list[dict[str, Any]] = Field(default_factory=list, description="per volume, "
                                         "{type: available_bytes_below | available_ratio_below, soft: N "
                                         "and/or hard: N}; exactly one hard limit, at most one soft")
    fallback_factor: float = Field(default=1.0, ge=0.0, le=1.0,
                                   description="the factor once an incomplete view outlives "
                                               "factor_validity_ms (Strimzi: 1.0)")
    factor_validity_ms: int = Field(default=300_000, ge=0,
                                    description="an incomplete view keeps the last complete factor this "
                                                "long (Strimzi's throttle-factor.validity-duration, 5 min)")
    fallback_lifts_hard_stop: bool = Field(default=False,
                                           description="let the fallback lift a hard stop (factor 0) "
                                                       "the last complete view set")
    sasl: StorageSasl | None = Field(default=None, description="SASL to the brokers (PLAIN, SCRAM)")
    paths: list[Path] = Field(default_factory=list, description="volumes to read with source: local")
    timeout_ms: int = Field(default=10_000, gt=0, description="a describe_log_dirs poll must finish "
                            "within this, else it counts as failed")
    applies_to: Literal["quota_clients", "all"] = Field(
        default="quota_clients", description="all: clients with no produce quota are scaled too, from "
                                             "base_producer_byte_rate")
    base_producer_byte_rate: int | None = Field(default=None, gt=0, description="with applies_to: all, "
                                                "the produce quota scaled for clients that have none")

    @model_validator(mode="after")
    def _valid(self) -> StorageConfig:
        try:
            StorageLimits.parse(self.limits, key="storage.limits")
        except QuotaConfigError as exc:
            raise ValueError(str(exc).replace("\n", "; ")) from None
        if self.source == "local" and not self.paths:
            raise ValueError("storage.paths: source local needs at least one path to read")
        if (self.applies_to == "all") != (self.base_producer_byte_rate is not None):
            raise ValueError("storage.base_producer_byte_rate: needed with applies_to all, and only then")
        if self.source == "describe_log_dirs" and self.paths:
            raise ValueError("storage.paths: only with source local (describe_log_dirs asks the brokers)")
        return self

    def storage_limits(self) -> StorageLimits:
        return StorageLimits.parse(self.limits, key="storage.limits")


class LimitScaler(Protocol):
    """What the poller drives: `quotas.engine.QuotaEngine` in the proxy."""

    def set_limit_scale(self, kind: QuotaKind, factor: float, /) -> None: ...

    def set_storage_base_rate(self, rate: float | None, /) -> None: ...


class StoragePoller:
    def __init__(self, config: StorageConfig, scaler: LimitScaler, bootstrap: Sequence[tuple[str, int]],
                 upstream_ssl: ssl.SSLContext | None = None, connect_timeout_s: float = 10.0,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self._config = config
        self._limits = config.storage_limits()
        self._scaler = scaler
        scaler.set_storage_base_rate(_base_rate(config))
        self._bootstrap = list(bootstrap)
        self._ssl = upstream_ssl
        self._connect_timeout_s = connect_timeout_s
        self._correlation = itertools.count(1)
        self._clock_ms = clock_ms if clock_ms is not None else (lambda: int(time.monotonic() * 1000))
        self.last_complete: CompleteView | None = None  # the validity window starts here
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # what the metrics read
        self.decision: FactorDecision | None = None
        self._logged: FactorDecision | None = None  # the last decision logged
        self.volumes: list[VolumeUsage] = []
        self.active_brokers = 0
        self.fallbacks: Counter[str] = Counter()
        self.polls = 0

    @property
    def factor(self) -> float:
        return 1.0 if self.decision is None else self.decision.factor

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Poll once (so the first factor is known before clients arrive), then every interval."""
        await self.poll_once()
        self._task = asyncio.create_task(self._run(), name="sluice-storage-poller")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def reconfigure(self, config: StorageConfig) -> None:
        """SIGHUP: new limits, interval or fallback; polls again at once."""
        self._limits = config.storage_limits()
        self._config = config
        self._scaler.set_storage_base_rate(_base_rate(config))
        self._wake.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._config.check_interval_ms / 1000)
            self._wake.clear()
            try:
                await self.poll_once()
            except Exception:  # never let the poller die
                log.exception("storage poll failed unexpectedly")

    # ------------------------------------------------------------------ one poll

    async def poll_once(self) -> FactorDecision:
        config = self._config
        error: str | None = None
        volumes: list[VolumeUsage] = []
        expected: set[int] = set()
        try:
            if config.source == "local":
                volumes = _local_volumes(config.paths)
                expected = {LOCAL_BROKER}
            else:
                expected, volumes = await asyncio.wait_for(self._describe_cluster(), config.timeout_ms / 1000)
        except (OSError, TimeoutError, ProtocolError, ValueError, struct.error) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        fresh = throttle_factor(volumes, self._limits, expected, config.fallback_factor, poll_error=error)
        now_ms = self._clock_ms()
        decision = hold_or_fallback(fresh, self.last_complete, now_ms, config.factor_validity_ms,
                                    fallback_lifts_hard_stop=config.fallback_lifts_hard_stop)
        if not fresh.fallback_applied:
            self.last_complete = CompleteView(fresh, now_ms)
        self._apply(decision, volumes, len(expected))
        return decision

    def _apply(self, decision: FactorDecision, volumes: list[VolumeUsage], brokers: int) -> None:
        previous = self._logged
        self.polls += 1
        self.volumes = volumes
        self.active_brokers = brokers
        self.decision = decision
        if decision.fallback_applied and decision.reason is not None:
            self.fallbacks[decision.reason.value] += 1
        self._scaler.set_limit_scale(QuotaKind.PRODUCE, decision.factor)
        if _worth_logging(previous, decision):
            self._logged = decision
            log.log(logging.WARNING if decision.fallback_applied or decision.held else logging.INFO,
                    "storage throttle factor %s -> %.3f: %s",
                    "(start)" if previous is None else f"{previous.factor:.3f}", decision.factor,
                    describe(decision, self._limits))

    async def _describe_cluster(self) -> tuple[set[int], list[VolumeUsage]]:
        brokers = await self._metadata()
        results = await asyncio.gather(*(self._log_dirs(host, port) for host, port in brokers.values()),
                                       return_exceptions=True)
        volumes: list[VolumeUsage] = []
        for broker_id, result in zip(brokers, results, strict=True):
            if isinstance(result, BaseException):
                log.debug("DescribeLogDirs to broker %d failed: %s", broker_id, result)
                continue  # the broker counts as without log-dir data: fallback
            volumes += [VolumeUsage(broker_id, d.log_dir, d.total_bytes, d.usable_bytes, d.offline)
                        for d in result]
        return set(brokers), volumes

    async def _metadata(self) -> dict[int, tuple[str, int]]:
        errors = []
        for host, port in self._bootstrap:
            try:
                corr = next(self._correlation)
                payload = await self._call(host, port, metadata_frame(corr))
                return parse_brokers(payload, corr)
            except (OSError, TimeoutError, ProtocolError) as exc:
                errors.append(f"{host}:{port}: {exc}")
        raise OSError("no bootstrap server answered Metadata: " + "; ".join(errors))

    async def _log_dirs(self, host: str, port: int) -> list[Any]:
        corr = next(self._correlation)
        return parse_log_dirs(await self._call(host, port, describe_log_dirs_frame(corr)), corr)

    async def _call(self, host: str, port: int, frame: bytes) -> bytes:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=self._ssl), self._connect_timeout_s)
        try:
            if self._config.sasl is not None:
                await self._authenticate(reader, writer, self._config.sasl.credentials(), f"{host}:{port}")
            return await _exchange(reader, writer, frame, f"{host}:{port}")
        except asyncio.IncompleteReadError as exc:
            raise OSError(f"{host}:{port} closed the connection") from exc
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()


    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            sasl: SaslCredentials, where: str) -> None:
        """SaslHandshake v1 + SaslAuthenticate v2; an OSError names the failure, never the payload."""
        corr = next(self._correlation)
        frame = sasl_handshake_frame(corr, sasl.mechanism)
        reply = parse_sasl_handshake(await _exchange(reader, writer, frame, where), corr)
        if reply.error is not None:
            raise OSError(f"{where}: SASL {sasl.mechanism} {reply.error}")
        mechanism = mechanism_for(sasl)
        message: bytes | None = mechanism.first()
        try:
            while message is not None:
                corr = next(self._correlation)
                reply = parse_sasl_authenticate(
                    await _exchange(reader, writer, sasl_authenticate_frame(corr, message), where), corr)
                if reply.error is not None:
                    raise OSError(f"{where}: SASL {sasl.mechanism} as {sasl.username!r}: {reply.error}")
                message = mechanism.next(reply.auth_bytes)
        except SaslError as exc:
            raise OSError(f"{where}: SASL {sasl.mechanism}: {exc}") from None
        if not mechanism.done:
            raise OSError(f"{where}: SASL {sasl.mechanism} did not complete")


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes,
                    where: str) -> bytes:
    writer.write(frame)
    await writer.drain()
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if not 4 <= size <= _MAX_FRAME:
        raise OSError(f"{where} sent a frame of {size} bytes")
    return await reader.readexactly(size)


#: Within the soft band the factor moves with every byte written; log a move this large.
LOG_FACTOR_STEP = 0.05


def _worth_logging(previous: FactorDecision | None, decision: FactorDecision) -> bool:
    """A change of reason, of the throttling volume, to or from 0 or 1, or a step of at least
    `LOG_FACTOR_STEP` since the last decision logged."""
    if previous is None or previous.reason != decision.reason or previous.held != decision.held:
        return True
    before, now = previous.factor, decision.factor
    if before == now:
        return False
    return (now in (0.0, 1.0) or before in (0.0, 1.0) or abs(now - before) >= LOG_FACTOR_STEP - 1e-9
            or _volume_id(previous) != _volume_id(decision))


def _volume_id(decision: FactorDecision) -> tuple[int, str] | None:
    v = decision.throttling_volume
    return None if v is None else (v.broker_id, v.log_dir)


def _base_rate(config: StorageConfig) -> float | None:
    rate = config.base_producer_byte_rate
    return float(rate) if config.applies_to == "all" and rate is not None else None


def _local_volumes(paths: Sequence[Path]) -> list[VolumeUsage]:
    out = []
    for path in paths:
        usage = shutil.disk_usage(path)
        out.append(VolumeUsage(LOCAL_BROKER, str(path), usage.total, usage.free))
    return out


def describe(decision: FactorDecision, limits: StorageLimits) -> str:
    if decision.held:
        return f"holding the last complete factor ({decision.reason.value if decision.reason else '?'}: " \
               f"{decision.detail})"
    if decision.fallback_applied:
        return f"fallback factor ({decision.reason.value if decision.reason else '?'}: {decision.detail})"
    v = decision.throttling_volume
    if v is None:
        return "every volume above the soft limit"
    if v.offline:
        return f"broker {v.broker_id} log dir {v.log_dir} is offline (counted as full)"
    where = (f"local volume {v.log_dir}" if v.broker_id == LOCAL_BROKER
             else f"broker {v.broker_id} log dir {v.log_dir}")
    return (f"{where} has {v.usable_bytes} of {v.total_bytes} bytes "
            f"available (ratio {v.available_ratio:.4f}); soft {limits.soft.describe()}, "
            f"hard {limits.hard.describe()}")


class StorageCollector(Collector):
    def __init__(self, poller: StoragePoller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        p = self._poller
        factor = GaugeMetricFamily("sluice_storage_throttle_factor",
                                   "Storage throttle factor applied to produce quotas (1: none, 0: stopped)")
        factor.add_metric([], p.factor)
        applied = GaugeMetricFamily("sluice_storage_fallback_active",
                                    "1 while the fallback factor applies, by reason", labels=["reason"])
        fallbacks = CounterMetricFamily("sluice_storage_fallback_applied",
                                        "Polls whose view was incomplete, so the fallback factor applied",
                                        labels=["reason"])
        d = p.decision
        current = d.reason.value if d is not None and d.reason is not None and d.fallback_applied else None
        for reason in FallbackReason:
            fallbacks.add_metric([reason.value], p.fallbacks.get(reason.value, 0))
            applied.add_metric([reason.value], 1.0 if current == reason.value else 0.0)
        throttling = GaugeMetricFamily("sluice_storage_throttling_volume",
                                       "1 for the volume that most severely breaches a limit",
                                       labels=["broker", "log_dir"])
        vol = p.decision.throttling_volume if p.decision is not None else None
        if vol is not None:
            throttling.add_metric([_broker(vol.broker_id), vol.log_dir], 1.0)
        brokers = GaugeMetricFamily("sluice_storage_active_brokers", "Brokers considered by the last poll")
        brokers.add_metric([], p.active_brokers)
        dirs = GaugeMetricFamily("sluice_storage_active_log_dirs", "Log dirs with sizes in the last poll")
        dirs.add_metric([], len(p.volumes))
        avail = GaugeMetricFamily("sluice_storage_volume_available_bytes", "Usable bytes per volume",
                                  labels=["broker", "log_dir"])
        ratio = GaugeMetricFamily("sluice_storage_volume_available_ratio", "Usable / total bytes per volume",
                                  labels=["broker", "log_dir"])
        for v in p.volumes:
            avail.add_metric([_broker(v.broker_id), v.log_dir], v.usable_bytes)
            ratio.add_metric([_broker(v.broker_id), v.log_dir], v.available_ratio)
        polls = CounterMetricFamily("sluice_storage_polls", "Storage polls done")
        polls.add_metric([], p.polls)
        held = GaugeMetricFamily("sluice_storage_factor_held",
                                 "1 while an incomplete view keeps the last complete factor")
        held.add_metric([], 1.0 if d is not None and d.held else 0.0)
        offline = GaugeMetricFamily("sluice_storage_offline_log_dirs",
                                    "Log dirs the brokers report offline (counted as full)")
        offline.add_metric([], sum(1 for v in p.volumes if v.offline))
        yield from (factor, applied, fallbacks, throttling, brokers, dirs, avail, ratio, polls, held, offline)


def _broker(broker_id: int) -> str:
    return "local" if broker_id == LOCAL_BROKER else str(broker_id)
