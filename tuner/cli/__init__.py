"""The `tuner` command. Each command group is a module of its own that registers its commands on `app`
(tuner/cli/common.py) as it is imported: `run` (one simulation), `sweep` (sweep and reproduce), `report`, `methods`
and `data`, in the order `tuner --help` lists them."""

# isort: off
from tuner.cli import run, sweep, report, methods, data  # noqa: F401

# isort: on
from tuner.cli.common import app

__all__ = ["app"]
