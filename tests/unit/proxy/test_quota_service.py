"""The live side of the store: seeding at start, writes, changes from elsewhere, SIGHUP, failures."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from proxy.admin.store import MemoryStore
from proxy.config import ProxyConfig
from proxy.quota_service import QuotaService
from quotas import DEFAULT, ClientIdentity, QuotaEntity, QuotaKind
from quotas.clock import FakeClock
from quotas.engine import QuotaEngine
from quotas.table import SHADOW_KEY, QuotaChange

ALICE = QuotaEntity(user="alice")
ANY_CLIENT = QuotaEntity(client_id=DEFAULT)
CALLER = ClientIdentity("alice", "app")


def config(entries: list[dict[str, Any]], shadow: bool = False, **extra: Any) -> ProxyConfig:
    quotas = {"window": {"samples": 11, "size_ms": 500}, "entries": entries, "shadow": shadow}
    return ProxyConfig.model_validate({"upstream": {"bootstrap": "127.0.0.1:1"}, "instance": "unit",
                                       "quotas": quotas, **extra})


def bound(managers: QuotaEngine, kind: QuotaKind = QuotaKind.PRODUCE) -> float | None:
    return managers.for_broker(1).check(kind, CALLER).bound


async def started(entries: list[dict[str, Any]], store: MemoryStore | None = None,
                  **extra: Any) -> tuple[QuotaService, QuotaEngine, MemoryStore]:
    cfg = config(entries, **extra)
    managers = QuotaEngine(cfg.quota_config(), FakeClock(0))
    store = store or MemoryStore()
    service = QuotaService(cfg, managers, store)
    await service.start()
    return service, managers, store


async def test_start_seeds_and_applies_the_window_and_shadow_of_the_yaml() -> None:
    service, managers, store = await started([{"client_id": "<default>", "producer_byte_rate": 1000}])
    assert store.load() == {ANY_CLIENT: {"producer_byte_rate": 1000.0}}
    assert bound(managers) == 1000.0
    assert service.config().window.window_ms == 500
    await service.close()


async def test_writes_reach_the_live_sensors_which_keep_their_history() -> None:
    service, managers, _ = await started([{"client_id": "<default>", "producer_byte_rate": 1000}])
    manager = managers.for_broker(1)
    manager.record_and_check(QuotaKind.PRODUCE, CALLER, 50_000)
    table = await service.submit([QuotaChange(ANY_CLIENT, "producer_byte_rate", 2000.0),
                                  QuotaChange(ALICE, "request_rate", 5.0),
                                  QuotaChange(ALICE, SHADOW_KEY, 1.0)])
    assert table == service.table
    decision = manager.check(QuotaKind.PRODUCE, CALLER)
    assert decision.bound == 2000.0 and decision.observed > 0  # the same sensor, its samples kept
    rate = manager.check(QuotaKind.REQUEST_RATE, ClientIdentity("alice", "x"))
    assert rate.bound == 5.0 and rate.shadow
    await service.close()


async def test_changes_made_elsewhere_are_applied_on_the_loop() -> None:
    service, managers, store = await started([])
    change = QuotaChange(ANY_CLIENT, "producer_byte_rate", 42.0)
    thread = threading.Thread(target=store.apply, args=([change],))
    thread.start()
    thread.join()
    for _ in range(50):
        if bound(managers) == 42.0:
            break
        await asyncio.sleep(0.01)
    assert bound(managers) == 42.0 and ANY_CLIENT in service.table
    await service.close()


async def test_sighup_applies_yaml_edits_and_the_shadow_switch() -> None:
    service, managers, _ = await started([{"client_id": "<default>", "producer_byte_rate": 1000}])
    await service.submit([QuotaChange(ALICE, "producer_byte_rate", 7.0)])
    message = await service.reload(config([{"client_id": "<default>", "producer_byte_rate": 3000}]))
    assert "1 change(s) written" in message
    assert service.table == {ANY_CLIENT: {"producer_byte_rate": 3000.0}, ALICE: {"producer_byte_rate": 7.0}}
    await service.reload(config([{"client_id": "<default>", "producer_byte_rate": 3000}], shadow=True))
    assert service.config().shadow_all
    assert managers.for_broker(1).check(QuotaKind.PRODUCE, ClientIdentity("bob", "x")).shadow
    await service.close()


async def test_a_store_that_cannot_open_stops_the_start_with_a_clear_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg = config([], store={"path": str(blocker / "q.db")})
    service = QuotaService(cfg, QuotaEngine(cfg.quota_config(), FakeClock(0)))
    with pytest.raises(SystemExit) as exit_info:
        await service.start()
    assert exit_info.value.code == 2
    assert "cannot start: cannot open the quota store" in caplog.text
