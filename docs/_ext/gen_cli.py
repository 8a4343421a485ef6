"""Build-time page ``reference/cli.md`` (mkdocs-gen-files): Typer's own Markdown docs of the ``agentcache``
command line (``typer agentcache._cli utils docs``), so the reference lists exactly what ``--help`` does."""

import os
import subprocess
import sys

import mkdocs_gen_files

INTRO = """Every command and option, generated from the command line itself when the site is built (the same text as
`agentcache COMMAND --help`). The pages of each door explain what the options do together.

"""

TYPER_DOCS = ["-m", "typer", "agentcache._cli", "utils", "docs", "--name", "agentcache", "--title", "Command line"]

docs = subprocess.run(
    [sys.executable, *TYPER_DOCS],
    check=True,
    capture_output=True,
    text=True,
    env={**os.environ, "COLUMNS": "100", "NO_COLOR": "1"},
).stdout
title, _, rest = docs.partition("\n")
with mkdocs_gen_files.open("reference/cli.md", "w") as f:
    f.write(f"{title}\n\n{INTRO}{rest.lstrip()}")
