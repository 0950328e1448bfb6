"""pFL tuner: federated simulations, hyperparameter sweeps and paper tables."""

import sys


def main() -> None:
    """The `tuner` command. Starting takes seconds (torch's import): a Ctrl-C then is one line, not a traceback."""
    try:
        from tuner.cli import app
    except KeyboardInterrupt:
        sys.stderr.write("Stopped (Ctrl-C) while starting; nothing was run or written.\n")
        raise SystemExit(130) from None
    app()
