"""``python -m agentcache``: the same command line as the ``agentcache`` console script."""

from __future__ import annotations

from agentcache._cli import main

if __name__ == "__main__":
    main()
