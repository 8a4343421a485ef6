"""prometheus_client's ``Counter``, ``Gauge`` and ``Histogram`` with :meth:`labels` memoised per tuple of label
values: the one place every agentcache instrument (:class:`~agentcache.PrometheusSink`, the proxy's
:class:`~agentcache.proxy._metrics.ProxyMetrics`) is made, so a turn's ~11 ``labels()`` calls are a dict lookup
each instead of prometheus_client's checks, ``str()`` of every value and its lock (~0.9 µs each, ~0.3 µs memoised).

The memo holds the children prometheus_client holds anyway (label values are bounded: see
:mod:`agentcache.session._metrics`), and only positional values of exact type ``str`` or ``int``: an ``int``
equal to a ``bool`` or ``float``, or a ``str`` equal to a ``str``-mixin enum member, would find another's entry
(prometheus_client labels ``True`` as ``"True"``, not ``"1"``), so those and keyword labels take the plain path.
Removing children (``remove``, ``remove_by_labels``, ``clear``) empties the memo.
"""

from __future__ import annotations

from typing import Any, Self

import prometheus_client
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["Counter", "Gauge", "Histogram"]


class _Memo(MetricWrapperBase):
    """:meth:`labels` memoised (see the module docstring); a base for the three instruments below."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._children: dict[tuple[object, ...], Self] = {}

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Self:
        """The child of these label values (as ``prometheus_client``'s ``labels``)."""
        if labelkwargs or not labelvalues:
            return super().labels(*labelvalues, **labelkwargs)
        for value in labelvalues:
            kind = type(value)
            if kind is not str and kind is not int:
                return super().labels(*labelvalues)
        child = self._children.get(labelvalues)
        if child is None:
            child = self._children[labelvalues] = super().labels(*labelvalues)
        return child

    def remove(self, *labelvalues: Any) -> None:
        self._children.clear()
        super().remove(*labelvalues)

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        self._children.clear()
        super().remove_by_labels(labels)

    def clear(self) -> None:
        self._children.clear()
        super().clear()


class Counter(_Memo, prometheus_client.Counter):
    """``prometheus_client.Counter`` with memoised :meth:`labels`."""


class Gauge(_Memo, prometheus_client.Gauge):
    """``prometheus_client.Gauge`` with memoised :meth:`labels`."""


class Histogram(_Memo, prometheus_client.Histogram):
    """``prometheus_client.Histogram`` with memoised :meth:`labels`."""
