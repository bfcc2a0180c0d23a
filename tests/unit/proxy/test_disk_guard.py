"""The storage poller (local volumes, a failed poll), its metrics and its configuration."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from protocol.log_dirs import describe_log_dirs_frame, metadata_frame, parse_log_dirs
from proxy.config import ConfigError, load_config
from proxy.ops.disk_guard import StorageCollector, StorageConfig, StoragePoller
from quotas.entity import DEFAULT, QuotaKind
from quotas.storage import FallbackReason, volume_factor


class Scaler:
    def __init__(self) -> None:
        self.calls: list[tuple[QuotaKind, float]] = []

    def set_limit_scale(self, kind: QuotaKind, factor: float, /) -> None:
        self.calls.append((kind, factor))

    def set_storage_base_rate(self, rate: float | None, /) -> None:
        self.base_rate = rate


def local(tmp_path: Path, **limits: Any) -> StorageConfig:
    return StorageConfig(source="local", paths=[tmp_path],
                         limits=[{"type": "available_bytes_below", **limits}])


async def test_local_volume_above_and_below_the_limits(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    scaler = Scaler()
    poller = StoragePoller(local(tmp_path, hard=max(1, free // 4)), scaler, [])
    decision = await poller.poll_once()
    assert decision.factor == 1.0 and decision.throttling_volume is None
    assert scaler.calls == [(QuotaKind.PRODUCE, 1.0)]
    # a hard limit well above the free space: production stops, the volume is named
    poller.reconfigure(local(tmp_path, hard=free * 4))
    decision = await poller.poll_once()
    assert decision.factor == 0.0
    assert decision.throttling_volume is not None and decision.throttling_volume.log_dir == str(tmp_path)
    assert scaler.calls[-1] == (QuotaKind.PRODUCE, 0.0)
    registry = CollectorRegistry()
    registry.register(StorageCollector(poller))
    text = generate_latest(registry).decode()
    assert "sluice_storage_throttle_factor 0.0" in text
    assert f'sluice_storage_throttling_volume{{broker="local",log_dir="{tmp_path}"}} 1.0' in text
    assert "sluice_storage_active_log_dirs 1.0" in text
    assert "sluice_storage_active_brokers 1.0" in text


async def test_soft_band_is_linear_on_a_real_volume(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    # soft far above, hard at 0 bytes... hard must be > 0: 1 byte; factor ~ free / soft
    poller = StoragePoller(local(tmp_path, soft=free * 2, hard=1), Scaler(), [])
    decision = await poller.poll_once()
    assert decision.factor == pytest.approx(0.5, abs=0.01)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_cluster_gives_the_fallback_with_the_reason() -> None:
    cfg = StorageConfig(limits=[{"type": "available_ratio_below", "hard": 0.01}], fallback_factor=0.25,
                        timeout_ms=2000)
    scaler = Scaler()
    poller = StoragePoller(cfg, scaler, [("127.0.0.1", closed_port())], connect_timeout_s=1)
    decision = await poller.poll_once()
    assert (decision.factor, decision.reason) == (0.25, FallbackReason.POLL_FAILED)
    assert "no bootstrap server answered" in decision.detail
    assert scaler.calls == [(QuotaKind.PRODUCE, 0.25)]
    registry = CollectorRegistry()
    registry.register(StorageCollector(poller))
    text = generate_latest(registry).decode()
    assert 'sluice_storage_fallback_applied_total{reason="poll_failed"} 1.0' in text
    assert 'sluice_storage_fallback_active{reason="poll_failed"} 1.0' in text
    assert "sluice_storage_throttle_factor 0.25" in text


def test_frames_encode_and_bad_replies_are_protocol_errors() -> None:
    assert metadata_frame(1)[4:6] == b"\x00\x03"
    assert describe_log_dirs_frame(2)[4:8] == b"\x00\x23\x00\x04"
    with pytest.raises(Exception, match="correlation"):
        parse_log_dirs(b"\x00\x00\x00\x07" + b"\x00" * 8, 8)


def write(tmp_path: Path, storage: dict[str, Any]) -> Path:
    import yaml

    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump({"upstream": {"bootstrap": "127.0.0.1:9092"}, "storage": storage}))
    return path


@pytest.mark.parametrize(("storage", "key"), [
    ({"limits": [{"type": "available_bytes_below", "hard": 10},
                 {"type": "available_ratio_below", "hard": 0.1}]}, "storage.limits[1].hard"),
    ({"limits": [{"type": "available_bytes_below", "soft": 10}]}, "storage.limits"),
    ({"limits": [{"type": "available_ratio_below", "soft": 0.01, "hard": 0.05}]}, "storage.limits[0].soft"),
    ({"source": "local", "limits": [{"type": "available_bytes_below", "hard": 10}]}, "storage.paths"),
    ({"paths": ["/"], "limits": [{"type": "available_bytes_below", "hard": 10}]}, "storage.paths"),
    ({"fallback_factor": 2, "limits": [{"type": "available_bytes_below", "hard": 10}]},
     "storage.fallback_factor"),
    ({"check_interval_ms": 0, "limits": [{"type": "available_bytes_below", "hard": 10}]},
     "storage.check_interval_ms"),
    ({"applies_to": "all", "limits": [{"type": "available_bytes_below", "hard": 10}]},
     "storage.base_producer_byte_rate"),
    ({"base_producer_byte_rate": 100, "limits": [{"type": "available_bytes_below", "hard": 10}]},
     "storage.base_producer_byte_rate"),
])
def test_invalid_storage_config_is_rejected_naming_the_key(
        tmp_path: Path, storage: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        load_config(write(tmp_path, storage), environ={})


def test_cli_exits_2_with_the_key_on_stderr(tmp_path: Path) -> None:
    path = write(tmp_path, {"limits": [{"type": "available_bytes_below", "hard": 10},
                                       {"type": "available_ratio_below", "hard": 0.1}]})
    proc = subprocess.run([sys.executable, "-m", "proxy", "proxy", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "storage.limits[1].hard" in proc.stderr and "at most one hard limit" in proc.stderr


def test_valid_storage_config_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, {"check_interval_ms": 500, "fallback_factor": 0,
                                          "limits": [{"type": "available_ratio_below", "soft": 0.05},
                                                     {"type": "available_bytes_below", "hard": 10**9}]}),
                         environ={})
    assert config.storage is not None
    limits = config.storage.storage_limits()
    assert (limits.soft.value, limits.hard.value) == (0.05, 1e9)


def test_the_docs_example_is_a_valid_configuration(tmp_path: Path) -> None:
    docs = (Path(__file__).parents[3] / "docs" / "quotas.md").read_text()
    example = docs.split("## Storage-driven throttling", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "readme.yaml"
    path.write_text(example)
    config = load_config(path, environ={})
    assert config.storage is not None and config.storage.source == "describe_log_dirs"
    limits = config.storage.storage_limits()
    assert limits.soft.type.value == "available_ratio_below"
    assert limits.hard.type.value == "available_bytes_below"
    assert len(config.quota_config()) == 1


class FakeCluster:
    """Kafka brokers enough for the poller: Metadata lists `brokers`; DescribeLogDirs v4 returns
    a good dir, an offline dir and one without sizes (a pre-3.3 broker)."""

    def __init__(self) -> None:
        self.brokers: dict[int, int] = {}
        self.requests: list[tuple[int, int]] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> FakeCluster:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from kio.schema.describe_log_dirs.v4 import response as dld
        from kio.schema.errors import ErrorCode
        from kio.schema.metadata.v12 import response as md
        from kio.schema.types import BrokerId
        from kio.static.primitive import i32, i32Timedelta, i64

        from protocol.apis import response_header_version
        from protocol.encode import encode_response

        (size,) = struct.unpack(">i", await reader.readexactly(4))
        payload = await reader.readexactly(size)
        api_key, version, corr = struct.unpack_from(">hhi", payload)
        self.requests.append((api_key, version))
        body: Any
        if api_key == 3:
            body = md.MetadataResponse(
                throttle_time=i32Timedelta.parse(datetime.timedelta(0)), cluster_id="c",
                controller_id=BrokerId(1), topics=(),
                brokers=tuple(md.MetadataResponseBroker(node_id=BrokerId(n), host="127.0.0.1", port=i32(p),
                                                        rack=None) for n, p in self.brokers.items()))
        else:
            def result(d: str, total: int, usable: int, err: ErrorCode = ErrorCode.none) -> Any:
                return dld.DescribeLogDirsResult(error_code=err, log_dir=d, topics=(),
                                                 total_bytes=i64(total), usable_bytes=i64(usable))
            body = dld.DescribeLogDirsResponse(
                throttle_time=i32Timedelta.parse(datetime.timedelta(0)), error_code=ErrorCode.none,
                results=(result("/d1", 100, 30), result("/d2", -1, -1, ErrorCode.kafka_storage_error),
                         result("/d3", -1, -1)))
        out = encode_response(response_header_version(api_key, version), corr, body)
        writer.write(struct.pack(">i", len(out)) + out)
        await writer.drain()
        writer.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_describe_log_dirs_every_active_broker_and_fall_back_for_one_without_data() -> None:
    cluster = await FakeCluster().start()
    try:
        cluster.brokers = {1: cluster.port, 3: cluster.port}
        cfg = StorageConfig(limits=[{"type": "available_ratio_below", "soft": 0.5, "hard": 0.1}],
                            fallback_factor=0.25, factor_validity_ms=0)
        scaler = Scaler()
        poller = StoragePoller(cfg, scaler, [("127.0.0.1", cluster.port)])
        decision = await poller.poll_once()
        # /d1 has 30 of 100 bytes (factor 0.5), but /d2 is offline (KAFKA_STORAGE_ERROR): full, 0
        assert decision.factor == 0.0 and not decision.fallback_applied
        assert decision.throttling_volume is not None
        assert (decision.throttling_volume.broker_id, decision.throttling_volume.log_dir) == (1, "/d2")
        assert decision.throttling_volume.offline
        d1 = [v for v in poller.volumes if v.log_dir == "/d1"]
        assert len(d1) == 2 and volume_factor(d1[0], cfg.storage_limits()) == pytest.approx(0.5)
        assert (poller.active_brokers, len(poller.volumes)) == (2, 4)  # size-less dirs left out
        assert sorted(cluster.requests) == [(3, 12), (35, 4), (35, 4)]
        # broker 2 joins but cannot be reached: the view is incomplete; no validity window here,
        # and the last complete view stopped production: the fallback (0.25) does not lift it
        cluster.brokers[2] = closed_port()
        decision = await poller.poll_once()
        assert (decision.factor, decision.reason) == (0.0, FallbackReason.BROKER_WITHOUT_LOG_DIRS)
        assert "[2]" in decision.detail and "hard stop stays" in decision.detail
        assert scaler.calls == [(QuotaKind.PRODUCE, 0.0), (QuotaKind.PRODUCE, 0.0)]
        assert poller.fallbacks == {"broker_without_log_dirs": 1}
    finally:
        await cluster.close()


async def test_changes_are_logged_steady_polls_are_not(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    free = shutil.disk_usage(tmp_path).free
    poller = StoragePoller(local(tmp_path, hard=free * 4), Scaler(), [])
    with caplog.at_level("INFO", logger="sluice.storage"):
        for _ in range(3):
            await poller.poll_once()
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.storage"]
    assert len(lines) == 1
    assert lines[0].startswith(f"storage throttle factor (start) -> 0.000: local volume {tmp_path} has ")
    assert poller.polls == 3


async def test_applies_to_all_gives_clients_without_a_quota_the_scaled_base_rate(tmp_path: Path) -> None:
    from quotas import ClientIdentity, FakeClock, QuotaConfig, QuotaEntity, QuotaEntry
    from quotas.engine import QuotaEngine

    free = shutil.disk_usage(tmp_path).free
    quotas = QuotaEngine(QuotaConfig((QuotaEntry(QuotaEntity(user="alice"), {QuotaKind.PRODUCE: 1000.0}),)),
                           FakeClock(0))
    broker = quotas.for_broker(1)
    alice, bob = ClientIdentity("alice", "a"), ClientIdentity("bob", "b")
    cfg = StorageConfig(source="local", paths=[tmp_path], applies_to="all", base_producer_byte_rate=4000,
                        limits=[{"type": "available_bytes_below", "soft": free * 2, "hard": 1}])
    poller = StoragePoller(cfg, quotas, [])
    assert broker.check(QuotaKind.PRODUCE, bob).bound is None  # factor 1 until the first poll
    decision = await poller.poll_once()
    assert decision.factor == pytest.approx(0.5, abs=0.01)
    assert broker.check(QuotaKind.PRODUCE, alice).bound == pytest.approx(1000 * decision.factor)
    assert broker.check(QuotaKind.PRODUCE, bob).bound == pytest.approx(4000 * decision.factor)
    assert QuotaKind.PRODUCE in quotas.active_kinds
    assert quotas.config.get(QuotaEntity(client_id=DEFAULT)) is None  # what is configured stays as it was
    # the disk frees up: bob is unlimited again, alice back to her quota
    poller.reconfigure(cfg.model_copy(update={"limits": [{"type": "available_bytes_below", "hard": 1}]}))
    await poller.poll_once()
    assert broker.check(QuotaKind.PRODUCE, bob).bound is None
    assert broker.check(QuotaKind.PRODUCE, alice).bound == 1000.0
    # quota_clients (the default): bob is never limited
    plain = StoragePoller(StorageConfig(source="local", paths=[tmp_path], limits=cfg.limits), quotas, [])
    await plain.poll_once()
    quotas.set_limit_scale(QuotaKind.PRODUCE, 0.0)
    assert broker.check(QuotaKind.PRODUCE, bob).bound is None
    assert broker.check(QuotaKind.PRODUCE, alice).bound == 0.0


def test_small_moves_in_the_soft_band_are_not_logged() -> None:
    from proxy.ops.disk_guard import _worth_logging
    from quotas.storage import FactorDecision, VolumeUsage

    a = VolumeUsage(1, "/a", 100, 50)
    b = VolumeUsage(2, "/b", 100, 50)

    def at(f: float, v: VolumeUsage | None = a) -> FactorDecision:
        return FactorDecision(f, throttling_volume=v)

    assert _worth_logging(None, at(1.0))
    assert not _worth_logging(at(0.50), at(0.50))
    assert not _worth_logging(at(0.50), at(0.46))
    assert _worth_logging(at(0.50), at(0.45))
    assert _worth_logging(at(0.50), at(0.49, b))            # another volume throttles
    assert _worth_logging(at(0.02), at(0.0))                # production stops
    assert _worth_logging(at(0.99, None), at(1.0, None))    # production is free again
    assert _worth_logging(at(0.5), FactorDecision(0.5, True, FallbackReason.POLL_FAILED))
