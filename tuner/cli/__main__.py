"""`python -m tuner.cli`: the `tuner` command without its entry point (the tests' subprocesses)."""

from tuner.cli.common import app

app()
