"""Explaining reuse: diagnose why a prefix broke or missed, repair what is equivalent, tally each arm's usage and
cost (the ledger behind ``audit`` and the live report), and render the report (terminal, JSON, HTML)."""
