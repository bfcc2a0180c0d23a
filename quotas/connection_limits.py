"""Connection limits without I/O: who may connect, and how many bytes Sluice may hold.

* `ConnectionLimiter.admit(ip)` decides whether a new client connection is served, in Kafka's
  order (`SocketServer.ConnectionQuotas.inc`): the total slot (`max_connections`), then the
  per-IP creation rate (KIP-612's `connection_creation_rate` quota: the quota engine's verb
  `QuotaEngine.new_connection`, which returns a `ConnectionVerdict`), then the per-IP count
  (`max.connections.per.ip`). The answer is a frozen `ConnectionAdmission`; an admitted connection
  must be `release`d when it closes.
* `IpConnectionRates` is KIP-612's per-IP rate, held by the quota engine: one Kafka windowed
  `Rate` (`quotas.stats`) per IP,
  bounded by the IP's own `connection_creation_rate` or the ``<default>`` one (none: unlimited).
  Recording a connection that takes the rate over the bound gives Kafka's throttle time,
  ``(rate - bound) / bound x window``, capped at one window (``quota.window.size.seconds``), and the
  connection is un-recorded (Kafka counts only connections it accepts).
* `BufferBudget` is the total of bytes buffered for clients across connections, and which
  connections to pause when it is over its limit (the biggest holders first).

Everything takes `now_ms` from the caller (an injected clock), so tests never sleep.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from quotas.errors import QuotaConfigError, join_key
from quotas.fastpath import SampledRateImpl
from quotas.stats import RateConfig, SampledRate

#: The entity name of the per-IP default (`<default>`), as in Kafka's `ip` quota entity.
DEFAULT_IP = "<default>"

MAX_CONNECTIONS = "max_connections"
MAX_CONNECTIONS_PER_IP = "max_connections_per_ip"
CONNECTION_CREATION_RATE = "connection_creation_rate"


@dataclass(frozen=True, slots=True)
class ConnectionAdmission:
    """Whether a new connection is served; if not, why (the limit's config key) and, for the
    creation-rate quota, how long Kafka holds the socket before closing it and the quota (/s)."""

    allowed: bool
    reason: str | None = None
    throttle_ms: int = 0
    quota: float | None = None


ADMITTED = ConnectionAdmission(True)


@dataclass(frozen=True, slots=True)
class ConnectionVerdict:
    """`QuotaEngine.new_connection`'s answer for one new connection from an IP (KIP-612):
    `throttle_ms` > 0 means it is over the IP's `connection_creation_rate` (`bound`, per second)
    and is not counted (Kafka holds the socket that long, then closes it); `rate_per_s` is the IP's
    measured rate after the decision. `bound` None: the IP is unlimited."""

    throttle_ms: int
    rate_per_s: float
    bound: float | None

    @property
    def allowed(self) -> bool:
        return self.throttle_ms == 0


UNLIMITED_CONNECTION = ConnectionVerdict(0, 0.0, None)
NewConnection = Callable[[str], ConnectionVerdict]


class IpConnectionRates:
    """KIP-612: connections created per second, per client IP, against `connection_creation_rate`."""

    def __init__(self, rates_per_ip: Mapping[str, float], window: RateConfig | None = None) -> None:
        self._rates: dict[str, float] = {}
        self._default: float | None = None
        self.update(rates_per_ip)
        self._window = window if window is not None else RateConfig()
        self._sensors: dict[str, SampledRate] = {}
        self._last_ms: dict[str, int] = {}
        self._sweep_at_ms = 0

    def update(self, rates_per_ip: Mapping[str, float]) -> None:
        """New quotas (a reload); every IP's measured rate stays, as Kafka keeps its sensors and
        only changes their bound."""
        for ip, rate in rates_per_ip.items():
            if not rate > 0:
                raise ValueError(f"connection_creation_rate for ip {ip} must be > 0, got {rate}")
        rates = dict(rates_per_ip)
        self._default = rates.pop(DEFAULT_IP, None)
        self._rates = rates

    def configured(self) -> dict[str, float]:
        """The quotas in force, ``<default>`` included."""
        out = dict(self._rates)
        if self._default is not None:
            out[DEFAULT_IP] = self._default
        return out

    @property
    def enabled(self) -> bool:
        return self._default is not None or bool(self._rates)

    def quota_for(self, ip: str) -> float | None:
        """The IP's own quota, else the default one, else None (unlimited, as Kafka's Int.MaxValue)."""
        return self._rates.get(ip, self._default)

    def record(self, ip: str, now_ms: int) -> int:
        """Count one new connection from `ip`; the throttle time in ms (0: accepted and counted)."""
        bound = self.quota_for(ip)
        if bound is None:
            return 0
        self._sweep(now_ms)
        sensor = self._sensors.get(ip)
        if sensor is None:
            sensor = self._sensors[ip] = SampledRateImpl(self._window)
        self._last_ms[ip] = now_ms
        sensor.record(1.0, now_ms)
        total, window_ms = sensor.measure_parts(now_ms)
        rate = total / (window_ms / 1000.0)
        if rate <= bound:
            return 0
        # Kafka's QuotaUtils.boundedThrottleTime: Math.round (half up), at most one window
        throttle_ms = min(math.floor((rate - bound) / bound * window_ms + 0.5), self._window.window_ms)
        if throttle_ms > 0:
            sensor.record(-1.0, now_ms)  # Kafka un-records a connection it does not accept
        return throttle_ms

    def rate(self, ip: str, now_ms: int) -> float:
        sensor = self._sensors.get(ip)
        return 0.0 if sensor is None else sensor.measure(now_ms)

    @property
    def sensor_count(self) -> int:
        return len(self._sensors)

    def _sweep(self, now_ms: int) -> None:
        """Drop sensors idle for the whole retention (N x W): Kafka's purge would zero them anyway,
        so dropping them changes no decision and keeps memory bounded by recently seen IPs."""
        retention = self._window.retention_ms
        if now_ms < self._sweep_at_ms:
            return
        self._sweep_at_ms = now_ms + retention
        for ip in [ip for ip, last in self._last_ms.items() if now_ms - last >= retention]:
            del self._sensors[ip], self._last_ms[ip]


class ConnectionLimiter:
    """Open connections in total and per IP; the per-IP creation rate is the engine's verb
    (`new_connection`, None: no creation-rate quota)."""

    def __init__(self, max_connections: int, max_connections_per_ip: int,
                 new_connection: NewConnection | None = None,
                 per_ip_overrides: Mapping[str, int] | None = None) -> None:
        overrides = dict(per_ip_overrides or {})
        if max_connections < 1 or max_connections_per_ip < 1 or any(n < 0 for n in overrides.values()):
            raise ValueError("connection limits must be >= 1 (an override >= 0)")
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.per_ip_overrides = overrides  # Kafka's max.connections.per.ip.overrides (0: refuse all)
        self._new_connection = new_connection
        self._per_ip: dict[str, int] = {}
        self.total = 0

    def admit(self, ip: str) -> ConnectionAdmission:
        if self.total >= self.max_connections:
            return ConnectionAdmission(False, MAX_CONNECTIONS)
        if self._new_connection is not None:
            verdict = self._new_connection(ip)
            if not verdict.allowed:
                return ConnectionAdmission(False, CONNECTION_CREATION_RATE, verdict.throttle_ms,
                                           verdict.bound)
        count = self._per_ip.get(ip, 0)
        if count >= self.max_for(ip):
            return ConnectionAdmission(False, MAX_CONNECTIONS_PER_IP)
        self._per_ip[ip] = count + 1
        self.total += 1
        return ADMITTED

    def release(self, ip: str) -> None:
        """An admitted connection from `ip` closed."""
        count = self._per_ip.get(ip, 0)
        if count <= 0:
            raise ValueError(f"release of {ip} with no admitted connection")
        if count == 1:
            del self._per_ip[ip]
        else:
            self._per_ip[ip] = count - 1
        self.total -= 1

    def count(self, ip: str) -> int:
        return self._per_ip.get(ip, 0)

    def max_for(self, ip: str) -> int:
        """The IP's own count limit, else `max_connections_per_ip`."""
        return self.per_ip_overrides.get(ip, self.max_connections_per_ip)


@dataclass(frozen=True, slots=True)
class BudgetChange:
    """Connections (by key) whose broker side is to stop, or start again, being read."""

    pause: tuple[int, ...] = ()
    resume: tuple[int, ...] = ()


NO_CHANGE = BudgetChange()


class BufferBudget:
    """Bytes buffered for clients, summed over connections, against `max_total_bytes`.

    Each connection reports what it holds (`update`). While the total is over the limit, the
    biggest holder not yet paused is paused, one per report (a report follows every write, so
    growth stops at the connection that grows). Paused connections resume together once the total
    is down to `resume_bytes` (a quarter below the limit, so they do not flap). A connection's own
    report never pauses a connection that holds nothing.
    """

    def __init__(self, max_total_bytes: int) -> None:
        if max_total_bytes < 1:
            raise ValueError("max_total_bytes must be >= 1")
        self.max_total_bytes = max_total_bytes
        self.resume_bytes = max_total_bytes * 3 // 4
        self._held: dict[int, int] = {}
        self._paused: set[int] = set()
        self.total_bytes = 0

    def update(self, key: int, buffered_bytes: int) -> BudgetChange:
        before = self._held.get(key, 0)
        if buffered_bytes > 0:
            self._held[key] = buffered_bytes
        elif before:
            del self._held[key]
        self.total_bytes += buffered_bytes - before
        return self._decide()

    def remove(self, key: int) -> BudgetChange:
        self._paused.discard(key)
        return self.update(key, 0)

    def holders(self) -> list[int]:
        """Connections holding bytes (to refresh their reports)."""
        return list(self._held)

    def is_paused(self, key: int) -> bool:
        return key in self._paused

    def _decide(self) -> BudgetChange:
        if self.total_bytes > self.max_total_bytes:
            candidates = [(size, key) for key, size in self._held.items() if key not in self._paused]
            if not candidates:
                return NO_CHANGE
            _, biggest = max(candidates)
            self._paused.add(biggest)
            return BudgetChange(pause=(biggest,))
        if self._paused and self.total_bytes <= self.resume_bytes:
            resumed = tuple(sorted(self._paused))
            self._paused.clear()
            return BudgetChange(resume=resumed)
        return NO_CHANGE


def split_ip_entries(quotas: Mapping[str, object],
                     path: str = "quotas") -> tuple[dict[str, float], dict[str, object]]:
    """Take the `ip` entity entries out of the ``quotas:`` section: ``{ip: rate}`` (``<default>``
    included) and the section without them (for `QuotaConfig.from_dict`).

    An ip entry is ``{ip: "<default>" | ADDRESS, connection_creation_rate: N}``, Kafka's
    ``--entity-type ips`` with its only key, a whole number of connections per second >= 1.
    Raises `QuotaConfigError` naming every bad key.
    """
    entries = quotas.get("entries")
    if not isinstance(entries, list):
        return {}, dict(quotas)
    problems: list[tuple[str, str]] = []
    rates: dict[str, float] = {}
    rest: list[object] = []
    for i, raw in enumerate(entries):
        where = join_key(path, f"entries[{i}]")
        if not isinstance(raw, Mapping):
            rest.append(raw)
            continue
        if "ip" not in raw:
            if CONNECTION_CREATION_RATE in raw:
                problems.append((join_key(where, CONNECTION_CREATION_RATE),
                                 "applies only to an ip entry (Kafka's ip entity): "
                                 "{ip: \"<default>\" or an address, connection_creation_rate: N}"))
            else:
                rest.append(raw)
            continue
        problems.extend((join_key(where, str(key)), "unknown key for an ip entry (only "
                         "connection_creation_rate limits an ip)")
                        for key in raw if key not in ("ip", CONNECTION_CREATION_RATE))
        ip = _ip_name(raw["ip"], join_key(where, "ip"), problems)
        value = raw.get(CONNECTION_CREATION_RATE)
        key = join_key(where, CONNECTION_CREATION_RATE)
        if value is None:
            problems.append((key, "required for an ip entry"))
        elif isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            problems.append((key, f"must be a whole number of connections per second, got {value!r}"))
        elif value < 1:
            problems.append((key, f"must be >= 1, got {value!r}"))
        elif ip is not None:
            if ip in rates:
                problems.append((join_key(where, "ip"), f"duplicate ip {ip}"))
            rates[ip] = float(value)
    if problems:
        raise QuotaConfigError.of(problems)
    return rates, {**quotas, "entries": rest}


def canonical_ip(text: str) -> str:
    """One spelling per address: compressed IPv6, and an IPv4-mapped IPv6 address (a dual-stack
    socket's view of an IPv4 client) as its IPv4 form. Raises ValueError if `text` is no address."""
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _ip_name(value: object, key: str, problems: list[tuple[str, str]]) -> str | None:
    if value == DEFAULT_IP:
        return DEFAULT_IP
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return canonical_ip(value)
    except ValueError:
        problems.append((key, f"must be \"<default>\" or an IP address, got {value!r}"))
        return None
