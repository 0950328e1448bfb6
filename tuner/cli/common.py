"""What the `tuner` command's groups share: the app they register on, how a user's mistake ends, the options' help,
and how a run's settings are resolved from what was typed."""

from __future__ import annotations

import errno
import functools
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from tuner.data.datasets import LOADERS
from tuner.data.partition import PARTITIONS
from tuner.errors import UserError
from tuner.files import load_yaml, user_path
from tuner.settings.config import RunConfig, parse_set, resolve_layers

app = typer.Typer(
    help="Hyperparameter search for personalized federated learning.", no_args_is_help=True, add_completion=False
)
data_app = typer.Typer(help="Look at datasets and partitions.", no_args_is_help=True)
app.add_typer(data_app, name="data")
console = Console()
err = Console(stderr=True)


def user_errors(fn):
    """A user's mistake ends with one sentence and a non-zero exit, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:  # the message is text: a range written [low, high] is not markup
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(e.exit_code) from None
        except OSError as e:  # a full disk, a folder that went read-only or away: what was written stays
            if e.filename is None:
                raise
            said = (
                f"cannot write or read {e.filename} ({e.strerror}); {io_advice(e)}, and the files written "
                "before stay whole (every write replaces a file at once)."
            )
            err.print(f"[bold red]error:[/] {escape(said)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:  # a command without a stop of its own (run and sweep have theirs)
            err.print("Stopped (Ctrl-C); every file written before stays whole.", markup=False, highlight=False)
            raise typer.Exit(130) from None

    return wrapper


def io_advice(e: OSError) -> str:
    """What to fix for a failed read or write, from its cause: a full disk is not a missing folder."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space or choose another folder"
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
        return "a folder on that path does not exist or is not a folder: fix the path"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "choose a folder you may write to"
    return "check that path"


def absolute(value):
    """Typer callback for every path option: relative, absolute and `~` paths work from any directory."""
    if value is None:
        return None
    return [user_path(v) for v in value] if isinstance(value, (list, tuple)) else user_path(value)


# Option help is one line, written once; a command's epilog (after its options in --help) and docs/ say the rest.
METHOD_HELP = "A method or variant (`tuner methods`), or your own as path/to/file.py:ClassName."
DATASET_HELP = "A built-in dataset or your own data's path (below) \\[default: fmnist]."
PARTITION_HELP = f"{', '.join(k.help.split(' (')[0] for k in PARTITIONS.values())} (below) \\[default: dir:0.1]."
DATA_EPILOG = (
    f"Datasets: {', '.join(LOADERS)}; your own: a .parquet or .npz file (x, y, optionally client and split) or "
    "PFLlib's train/ and test/ folders (docs/own_code.md). "
    f"Partitions: {'; '.join(k.help for k in PARTITIONS.values())}."
)
GPUS_HELP = (
    "GPUs a trial, fractional to share one \\[default: 0.5 where the cluster has GPUs (docs/performance.md), else 0]."
)
ADDRESS_HELP = "Join a running Ray cluster (auto, or HEAD_IP:6379) instead of starting a local one."
VERBOSE_HELP = "Show Ray's own logs and trial tables."
SET_HELP = (
    "Any other run setting or method hyperparameter, as name=value (repeatable): lr, batch_size, "
    "local_epochs, join_ratio, eval_gap, backbone, seed, executor, device, val_frac, shift, mu, ..."
)


def make_config(
    method: str, config: Path | None, options: dict, sets: list[str], tuned: str | None = None
) -> RunConfig:
    """The resolved run: tuned settings, a YAML file, then the options typed, then --set, each value blamed on where
    it was typed."""
    typed = parse_set(sets)
    layers = []
    if tuned is not None:
        from tuner.plugins import method_class
        from tuner.settings.tuned_files import changed_space, read_tuned

        layers.append(read_tuned(method_class(method).name, tuned, {**options, **typed}))
        note = changed_space(layers[-1][0])
        if note:
            err.print(note, markup=False, highlight=False, soft_wrap=True)
    layers += [(str(config), load_yaml(config))] if config is not None else []
    layers += [(f"--{name}", {name: value}) for name, value in options.items() if value is not None]
    return resolve_layers(method, layers + [("--set", typed)])


def at_least(option: str, value: int | None, low: int) -> None:
    """A number typed on the command line, checked where it was typed."""
    if value is not None and value < low:
        raise UserError(f"{option} must be at least {low}, not {value}.")
