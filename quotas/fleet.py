"""One budget across many enforcers: usage reports and shares, sans I/O.

Every Sluice process of a fleet (each worker of each instance) is a *member*. Every
`report_interval_ms` a member publishes a `UsageReport`: per sharing group (the manager's `scope`
label, such as a broker id, and the `SensorKey`) what it admitted over the last interval
(`used_per_s`, in the kind's unit per second) and whether it had to throttle (`constrained`: it
wants more than it has). Every member reads every report (`FleetView`) and enforces, locally and
with Kafka's windowed rate, ``limit x share``; the shares of the members that use a group sum to 1.

**Shares** are weighted max-min fair (water-filling) over the members *active* on the group (used
something in the interval, or throttled):

* a constrained member wants without bound; an unconstrained one wants what it used, plus
  `headroom` (20 %) so it can grow without first being throttled;
* the quota is filled in increasing order of want: each member gets ``min(want, what is left /
  members left)``; what nobody wants is split equally among the active members;
* a member that is *not* active on a group (it has a sensor but used nothing lately, or has never
  seen the group) holds a *standby* share of ``1 / live members``: a client that turns up there is
  served at once, not starved, and the others learn of it with the next report.

Over-admission happens only while shares move, by at most ``quota / members`` for about one
interval plus the exchange's delay per move: the standby share of a member that turns active, and
the share a member left to the others when its demand dropped, which they still hold for that long
after it comes back. Demand that keeps moving (a producer whose records spread over per-broker
budgets) keeps the shares moving, so its long-run rate can sit above the budget on a loaded machine.

A member's own entry is taken from its fresh local counters, never from its echoed report, so
its reaction to its own clients does not wait for the exchange. A member that has just become
active on a group keeps at most its standby share for `warmup_ms` (two report intervals): the
others' reports it holds are up to one interval old, so "nobody else is active" is not yet known;
without this, members whose clients start together would each take the whole quota at first.

**Staleness.** A member not heard from for `member_timeout_ms` *while the exchange was healthy*
has left: its share returns to the others at the next computation. "Healthy" needs evidence: the
member is dropped only once something (this member's own echo will do) has been received more than
the timeout after that member's last report, and after the exchange's return, more than the
timeout after the return. So a silent exchange freezes the membership rather than emptying it.

**Fallback.** While the exchange is down (nothing received, not even this member's own echo, for
`member_timeout_ms`, or the channel says so) every group's share is ``1 / n`` with ``n`` the frozen
member count (`FleetFallback.SPLIT`, the default: the fleet as a whole never admits more than one
budget), or 1 (`FleetFallback.FULL`: each member enforces the whole quota, failing open).

**Joining.** Until a member has heard the fleet (its own report came back through the exchange, so
every report published before it has been read), it holds ``1 / n`` of every group with ``n`` the
larger of `expected_members` and the members heard so far, counting itself: a restarted process
takes no more than its due before it knows the others. A group it then turns active on starts
without credit where others use it (`ShareDecision.busy`), and within its standby share.

**Making room for a newcomer.** The members already in the fleet see a member that joins (one
first heard after they joined themselves) before its clients do: it reports while it joins, and its
clients (a restarted instance's, reconnecting) arrive once it listens. It holds its standby share
``1 / n`` of every group from the start, so if the others kept their shares until its first report
of a group came back through the exchange, the fleet would hold ``1 + 1 / n`` of that group for one
report interval plus the exchange's delay. So for `join_grace_ms` after a newcomer is first heard,
every member counts it in each group it is active on as a peer wanting its standby share (unless
its reports show it active there already, when its real want counts). If its clients never come
for a group, the others hold ``1 / n`` less of it for that long.

**Report format** (`encode_report`): JSON, versioned by ``"v"``. Version 2 carries the whole
`SensorKey` as a fixed six-element array; a field added to the key is a new version. A report of
any other version is refused with `FleetReportVersionError` (the member counts it by reason and
logs it once): an old member's report is never read as a new one's.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quotas.entity import QuotaKind, SensorKey

#: Report format version (`"v"` in the JSON); a reader refuses reports of any other version.
#: 1: groups were ``[scope, kind, user, client_id, used, constrained]`` (no prefix or topic);
#: 2: groups are ``[scope, [kind, user, client_id, client_id_prefix, topic, topic_prefix], used,
#: constrained]``;
#: 3: the key also carries the callback's own tags (KIP-257's tag map), a 7th field
#: ``[[name, value], ...]``: a version-2 member would merge groups that differ only by them.
REPORT_VERSION = 3
#: The fields of a `SensorKey` on the wire, in order (version 3).
KEY_FIELDS = ("kind", "user", "client_id", "client_id_prefix", "topic", "topic_prefix", "tags")
DEFAULT_HEADROOM = 0.2


class FleetReportError(ValueError):
    """A payload that is not a usage report of this format."""

    reason = "malformed"


class FleetReportVersionError(FleetReportError):
    """A usage report of another format version (`version`): an older member's, or a newer one's."""

    def __init__(self, version: object) -> None:
        self.version = version
        old = type(version) is int and version < REPORT_VERSION
        self.reason = "old_version" if old else "unknown_version"
        super().__init__(f"a usage report of version {version!r}; this member reads version {REPORT_VERSION}")


class FleetFallback(enum.Enum):
    SPLIT = "split"   # 1 / last known member count: the fleet never exceeds one budget
    FULL = "full"     # each member enforces the whole quota (fails open)


@dataclass(frozen=True, slots=True)
class GroupUsage:
    """One sharing group in one member's report."""

    scope: str            # the manager's `broker` label: a broker id, "bootstrap", "all", "cluster"
    key: SensorKey
    used_per_s: float     # admitted over the last interval, per second, in the kind's unit
    constrained: bool     # throttled during the interval (it wants more than its share)


@dataclass(frozen=True, slots=True)
class UsageReport:
    fleet_id: str
    member: str
    seq: int
    interval_ms: int
    groups: tuple[GroupUsage, ...] = ()


def encode_report(report: UsageReport) -> bytes:
    """Compact JSON, version 3::

        {"v":2,"fleet":F,"member":M,"seq":N,"interval_ms":I,
         "groups":[[scope,[kind,user,client_id,client_id_prefix,topic,topic_prefix,[[tag,value],...]],
                    used_per_s,constrained],...]}

    ``used_per_s`` is rounded to 3 decimals; ``constrained`` is 0 or 1."""
    groups = [[g.scope, _encode_key(g.key), round(g.used_per_s, 3), 1 if g.constrained else 0]
              for g in report.groups]
    return json.dumps({"v": REPORT_VERSION, "fleet": report.fleet_id, "member": report.member,
                       "seq": report.seq, "interval_ms": report.interval_ms, "groups": groups},
                      separators=(",", ":")).encode()


def _encode_key(key: SensorKey) -> list[object]:
    return [key.kind.value, key.user, key.client_id, key.client_id_prefix, key.topic, key.topic_prefix,
            [list(tag) for tag in key.tags]]


_KINDS = {k.value: k for k in QuotaKind}


def _decode_key(raw: object) -> SensorKey:
    if not (isinstance(raw, list) and len(raw) == len(KEY_FIELDS)
            and all(isinstance(x, str) for x in raw[:-1]) and isinstance(raw[-1], list)
            and all(isinstance(t, list) and len(t) == 2 and all(isinstance(x, str) for x in t)
                    for t in raw[-1])):
        raise FleetReportError(f"bad key {raw!r}: want {KEY_FIELDS}, strings and [[name, value], ...]")
    kind = _KINDS.get(raw[0])
    if kind is None:
        raise FleetReportError(f"unknown quota kind {raw[0]!r}")
    tags = tuple(sorted((t[0], t[1]) for t in raw[-1]))
    return SensorKey(kind, raw[1], raw[2], raw[3], raw[4], raw[5], tags)


def decode_report(payload: bytes) -> UsageReport:
    """The inverse of `encode_report`. A report of another version raises
    `FleetReportVersionError`; anything else that is not a version-3 report, `FleetReportError`."""
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FleetReportError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or "v" not in raw:
        raise FleetReportError("not a usage report (no version)")
    if raw["v"] != REPORT_VERSION or type(raw["v"]) is not int:
        raise FleetReportVersionError(raw["v"])
    try:
        fleet_id, member, seq, interval_ms = raw["fleet"], raw["member"], raw["seq"], raw["interval_ms"]
        if not (isinstance(fleet_id, str) and isinstance(member, str) and type(seq) is int
                and type(interval_ms) is int and interval_ms > 0):
            raise FleetReportError("bad header fields")
        groups = []
        for g in raw["groups"]:
            if not (isinstance(g, list) and len(g) == 4):
                raise FleetReportError(f"bad group {g!r}")
            scope, key, used, constrained = g
            if not (isinstance(scope, str) and isinstance(used, int | float) and not isinstance(used, bool)
                    and math.isfinite(used) and used >= 0 and type(constrained) is int
                    and constrained in (0, 1)):
                raise FleetReportError(f"bad group {g!r}")
            groups.append(GroupUsage(scope, _decode_key(key), float(used), bool(constrained)))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, FleetReportError):
            raise
        raise FleetReportError(f"malformed report: {exc!r}") from None
    return UsageReport(fleet_id, member, seq, interval_ms, tuple(groups))


def water_fill(wants: Iterable[float]) -> list[float]:
    """Max-min fair shares of 1 for the given wants (fractions of the quota, `math.inf` for
    "as much as possible"), in the order given. What nobody wants is split equally."""
    wants = list(wants)
    n = len(wants)
    if n == 0:
        return []
    shares = [0.0] * n
    left = 1.0
    order = sorted(range(n), key=lambda i: wants[i])
    for pos, i in enumerate(order):
        give = min(wants[i], left / (n - pos))
        shares[i] = give
        left -= give
    if left > 1e-12:
        extra = left / n
        shares = [s + extra for s in shares]
    return shares


@dataclass(frozen=True, slots=True)
class ShareDecision:
    """Shares for one member at one moment: `shares` per (scope, key) where it is active,
    `standby` for every other group, the groups the others use, and why (for logs and metrics)."""

    shares: Mapping[tuple[str, SensorKey], float]
    standby: float
    members: int
    fallback: bool = False
    joining: bool = False   # this member has not heard the fleet yet
    #: groups other members are using (a sensor created here for one starts without credit)
    busy: frozenset[tuple[str, SensorKey]] = frozenset()


@dataclass(slots=True)
class _Heard:
    report: UsageReport
    received_ms: int


@dataclass(slots=True)
class FleetView:
    """What this member knows of the fleet: the newest report of every member, by receipt time."""

    fleet_id: str
    member: str
    member_timeout_ms: int
    headroom: float = DEFAULT_HEADROOM
    fallback_mode: FleetFallback = FleetFallback.SPLIT
    warmup_ms: int = 0
    join_grace_ms: int = 0
    _heard: dict[str, _Heard] = field(default_factory=dict)
    _newcomers: dict[str, int] = field(default_factory=dict)  # member -> first heard, after we joined
    _joined_ms: int | None = None
    _active_since: dict[tuple[str, SensorKey], int] = field(default_factory=dict)
    _last_any_ms: int | None = None
    _healthy_since_ms: int = 0
    _joined: bool = False
    _first_decide_ms: int | None = None
    _last_known_members: int = 1
    rejected: int = 0

    def expect_members(self, n: int) -> None:
        """The member count the fallback and a joining member split by until the fleet has been
        heard from."""
        self._last_known_members = max(1, n)

    @property
    def joined(self) -> bool:
        """This member's own report came back: every report published before it has been read."""
        return self._joined

    def receive(self, report: UsageReport, now_ms: int) -> bool:
        """Take a report (this member's own echo included). Reports of another fleet, or older
        than the newest already heard from that member, are ignored."""
        if report.fleet_id != self.fleet_id:
            self.rejected += 1
            return False
        if self.exchange_silent(now_ms):
            # the exchange is back (or heard for the first time): members' silence counts from now
            self._healthy_since_ms = now_ms
        self._last_any_ms = now_ms
        heard = self._heard.get(report.member)
        if report.member == self.member:
            if self._joined_ms is None:
                self._joined_ms = now_ms
            self._joined = True
        elif heard is None and self._joined_ms is not None and self.join_grace_ms > 0:
            self._newcomers[report.member] = now_ms  # it joins after us: its clients are coming
        if heard is not None and report.seq <= heard.report.seq:
            return False
        self._heard[report.member] = _Heard(report, now_ms)
        return True

    def live_members(self, now_ms: int) -> list[str]:
        """Members not known to have left (this member always counts); forgets those that have.

        A member has left when the exchange delivered something more than the timeout after its
        last report (and after the exchange's last return): silence the exchange itself may
        explain is not taken as leaving."""
        last_any = self._last_any_ms
        if last_any is not None:
            for name in [m for m, h in self._heard.items()
                         if last_any - max(h.received_ms, self._healthy_since_ms) > self.member_timeout_ms]:
                del self._heard[name]
        live = set(self._heard)
        live.add(self.member)
        return sorted(live)

    def exchange_silent(self, now_ms: int) -> bool:
        """Nothing at all received (not even our own echo) for the member timeout."""
        return self._last_any_ms is None or now_ms - self._last_any_ms > self.member_timeout_ms

    def newest_report_age_ms(self, now_ms: int) -> int | None:
        others = [h.received_ms for m, h in self._heard.items() if m != self.member]
        return None if not others else now_ms - max(others)

    def decide(self, own: Iterable[GroupUsage], limits: Mapping[tuple[str, SensorKey], float | None],
               now_ms: int, *, channel_up: bool = True) -> ShareDecision:
        """This member's shares. `own` is its fresh usage per group; `limits` the unshared limit of
        every group it has a sensor for (None: unlimited, share irrelevant)."""
        if self._first_decide_ms is None:
            self._first_decide_ms = now_ms
        silent = not channel_up or self.exchange_silent(now_ms)
        live = self.live_members(now_ms)  # frozen while silent: nobody left then
        others: dict[tuple[str, SensorKey], list[GroupUsage]] = {}
        active_on: dict[tuple[str, SensorKey], set[str]] = {}
        for name in live:
            if name == self.member:
                continue
            for g in self._heard[name].report.groups:
                if g.used_per_s > 0 or g.constrained:
                    others.setdefault((g.scope, g.key), []).append(g)
                    active_on.setdefault((g.scope, g.key), set()).add(name)
        busy = frozenset(others)
        newcomers = self._newcomers_now(live, now_ms)
        if silent or not self._joined:
            n = max(self._last_known_members, len(live))
            full = self.fallback_mode is FleetFallback.FULL
            if not self._joined and now_ms - self._first_decide_ms <= self.member_timeout_ms:
                # joining: its due until its own report comes back; once it has waited a whole
                # timeout for it, the exchange counts as down (FULL then fails open)
                return ShareDecision({}, 1.0 / n, n, joining=True, busy=busy)
            return ShareDecision({}, 1.0 if full else 1.0 / n, n, fallback=True, busy=busy)
        self._last_known_members = len(live)
        standby = 1.0 / len(live)
        shares: dict[tuple[str, SensorKey], float] = {}
        active_since: dict[tuple[str, SensorKey], int] = {}
        for mine in own:
            if mine.used_per_s <= 0 and not mine.constrained:
                continue
            group = (mine.scope, mine.key)
            since = active_since[group] = self._active_since.get(group, now_ms)
            limit = limits.get(group)
            if limit is None or limit <= 0:
                continue
            peers = others.get(group, [])
            wants = [self._want(g, limit) for g in (mine, *peers)]
            # a newcomer not active here yet: the standby share it holds, and its clients will use
            wants += [standby] * len(newcomers - active_on.get(group, set()))
            share = water_fill(wants)[0]
            if now_ms - since < self.warmup_ms:
                share = min(share, standby)
            shares[group] = share
        self._active_since = active_since
        return ShareDecision(shares, standby, len(live), busy=busy)

    def _newcomers_now(self, live: list[str], now_ms: int) -> set[str]:
        """Members that joined after this one within `join_grace_ms` and have not left; forgets
        the rest."""
        for name in [m for m, since in self._newcomers.items()
                     if now_ms - since >= self.join_grace_ms or m not in live]:
            del self._newcomers[name]
        return set(self._newcomers)

    def _want(self, g: GroupUsage, limit: float) -> float:
        return math.inf if g.constrained else g.used_per_s * (1.0 + self.headroom) / limit
