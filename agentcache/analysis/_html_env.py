"""The one Jinja2 environment of the HTML audit reports: templates from ``agentcache/analysis/templates``,
autoescape on (prompt text, session and file names are escaped), an undefined value an error, and the number
filters every page uses (``num``, ``usd``, ``pct``, ``when``)."""

from __future__ import annotations

import datetime as dt
from functools import cache

from jinja2 import Environment, PackageLoader, StrictUndefined, Template, select_autoescape

from ._html_charts import usd

__all__ = ["template"]


@cache
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("agentcache.analysis", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = lambda n: f"{n:,}"
    env.filters["usd"] = usd
    env.filters["pct"] = lambda r: f"{r * 100:.1f}%"
    env.filters["when"] = when
    return env


def when(seconds: float | None) -> str:
    """Unix seconds as a UTC minute, ``2026-11-30 14:02`` (``—`` when unknown)."""
    if seconds is None:
        return "—"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M")


def template(name: str) -> Template:
    """The page template ``name`` of ``templates/``, in the one environment every report page shares (autoescape
    on, undefined values an error; filters ``num``, ``usd``, ``pct``, ``when``)."""
    return _environment().get_template(name)
