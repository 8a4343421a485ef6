"""The instruments with memoised ``labels()`` (:mod:`agentcache.session._instruments`): the same children, series
and exposition as prometheus_client's own, values prometheus_client labels differently never mixed up, and
removed children never handed out again."""

from __future__ import annotations

from enum import Enum
from typing import Any

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from agentcache.session._instruments import Counter, Gauge, Histogram  # noqa: E402


class _Mixed(str, Enum):  # noqa: UP042 (equal to "a", labelled "_Mixed.A" by prometheus_client)
    A = "a"


def _pair(labels: list[str]) -> tuple[Counter, Any]:
    ours = Counter("c", "doc", labels, registry=prometheus_client.CollectorRegistry())
    plain = prometheus_client.Counter("c", "doc", labels, registry=prometheus_client.CollectorRegistry())
    return ours, plain


def test_the_same_series_as_prometheus_client() -> None:
    ours, plain = _pair(["route", "status"])
    calls: list[tuple[object, ...]] = [("/v1", 200), ("/v1", "200"), ("/v1", 200), ("/v1", True), ("/v1", 1),
                                       ("/v1", 1.0), ("/v1", _Mixed.A), ("/v1", "a"), ("/v1", "error")]  # fmt: skip
    for values in calls:
        ours.labels(*values).inc()
        plain.labels(*values).inc()
    ours.labels(route="/v2", status="ok").inc(2)
    plain.labels(route="/v2", status="ok").inc(2)
    got = {s.labels["status"]: s.value for m in ours.collect() for s in m.samples if s.name == "c_total"}
    want = {s.labels["status"]: s.value for m in plain.collect() for s in m.samples if s.name == "c_total"}
    assert got == want and got["True"] == 1 and got["1"] == 1 and got["200"] == 3 and got["_Mixed.A"] == 1


def test_a_child_is_memoised_and_forgotten_when_removed() -> None:
    ours, _ = _pair(["kind"])
    child = ours.labels("read")
    assert ours.labels("read") is child and ours.labels(kind="read") is child
    child.inc(5)
    ours.remove("read")
    assert ours.labels("read") is not child and ours.labels("read")._value.get() == 0
    ours.labels("read").inc()
    ours.clear()
    assert ours.labels("read")._value.get() == 0
    ours.labels("read").inc()
    ours.remove_by_labels({"kind": "read"})
    assert ours.labels("read")._value.get() == 0
    with pytest.raises(ValueError):
        ours.labels("read", kind="read")


def test_gauge_and_histogram_children() -> None:
    reg = prometheus_client.CollectorRegistry()
    gauge = Gauge("g", "doc", ["part"], registry=reg, multiprocess_mode="livesum")
    hist = Histogram("h", "doc", ["route"], registry=reg, buckets=(0.1, 1.0))
    gauge.labels("sessions").set(3)
    hist.labels("/v1").observe(0.5)
    assert gauge.labels("sessions") is gauge.labels("sessions") and hist.labels("/v1") is hist.labels("/v1")
    text = prometheus_client.generate_latest(reg).decode()
    assert 'g{part="sessions"} 3.0' in text and 'h_bucket{le="1.0",route="/v1"} 1.0' in text
