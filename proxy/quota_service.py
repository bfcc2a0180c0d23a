"""The live side of the quota store: seeding at start, writes from admin requests, changes from
other instances, SIGHUP, all applied to the running `QuotaEngine` (sensors and their history
stay; only bounds change, as in Kafka).

The store's blocking calls run on one worker thread, one at a time, so a batch of changes is
validated and written in the order requests arrived. Results and the store's change notifications
come back to the event loop, which alone touches the quota managers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from protocol.quota_client import QuotaAdminError, QuotaClient, Stream
from protocol.sasl_client import SaslCredentials
from proxy.admin.store import QuotaStore, StoreError, open_store, reconcile_seed, table_from_described
from proxy.config import ProxyConfig
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from quotas.errors import QuotaConfigError
from quotas.table import QuotaChange, QuotaTable

log = logging.getLogger("sluice.quota_store")

P = ParamSpec("P")
T = TypeVar("T")


class QuotaService:
    def __init__(self, config: ProxyConfig, managers: QuotaEngine, store: QuotaStore | None = None) -> None:
        self._config = config
        self._managers = managers
        self._store = store
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="quota-store")
        self._loop: asyncio.AbstractEventLoop | None = None
        yaml = config.quota_config()
        self._shadow_all = yaml.shadow_all
        self._window = yaml.window
        self._rate_model = yaml.rate_model
        self._burst_ms = yaml.burst_ms
        self.table = QuotaTable()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> QuotaStore:
        assert self._store is not None, "QuotaService.start() first"
        return self._store

    def problems(self) -> list[str]:
        """Store records Sluice cannot read (their quotas are not applied), for `/healthz`."""
        if self._store is None:
            return []
        unreadable = sorted(self._store.unreadable().items())
        return [f"quota store: cannot read {name}: {why}" for name, why in unreadable]

    def unreadable(self) -> dict[str, str]:
        return {} if self._store is None else self._store.unreadable()

    async def start(self) -> None:
        """Open the store, seed it (see `reconcile_seed`), apply it, follow its changes."""
        self._loop = asyncio.get_running_loop()
        config = self._config
        try:
            if self._store is None:
                upstream = ",".join(str(a) for a in config.upstream.bootstrap)
                self._store = await self._run(open_store, config.store, upstream_bootstrap=upstream,
                                              instance=config.instance)
            imported = self._import_from_brokers if config.store.import_from_brokers else None
            seed = QuotaTable.from_config(config.quota_config())
            outcome = await self._run(reconcile_seed, self.store, seed, config.instance,
                                      reseed=config.store.reseed, imported=imported)
        except (StoreError, QuotaAdminError) as exc:
            # a clear line and exit status 2 rather than a traceback: nothing can run without quotas
            log.error("cannot start: %s", exc)
            raise SystemExit(2) from None
        log.info("%s (%s)", outcome.message, self.store.describe())
        self._set(outcome.table)
        self.store.subscribe(self._changed_elsewhere)

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def submit(self, changes: Sequence[QuotaChange]) -> asyncio.Future[QuotaTable]:
        """Write `changes` (one batch) to the store; the future's result is the table after them,
        already applied to the quota managers."""
        loop = asyncio.get_running_loop()
        written = loop.run_in_executor(self._executor, self.store.apply, list(changes))

        def applied(future: asyncio.Future[QuotaTable]) -> None:
            if not future.cancelled() and future.exception() is None:
                self._set_latest()

        written.add_done_callback(applied)
        return written

    async def reload(self, config: ProxyConfig) -> str:
        """SIGHUP: YAML entry edits go to the store as changes; `shadow` applies at once. The
        window and the store itself are fixed at start."""
        yaml = config.quota_config()
        self._config = config
        self._shadow_all = yaml.shadow_all
        self._rate_model = yaml.rate_model
        self._burst_ms = yaml.burst_ms
        seed = QuotaTable.from_config(yaml)
        outcome = await self._run(reconcile_seed, self.store, seed, config.instance)
        self._set(outcome.table, force=True)
        return outcome.message

    def schedule_reload(self, config: ProxyConfig) -> None:
        """`reload` in the background (SIGHUP handlers cannot wait); logs the outcome."""
        task = asyncio.get_running_loop().create_task(self._reload_and_log(config))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload_and_log(self, config: ProxyConfig) -> None:
        try:
            outcome = await self.reload(config)
        except Exception as exc:
            log.error("reload: quotas not updated, the running ones stay: %s", exc)
            return
        quotas = self.config()
        log.info("configuration reloaded: %s; %d quota entr%s%s", outcome, len(quotas),
                 "y" if len(quotas) == 1 else "ies", " (shadow mode for all)" if quotas.shadow_all else "")

    def _changed_elsewhere(self, table: QuotaTable) -> None:
        """Store callback, from any thread: the loop then applies the store's newest table (not
        `table`: notifications from different threads may arrive out of order)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._set_latest)

    def _set_latest(self) -> None:
        if self._store is not None:
            self._set(self._store.current())

    def _set(self, table: QuotaTable, *, force: bool = False) -> None:
        if table == self.table and not force:
            return
        previous = self.table
        self.table = table
        self._managers.update_config(self.config())
        self._managers.set_unit_entries(*self._units_of(table))
        self._managers.set_entity_shares(table.shares())
        if table != previous:
            log.info("quotas now: %d entit%s", len(table), "y" if len(table) == 1 else "ies")

    def config(self) -> QuotaConfig:
        """The enforcement view of the current table, with the YAML's global settings."""
        return self._config_of(self.table)

    def _config_of(self, table: QuotaTable) -> QuotaConfig:
        return table.to_config(shadow_all=self._shadow_all, window=self._window,
                               rate_model=self._rate_model, burst_ms=self._burst_ms)

    def _units_of(self, table: QuotaTable) -> tuple[QuotaConfig, QuotaConfig]:
        """The draft's units (``sluice.bps.*``, ``sluice.broker_bps.*``) of `table`, as budgets."""
        return table.unit_configs(shadow_all=self._shadow_all, window=self._window,
                                  rate_model=self._rate_model, burst_ms=self._burst_ms)

    def check_table(self, table: QuotaTable) -> str | None:
        """Why `table` cannot be enforced with the YAML's global settings, or None."""
        try:
            self._config_of(table)
            self._units_of(table)
            table.shares()
        except QuotaConfigError as exc:
            return str(exc)
        return None

    async def close(self) -> None:
        if self._store is not None:
            await self._run(self._store.close)
        self._executor.shutdown(wait=False)

    # ------------------------------------------------------------------ import

    def _import_from_brokers(self) -> QuotaTable:
        """DescribeClientQuotas (everything) on the upstream brokers, once, when seeding."""
        config = self._config
        upstream = ",".join(str(a) for a in config.upstream.bootstrap)
        sasl_cfg = config.store.import_sasl
        sasl = None if sasl_cfg is None else SaslCredentials(sasl_cfg.mechanism, sasl_cfg.username,
                                                             sasl_cfg.password.get_secret_value())
        with QuotaClient(upstream, upstream_connector(config.upstream.tls.context()), sasl=sasl,
                         client_id="sluice-import", software_name="sluice",
                         timeout_s=config.upstream.connect_timeout_ms / 1000) as client:
            described = client.describe()
        table = table_from_described([(d.entity, d.values) for d in described], "brokers' quotas")
        log.info("imported %d quota entit%s from the brokers", len(table), "y" if len(table) == 1 else "ies")
        return table


def upstream_connector(context: ssl.SSLContext | None) -> Callable[[str, int, float], Stream]:
    def connect(host: str, port: int, timeout_s: float) -> Stream:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        if context is None:
            return sock
        try:
            return context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise

    return connect
