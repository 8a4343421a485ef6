"""The canonical request model every other package reads: a request as an immutable chain of blocks in prefix order
(:mod:`._canonical`, :mod:`._build`), with what travels with it (raw JSON, token counts, volatility, the miss and
break cause names, :class:`~._plan.WirePlan`, provider rules, usage and totals, the four fields). No SDK and no
network; it imports no other agentcache package (only the leaf modules ``_exceptions`` and ``_log``)."""
