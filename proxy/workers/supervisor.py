"""`sluice proxy --workers N`: the supervisor process.

It serves no client itself. It starts N workers (`python -m proxy <its own arguments>`, with
`SLUICE_WORKER_INDEX` set: the child then runs as a plain worker), each of which listens on every
Sluice port with SO_REUSEPORT, so the kernel spreads new connections over them. The supervisor:

* picks the ports first when the configuration says port 0 (`proxy.workers.ports`);
* prints the single process's readiness line (`sluice ready: bootstrap ...`) once every worker
  has reported ready on its status pipe (`proxy.workers.status`);
* restarts a worker that dies, after a backoff (`RestartBackoff`), logging its exit status and
  counting it in `sluice_worker_restarts_total`; a worker that dies before the first readiness
  stops the whole start (bad store, port taken: the same failure would repeat);
* forwards SIGHUP (reload) and SIGTERM/SIGINT (drain) to every worker; after SIGTERM it exits 0
  once all have exited, killing stragglers after `drain_timeout_ms` and a grace period;
* serves `metrics.port`: `/metrics` is every worker's exposition merged with a `worker` label
  (`proxy.workers.merge`) plus its own families; `/healthz` is 503 unless every worker is up, else
  the workers' own answers combined (`proxy.ops.http.HealthReport`: 200, or 207 naming what is degraded);
  `/quotas/usage` is the workers' usage reports merged per sharing group
  (`quotas.headroom.merge_worker_reports`: rates summed, the limit the instance's part of the budget);
  `/quotas/effective` is every worker's limits in force for the caller, merged the same way
  (`quotas.headroom.merge_worker_limits`);
* runs the workers' relay for usage reports (`proxy.fleet.local.HubServer`), whose socket path
  each worker finds in `SLUICE_WORKER_HUB`.

Workers die with the supervisor: each asks the kernel for SIGTERM when its parent dies
(PR_SET_PDEATHSIG), so even a SIGKILLed supervisor leaves no worker behind (each drains and exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.admin.store import StoreError, prepare_store
from proxy.config import ConfigError, ProxyConfig
from proxy.fleet.local import ENV_HUB, ENV_INDEX, HubServer
from proxy.ops.connections import BearerToken, merge_workers
from proxy.ops.headroom import EFFECTIVE_PATH, USAGE_PATH, effective_doc, usage_json
from proxy.ops.http import HealthReport, MetricsEndpoint
from proxy.workers.merge import merge_expositions, render
from proxy.workers.policy import RestartBackoff, worker_argv
from proxy.workers.ports import Reservation, close_quietly, reserve_ports
from proxy.workers.status import ENV_LISTEN_PORT, ENV_STATUS_FD, WorkerStatus, announce_ready, parse_status
from quotas.headroom import (
    EffectiveLimit,
    UsageFormatError,
    UsageReport,
    merge_worker_limits,
    merge_worker_reports,
)

log = logging.getLogger("sluice.workers")

BROKER_SLOTS = 32  # per-broker ports reserved after an ephemeral bootstrap port: node ids 0..31
KILL_GRACE_S = 30.0  # after drain_timeout_ms: closing the access log, the store and the fleet may take 20 s
SCRAPE_TIMEOUT_S = 5.0


def _die_with_parent() -> None:  # in the child, between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    status: WorkerStatus | None = None
    started_monotonic: float = 0.0
    starts: int = 0
    restarts: int = 0
    last_delay_ms: int | None = None
    ever_ready: bool = False
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def up(self) -> bool:
        return self.process is not None and self.process.returncode is None and self.status is not None


class Supervisor:
    def __init__(self, config: ProxyConfig, argv: Sequence[str],
                 backoff: RestartBackoff | None = None) -> None:
        self.config = config
        self.argv = list(argv)
        self.backoff = backoff or RestartBackoff()
        self.workers = [Worker(i) for i in range(config.workers)]
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SupervisorCollector(self))
        self._reservation: Reservation | None = None
        self._listen_port = config.listen.port
        self._dir = private_dir(config.runtime_dir)
        self.hub = HubServer(self._dir / "hub.sock")
        self._metrics: MetricsEndpoint | None = None
        self._token: BearerToken | None = None  # GET /connections, here and on each worker
        self._all_ready = asyncio.Event()
        self._stopping = False
        self._done = asyncio.Event()
        self._exit_code = 0

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        if self.config.listen.port == 0:
            slots = BROKER_SLOTS if self.config.broker_port_base is None else 0
            self._reservation = reserve_ports(self.config.listen.host, slots)
            self._listen_port = self._reservation.port
        await self.hub.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        if self.config.metrics.port is not None:
            endpoint = self.config.connections_endpoint
            self._token = BearerToken.configured(endpoint)
            self._metrics = MetricsEndpoint(self.scrape, self.health, {USAGE_PATH: self.usage},
                                            connections=self.connections if endpoint.enabled else None,
                                            token=self._token, query_routes={EFFECTIVE_PATH: self.effective})
            await self._metrics.start(self.config.metrics.host, self.config.metrics.port)
            log.info("metrics of all workers on http://%s:%d/metrics", self.config.metrics.host,
                     self._metrics.port)
        log.info("starting %d workers", len(self.workers))
        for worker in self.workers:
            await self._start(worker)
        ready = asyncio.create_task(self._all_ready.wait())
        done = asyncio.create_task(self._done.wait())
        await asyncio.wait({ready, done}, return_when=asyncio.FIRST_COMPLETED)
        if self._all_ready.is_set() and not self._done.is_set():
            bootstrap = f"{self.config.advertised}:{self._listen_port}"
            log.info("all %d workers ready", len(self.workers))
            announce_ready(bootstrap)
        await done
        ready.cancel()
        await self._cleanup()
        return self._exit_code

    async def _start(self, worker: Worker) -> None:
        read_fd, write_fd = os.pipe()
        env = {**os.environ, ENV_INDEX: str(worker.index), ENV_HUB: str(self.hub.path),
               ENV_STATUS_FD: str(write_fd)}
        if self.config.listen.port == 0:
            env[ENV_LISTEN_PORT] = str(self._listen_port)
        argv = worker_argv(self.argv, worker.index, worker.starts == 0)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "proxy", *argv, env=env, pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        finally:
            os.close(write_fd)
        worker.process = process
        worker.status = None
        worker.starts += 1
        worker.started_monotonic = time.monotonic()
        log.info("worker %d started (pid %d)", worker.index, process.pid)
        self._spawn(worker, self._read_status(worker, process, read_fd))
        self._spawn(worker, self._watch(worker, process))

    def _spawn(self, worker: Worker, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        worker.tasks.add(task)
        task.add_done_callback(worker.tasks.discard)

    async def _read_status(self, worker: Worker, process: asyncio.subprocess.Process, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        try:
            while line := await reader.readline():
                status = parse_status(line)
                if status is not None and worker.process is process:
                    worker.status = status
                    worker.ever_ready = True
                    log.info("worker %d ready (pid %d)", worker.index, process.pid)
                    if all(w.status is not None for w in self.workers):
                        self._all_ready.set()
        finally:
            transport.close()

    async def _watch(self, worker: Worker, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        worker.status = None
        ran_ms = int((time.monotonic() - worker.started_monotonic) * 1000)
        if self._stopping:
            log.info("worker %d exited with status %d", worker.index, code)
            self._maybe_done()
            return
        if not worker.ever_ready and not self._all_ready.is_set():
            log.error("worker %d exited with status %d before it was ready; stopping", worker.index, code)
            self._exit_code = code if code > 0 else 1
            self._begin_stop(signal.SIGTERM)
            return
        delay_ms = self.backoff.delay_ms(worker.last_delay_ms, ran_ms)
        worker.last_delay_ms = delay_ms
        log.warning("worker %d (pid %d) died with %s after %.1f s; restarting in %d ms", worker.index,
                    process.pid, _describe_exit(code), ran_ms / 1000, delay_ms)
        await asyncio.sleep(delay_ms / 1000)
        if self._stopping:
            self._maybe_done()
            return
        worker.restarts += 1
        try:
            await self._start(worker)
        except OSError as exc:
            log.error("worker %d could not be restarted: %s", worker.index, exc)

    # ------------------------------------------------------------------ signals

    def _forward(self, sig: int) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(sig)
        if sig == signal.SIGHUP:
            log.info("SIGHUP forwarded to %d workers", len(self.workers))

    def _on_stop_signal(self, sig: int) -> None:
        log.info("shutting down: %s forwarded to every worker", signal.Signals(sig).name)
        self._begin_stop(sig)

    def _begin_stop(self, sig: int) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._forward(sig)
        asyncio.get_running_loop().call_later(
            self.config.drain_timeout_ms / 1000 + KILL_GRACE_S, self._kill_stragglers)
        self._maybe_done()

    def _kill_stragglers(self) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                log.warning("worker %d (pid %d) still running after the drain timeout: killed",
                            worker.index, worker.process.pid)
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()

    def _maybe_done(self) -> None:
        if all(w.process is None or w.process.returncode is not None for w in self.workers):
            self._done.set()

    async def _cleanup(self) -> None:
        if self._metrics is not None:
            await self._metrics.stop()
        await self.hub.close()
        close_quietly(self._reservation)
        shutil.rmtree(self._dir, ignore_errors=True)

    # ------------------------------------------------------------------ metrics endpoint

    async def _ask_workers(self, path: str, headers: dict[str, str] | None = None) -> dict[int, str | None]:
        """GET `path` from every worker's own endpoint at once: each worker's body, None for a
        worker that is down or does not answer in time."""
        up = [(w.index, w.status.metrics_port) for w in self.workers
              if w.up and w.status is not None and w.status.metrics_port is not None]
        bodies = await asyncio.gather(*(_http_get("127.0.0.1", port, path, headers) for _, port in up))
        found: dict[int, str | None] = {w.index: None for w in self.workers}
        found.update({index: body for (index, _), body in zip(up, bodies, strict=True)})
        return found

    async def scrape(self) -> bytes:
        """`/metrics`: every up worker's exposition merged, then the supervisor's own families."""
        found = await self._ask_workers("/metrics")
        expositions = {index: text for index, text in found.items() if text is not None}
        return render(merge_expositions(expositions), self.registry)

    async def usage(self) -> bytes:
        """`/quotas/usage`: every up worker's report, merged per sharing group (a worker that does
        not answer in time is left out; `workers` lists who answered per entry)."""
        reports: dict[int, UsageReport] = {}
        for index, text in (await self._ask_workers(USAGE_PATH)).items():
            if text is None:
                continue
            try:
                reports[index] = UsageReport.from_json(json.loads(text))
            except (ValueError, UsageFormatError) as exc:
                log.warning("worker %d: bad usage report: %s", index, exc)
        return usage_json(merge_worker_reports(reports, len(self.workers)))

    async def effective(self, args: Mapping[str, str]) -> bytes:
        """`/quotas/effective?...`: every up worker's limits in force for the caller, asked with the
        same query and merged per budget (`quotas.headroom.merge_worker_limits`: the instance's
        limit is the sum of its workers' shares of the budget; each worker's part is kept)."""
        path = EFFECTIVE_PATH + "?" + urllib.parse.urlencode(dict(args))
        answers: dict[int, list[EffectiveLimit]] = {}
        caller: dict[str, str] = {"user": args.get("user", ""), "client_id": args.get("client_id", "")}
        for index, text in (await self._ask_workers(path)).items():
            if text is None:
                continue
            try:
                doc = json.loads(text)
                answers[index] = [EffectiveLimit.from_json(x) for x in doc["limits"]]
                caller = {str(k): str(v) for k, v in doc["caller"].items()}
            except (ValueError, KeyError, TypeError, AttributeError, UsageFormatError) as exc:
                log.warning("worker %d: bad /quotas/effective answer: %s", index, exc)
        return effective_doc(caller, args.get("topic") or None, merge_worker_limits(answers),
                             len(self.workers))

    async def connections(self) -> bytes:
        """`/connections`: every worker's list, each entry with its `worker` (`merge_workers`)."""
        headers = {} if self._token is None else {"Authorization": self._token.header()}
        found: dict[int, bytes | str | None] = dict(await self._ask_workers("/connections", headers))
        return merge_workers(self.config.connections_endpoint.window_ms, found)

    def healthy(self) -> bool:
        return not self._stopping and all(w.up for w in self.workers)

    async def health(self) -> HealthReport:
        """503 unless every worker is up; otherwise every worker's own degraded reasons (its
        `/healthz`, 207), each named by its worker."""
        up = sum(w.up for w in self.workers)
        if not self.healthy():
            return HealthReport(False, unavailable=f"unavailable: {up}/{len(self.workers)} workers up")
        ports = [(w.index, w.status.metrics_port) for w in self.workers
                 if w.status is not None and w.status.metrics_port is not None]
        answers = await asyncio.gather(*(_http_status("127.0.0.1", port, "/healthz") for _, port in ports))
        degraded: list[str] = []
        for (index, _), answer in zip(ports, answers, strict=True):
            if answer is None:
                degraded.append(f"worker {index}: /healthz did not answer")
                continue
            code, body = answer
            if code == 207:
                degraded += [f"worker {index}: {line.removeprefix('degraded: ')}"
                             for line in body.splitlines() if line.strip()]
        return HealthReport(True, degraded=tuple(degraded))


class _SupervisorCollector(Collector):
    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        workers = self._supervisor.workers
        yield GaugeMetricFamily("sluice_workers", "Worker processes up (ready and running)",
                                value=sum(w.up for w in workers))
        yield GaugeMetricFamily("sluice_workers_configured", "Worker processes this instance runs",
                                value=len(workers))
        restarts = CounterMetricFamily("sluice_worker_restarts", "Workers restarted after they died",
                                       labels=["worker"])
        for w in workers:
            restarts.add_metric([str(w.index)], w.restarts)
        yield restarts


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit status {code}"


async def _http_get(host: str, port: int, path: str, headers: dict[str, str] | None = None) -> str | None:
    """The body of a worker's endpoint, or None when it does not answer in time (or not 200)."""
    answer = await _http_status(host, port, path, headers)
    if answer is None or answer[0] != 200:
        return None
    return answer[1]


async def _http_status(host: str, port: int, path: str,
                       headers: dict[str, str] | None = None) -> tuple[int, str] | None:
    """(status code, body) of a worker's endpoint, or None when it does not answer in time."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), SCRAPE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return None
    try:
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n{extra}\r\n".encode())
        data = await asyncio.wait_for(reader.read(), SCRAPE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    head, sep, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status_line) < 2 or not status_line[1].isdigit():
        return None
    return int(status_line[1]), body.decode("utf-8", "replace")


def private_dir(runtime_dir: Path | None) -> Path:
    """The supervisor's own directory (mode 0700, removed at exit) in `runtime_dir`, or in the
    system's temporary directory when it is not set. On a read-only root without a writable
    TMPDIR this fails at start naming the key that fixes it (`ConfigError`)."""
    try:
        return Path(tempfile.mkdtemp(prefix="sluice-workers-", dir=runtime_dir))
    except OSError as exc:
        where = str(runtime_dir) if runtime_dir is not None else "the temporary directory (TMPDIR, /tmp)"
        reason = exc.strerror or str(exc)
        raise ConfigError(f"runtime_dir: cannot create the workers' directory in {where}: {reason}; "
                          f"workers: > 1 needs a writable directory (on a read-only root, mount one, "
                          f"e.g. an emptyDir, and set runtime_dir to it)") from None


def supervise(config: ProxyConfig, argv: Sequence[str]) -> int:
    """Run the supervisor until every worker has exited; the process's exit status."""
    try:
        prepare_store(config.store)
        supervisor = Supervisor(config, argv)
    except ConfigError as exc:
        log.error("sluice: %s", exc)
        return 2
    except StoreError as exc:
        log.error("sluice: cannot start: %s", exc)
        return 2
    return asyncio.run(supervisor.run())
