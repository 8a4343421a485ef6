"""Audit report types and their JSON schema (documented in README.md, "Audit JSON").

``{"provider", "model", "totals": {ARM: METRICS}, "sessions": [{"session", "requests",
"arms": {ARM: METRICS}}], "breaks": [BREAK], "misses": [MISS], "models": [MODEL],
"provider_diagnostics": {"compared", "agree", "agreement", "misses": [PROVIDER_MISS]}}`` where METRICS is
``{requests, prompt_tokens, cache_read_tokens, cache_write_tokens, uncached_tokens, hit_rate, cost_usd}``,
MODEL ``{provider, model, known, priced_as, requests}`` (``known: false``: not in the price table, priced as
``priced_as``, the provider's default) and PROVIDER_MISS ``{session, request, provider, reason, missed_tokens,
ours, agrees}`` (:class:`ProviderMissRecord`). When the records carry the usage the provider reported, ARM includes
``reported`` (that usage, priced by the provider that served it), and, where the simulated ``as_sent`` arm models
that same provider, ``"simulator_error": {"arm", "error", "mean_abs_read_error", "requests": [{"session",
"request", "arm", "simulated", "reported", "error"}]}`` (:class:`SimErrorRecord`; error = simulated − reported).
When some requests carried no usage (an OpenAI Chat stream without ``stream_options.include_usage``), also
``"usage_not_reported": {"requests", "of"}``: the ``reported`` arm (its hit rate and cost) covers only the others.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .._exceptions import InputError
from ..model._totals import TokenTotals
from ..simulate import SimUsage

ARMS = ("as_sent", "agentcache", "ideal")


@dataclass(slots=True)
class ArmMetrics(TokenTotals):
    """Totals of one arm: token counts, ``hit_rate = cache_read_tokens / prompt_tokens``, and the
    input-side cost in USD (the METRICS object of the JSON schema)."""

    def add(self, u: SimUsage) -> None:
        """Accumulate one simulated request."""
        self.count(u)
        self.cost_usd += u.cost_usd

    def merge(self, other: ArmMetrics) -> None:
        """Add another arm's totals (a tenant's sessions summed)."""
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.uncached_tokens += other.uncached_tokens
        self.cost_usd += other.cost_usd

    def saved_against(self, base: ArmMetrics) -> tuple[float, float | None]:
        """USD this arm costs less than ``base`` (the ``as_sent`` arm in the reports' "saved" figure; negative when
        it costs more), and that as a share of ``base``'s cost (None when ``base`` cost nothing)."""
        diff = base.cost_usd - self.cost_usd
        return diff, (diff / base.cost_usd if base.cost_usd else None)


def saving_of(arm: str, metrics: ArmMetrics, base: ArmMetrics | None) -> tuple[float, float | None] | None:
    """The reports' "saved" figure of ``arm`` (:meth:`ArmMetrics.saved_against` ``base``, the ``as_sent`` arm), or
    None where there is none: for ``as_sent`` itself, and for ``reported``, which is the recorded truth rather than
    a strategy and covers only the requests that carried usage (a different set from the simulated arms')."""
    if base is None or arm in ("as_sent", "reported"):
        return None
    return metrics.saved_against(base)


@dataclass(frozen=True, slots=True)
class BreakRecord:
    """A request whose prefix diverges from what its session (or, for the static prefix, another
    session in the scope) sent before. ``request`` is the 0-based index within the session;
    ``tokens_lost`` the previously sent tokens that must be processed again; ``repaired`` whether the
    ``agentcache`` arm made the bytes identical again. ``against`` names the other session for a
    cross-session break (else None); ``volatile`` is the changed span for ``system.volatile``."""

    session: str
    request: int
    first_divergent: str | None
    cause: str
    tokens_lost: int
    repaired: bool
    against: str | None = None
    volatile: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON object (``against``/``volatile`` only when set)."""
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None or k == "first_divergent"}


@dataclass(frozen=True, slots=True)
class MissRecord:
    """A request where ``arm`` reused fewer tokens than it matched, for a cache-mechanics ``cause``.
    ``tokens_lost`` = matched − read. ``rejected``: the provider would refuse the request.
    ``where``: the block or field concerned, when one applies.

    From agents' own logs (reported usage, no bodies; :mod:`agentcache.analysis._inferred`) a miss is any loss of
    the prefix the session had cached, its cause may be a break's name, and it also carries ``inferred`` (the cause
    is what the log is consistent with, not a comparison of bytes), ``usd_lost`` (what the lost tokens cost beyond
    reading them) and ``detail`` (the evidence: ``"7m 12s pause > 5m TTL"``)."""

    session: str
    request: int
    arm: str
    cause: str
    tokens_lost: int
    rejected: bool = False
    where: str | None = None
    inferred: bool = False
    usd_lost: float | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON object (``inferred``, ``usd_lost`` and ``detail`` only for misses read from agents' logs)."""
        out = asdict(self)
        if self.usd_lost is None:
            for key in ("inferred", "usd_lost", "detail"):
                del out[key]
        else:
            out["usd_lost"] = round(self.usd_lost, 6)
        return out


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """A model the audited requests named: ``known`` when the price table has it (an id or listed alias), else
    priced as ``priced_as`` (the provider's default model); ``requests`` that named it."""

    provider: str
    model: str
    known: bool
    priced_as: str
    requests: int

    def to_dict(self) -> dict[str, Any]:
        """JSON object."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ProviderMissRecord:
    """A request the provider diagnosed as a cache miss, or agentcache did (a break): the provider's ``reason``
    (:mod:`agentcache.model._provider`) and its ``missed_tokens`` estimate, agentcache's cause for the same pair of
    requests (``ours``; None: it extended the one before) and whether the two ``agrees`` (None: the provider could
    not compare)."""

    session: str
    request: int
    provider: str
    reason: str
    missed_tokens: int | None
    ours: str | None
    agrees: bool | None

    def to_dict(self) -> dict[str, Any]:
        """JSON object."""
        return asdict(self)


def unreported(totals: dict[str, ArmMetrics], requests: int = 0) -> tuple[int, int] | None:
    """``(requests without reported usage, requests in all)`` when ``totals`` has a ``reported`` arm that misses
    some, else None. All requests: the most any arm counted, or ``requests`` (the sessions' sum) when more."""
    rep = totals.get("reported")
    if rep is None:
        return None
    total = max(requests, *(m.requests for m in totals.values()))
    return (total - rep.requests, total) if total > rep.requests else None


def provider_summary(misses: list[ProviderMissRecord]) -> dict[str, Any]:
    """The ``provider_diagnostics`` object: ``compared`` (misses where the provider could compare), ``agree``
    (of those, where its reason names agentcache's cause), ``agreement`` (agree / compared; None when nothing was
    compared) and the ``misses``."""
    compared = [m for m in misses if m.agrees is not None]
    agree = sum(1 for m in compared if m.agrees)
    return {
        "compared": len(compared),
        "agree": agree,
        "agreement": round(agree / len(compared), 6) if compared else None,
        "misses": [m.to_dict() for m in misses],
    }


@dataclass(frozen=True, slots=True)
class SimErrorRecord:
    """The simulator's error on one request: what ``arm`` (the simulated arm that models the cache which served
    the request, ``as_sent``) says it read and wrote, against the usage the provider reported for it. The
    ``error`` of each field is simulated − reported (tokens; USD for ``cost_usd``): positive when the simulator
    over-counts. Recorded traffic the loader had to rebuild (a placeholder system prompt, markers not recorded)
    counts as the simulator's error too: it is what the simulated arms stand on."""

    session: str
    request: int
    arm: str
    simulated: SimUsage
    reported: SimUsage

    def error(self) -> dict[str, Any]:
        """Simulated − reported, per field."""
        s, r = self.simulated, self.reported
        out: dict[str, Any] = {f: getattr(s, f) - getattr(r, f) for f in _TOKEN_FIELDS}
        out["cost_usd"] = round(s.cost_usd - r.cost_usd, 6)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON object: ``session``, ``request``, ``arm``, ``simulated``, ``reported`` (token fields and
        ``cost_usd``) and ``error``."""
        return {
            "session": self.session,
            "request": self.request,
            "arm": self.arm,
            "simulated": _usage_dict(self.simulated),
            "reported": _usage_dict(self.reported),
            "error": self.error(),
        }


_TOKEN_FIELDS = ("prompt_tokens", "cache_read_tokens", "cache_write_tokens", "uncached_tokens")


def _usage_dict(u: SimUsage) -> dict[str, Any]:
    out: dict[str, Any] = {f: getattr(u, f) for f in _TOKEN_FIELDS}
    out["cost_usd"] = round(u.cost_usd, 6)
    return out


def simulator_error_summary(records: list[SimErrorRecord]) -> dict[str, Any]:
    """The ``simulator_error`` object: the ``arm`` compared, the summed ``error`` over all ``requests`` (each
    :meth:`SimErrorRecord.to_dict`), and ``mean_abs_read_error`` (mean of |simulated − reported| cache-read
    tokens per request)."""
    total: dict[str, Any] = {f: 0 for f in _TOKEN_FIELDS}
    total["cost_usd"] = 0.0
    for r in records:
        for k, v in r.error().items():
            total[k] += v
    total["cost_usd"] = round(total["cost_usd"], 6)
    mean = sum(abs(r.error()["cache_read_tokens"]) for r in records) / len(records) if records else 0.0
    return {
        "arm": records[0].arm if records else None,
        "error": total,
        "mean_abs_read_error": round(mean, 3),
        "requests": [r.to_dict() for r in records],
    }


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One request of one session as each arm saw it (for per-turn charts and tests; not part of the
    JSON document). ``repairs``: the causes the ``agentcache`` arm repaired on this request;
    ``markers``: the block paths it put cache markers on; ``prepared``: the pipeline's full decision
    (:class:`agentcache.session.Prepared`: TTL choice, marker reasons...)."""

    session: str
    request: int
    at: float | None
    arms: dict[str, SimUsage]
    repairs: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    prepared: Any = None


@dataclass(slots=True)
class SessionReport:
    """Per-session metrics for each arm; ``parent`` (a subagent's parent session key) and ``lineage`` (its root's)
    when the door knows them (the proxy's live report, agents' logs), in the JSON only when set. From agents' logs
    also the ``client``, its ``project``, the ``model`` (or ``mixed``), when it ``started`` (unix seconds) and the
    USD its misses lost (``usd_lost``)."""

    session: str
    requests: int = 0
    arms: dict[str, ArmMetrics] = field(default_factory=lambda: {a: ArmMetrics() for a in ARMS})
    parent: str | None = None
    lineage: str | None = None
    client: str | None = None
    project: str | None = None
    model: str | None = None
    started: float | None = None
    usd_lost: float = 0.0
    #: the 0-based index of the session's last request recorded (not in the JSON)
    last: int = -1

    def to_dict(self) -> dict[str, Any]:
        """JSON object."""
        out: dict[str, Any] = {"session": self.session, "requests": self.requests}
        if self.parent is not None:
            out["parent"] = self.parent
        if self.lineage is not None and self.lineage != self.session:
            out["lineage"] = self.lineage
        for key in ("client", "project", "model", "started"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.client is not None:
            out["usd_lost"] = round(self.usd_lost, 6)
        out["arms"] = {a: m.to_dict() for a, m in self.arms.items()}
        return out


@dataclass(slots=True)
class AuditReport:
    """The result of an audit (see the module docstring for its JSON form). ``mode``: ``simulated`` (recorded
    requests with their bodies, replayed through simulated caches) or ``reported`` (agents' own logs: the usage
    the provider reported, the ``agentcache`` arm's what-if, causes inferred; then also ``sources``, ``causes`` and
    ``groups``: :mod:`agentcache.analysis._report_logs`). ``call_ids``: for requests rebuilt from an agent's log,
    ``(session, request)`` → the log's call id (not in the JSON: it links the two reports of one run)."""

    provider: str
    model: str
    totals: dict[str, ArmMetrics]
    sessions: list[SessionReport]
    breaks: list[BreakRecord]
    misses: list[MissRecord]
    turns: list[TurnRecord] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    models: list[ModelRecord] = field(default_factory=list)
    provider_misses: list[ProviderMissRecord] = field(default_factory=list)
    simulator_errors: list[SimErrorRecord] = field(default_factory=list)
    mode: str = "simulated"
    groups: dict[str, list[Any]] = field(default_factory=dict)
    causes: list[Any] = field(default_factory=list)
    sources: list[Any] = field(default_factory=list)
    spend: dict[str, float] = field(default_factory=dict)
    call_ids: dict[tuple[str, int], str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document, with exactly the documented top-level keys (``simulator_error`` only when the
        records carried usage reported by the cache the arms simulate)."""
        out = {
            "provider": self.provider,
            "model": self.model,
            "totals": {a: m.to_dict() for a, m in self.totals.items()},
            "sessions": [s.to_dict() for s in self.sessions],
            "breaks": [b.to_dict() for b in self.breaks],
            "misses": [m.to_dict() for m in self.misses],
            "models": [m.to_dict() for m in self.models],
            "provider_diagnostics": provider_summary(self.provider_misses),
        }
        if (missing := unreported(self.totals, sum(s.requests for s in self.sessions))) is not None:
            out["usage_not_reported"] = {"requests": missing[0], "of": missing[1]}
        if self.simulator_errors:
            out["simulator_error"] = simulator_error_summary(self.simulator_errors)
        if self.mode == "reported":  # agents' own logs: reported usage, causes inferred (docs/audit.md)
            out["mode"] = self.mode
            out["sources"] = [s.to_dict() for s in self.sources]
            out["spend"] = {k: round(v, 6) for k, v in self.spend.items()}
            out["causes"] = [c.to_dict() for c in self.causes]
            out["groups"] = {by: [row.to_dict() for row in rows] for by, rows in self.groups.items()}
        return out
