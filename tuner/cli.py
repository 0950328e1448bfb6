"""The `tuner` command."""

from __future__ import annotations

import errno
import functools
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from tuner.config import RunConfig, load_yaml, parse_set, resolve_layers, user_path
from tuner.data.user_data import is_user_data
from tuner.errors import UserError
from tuner.interrupts import StopAtRoundEnd
from tuner.plugins import canonical, method_class

app = typer.Typer(help="Hyperparameter search for personalized federated learning.", no_args_is_help=True, add_completion=False)
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
            said = f"cannot write or read {e.filename} ({e.strerror}); {io_advice(e)}, and the files written before stay whole (every write replaces a file at once)."
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


SET_HELP = "Any other run setting or method hyperparameter, as name=value (repeatable): lr, batch_size, local_epochs, join_ratio, eval_gap, backbone, seed, executor, device, val_frac, shift, mu, ..."


def make_config(method: str, config: Path | None, options: dict, sets: list[str]) -> RunConfig:
    """The resolved run: a YAML file, then the options typed, then --set, each value blamed on where it was typed."""
    layers = [(str(config), load_yaml(config))] if config is not None else []
    layers += [(f"--{name}", {name: value}) for name, value in options.items() if value is not None]
    return resolve_layers(method, layers + [("--set", parse_set(sets))])


def at_least(option: str, value: int | None, low: int) -> None:
    """A number typed on the command line, checked where it was typed."""
    if value is not None and value < low:
        raise UserError(f"{option} must be at least {low}, not {value}.")


@app.command()
@user_errors
def run(
    method: str = typer.Argument(..., help="Method or variant name (see `tuner methods`), e.g. fedavg, gpfl, fedpac-fa; or your own as path/to/file.py:ClassName."),
    dataset: Optional[str] = typer.Option(None, help="fmnist, digits, mnist, emnist, cifar10, cifar100, tinyimagenet, cinic10, agnews, har; or your own data as a path: a .parquet or .npz file (x, y, optionally client and split), or PFLlib's train/ and test/ folders (docs/own_code.md) [default: fmnist]."),
    partition: Optional[str] = typer.Option(None, help="iid, pat:N (N classes per client), dir:BETA (Dirichlet), pac:S (FedPAC, S % uniform), or natural (your data's own clients) [default: dir:0.1]."),
    clients: Optional[int] = typer.Option(None, help="Number of clients [default: 20; with --partition natural, the data's own]."),
    rounds: Optional[int] = typer.Option(None, help="Communication rounds (with --resume: the new total) [default: 100]."),
    out: Optional[Path] = typer.Option(None, callback=absolute, help="Directory for config.yaml, metrics.parquet and checkpoint.pt; one that holds a run is refused unless --resume [default: results/runs/METHOD-DATE-TIME]."),
    config: Optional[Path] = typer.Option(None, callback=absolute, help="YAML file of settings (same names as --set)."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    resume: bool = typer.Option(False, help="Continue the run in --out from its checkpoint up to --rounds."),
    schedule: Optional[Path] = typer.Option(None, callback=absolute, help="Replay settings round by round from this file: a trial's rounds.parquet (a population-based sweep's; `tuner report` writes the best one's) or a CSV of round and one column a setting [--rounds default: its last round]."),
):
    """Run one federated simulation and write its per-round metrics."""
    from tuner.run import RunDir, run as run_simulation
    from tuner.schedule import load_schedule

    if out is None:
        if resume:
            raise UserError("--resume continues the run in the folder --out names; name it.")
        out = user_path(Path("results/runs") / f"{method_class(method).name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if resume:
        cfg = RunDir(out).read_config()
        if cfg.method != canonical(method):
            raise UserError(f"{out} holds a {cfg.method} run, not {method}; name {cfg.method} to resume it.")
        at_least("--rounds", rounds, 1)
        cfg = replace(cfg, rounds=cfg.rounds if rounds is None else rounds)
    else:
        opts = {"dataset": dataset, "partition": partition, "clients": clients, "rounds": rounds}
        cfg = make_config(method, config, opts, set_)
    table = None if schedule is None else load_schedule(schedule, cfg)
    if table is not None and rounds is None and not resume:
        cfg = replace(cfg, rounds=len(table))
    done = 0
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}  best test {task.fields[best]}"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, transient=False,
    ) as progress:  # fmt: skip
        task = progress.add_task(f"{method_class(cfg.method).name} round", total=cfg.rounds, acc="-", best="-")

        def on_round(row: dict) -> None:
            nonlocal done
            fmt = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"  # noqa: E731
            progress.update(task, completed=row["round"], acc=fmt(row.get("acc")), best=fmt(row.get("best_acc")))
            done += 1

        t0 = time.perf_counter()
        stop = StopAtRoundEnd(progress.console)
        try:
            with stop.installed():
                sim = run_simulation(cfg, out, resume=resume, on_round=on_round, stop_requested=stop, schedule=table)
        except KeyboardInterrupt:  # the second Ctrl-C: at once, mid-round
            sim = None
        if sim is None or sim.round < cfg.rounds:
            progress.stop()
            saved = RunDir(out).saved_round()
            advice = (f"continue from its checkpoint of round {saved} with: tuner run {cfg.method} --resume --out {out}" if saved is not None
                      else "no checkpoint was written yet, so run it again without --resume")  # fmt: skip
            err.print(f"Stopped; the rows so far are in {out / 'metrics.parquet'}; {advice}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(130)
    summarize(sim.history, out, time.perf_counter() - t0, done)


def summarize(history: list[dict], out: Path, seconds: float, rounds_run: int) -> None:
    evals = [h for h in history if "acc" in h]
    table = Table(title="Run summary", show_header=False)
    if evals:
        best = max(evals, key=lambda h: h["acc"])
        table.add_row("best accuracy", f"{100 * best['acc']:.2f}% (round {best['round']})")
        last = evals[-1]
        table.add_row("last accuracy", f"{100 * last['acc']:.2f}% (round {last['round']}), client std {100 * last['acc_std']:.2f}")
        if "val_acc" in last:
            table.add_row("last val accuracy", f"{100 * last['val_acc']:.2f}%")
    table.add_row("rounds run", f"{rounds_run} in {seconds:.1f} s ({seconds / max(rounds_run, 1):.2f} s/round)")
    table.add_row("results", str(out))
    console.print(table)


@app.command()
@user_errors
def sweep(
    method: str = typer.Argument(..., help="Method or variant name (see `tuner methods`), or your own as path/to/file.py:ClassName."),
    space: Path = typer.Option(..., callback=absolute, help="Search-space YAML file, e.g. search_spaces/gpfl.yaml."),
    name: Optional[str] = typer.Option(None, help="Sweep name: a directory under --storage (or a path of its own) [default: METHOD-SPACE]."),
    storage: Path = typer.Option(Path("results/sweeps"), callback=absolute, help="Directory for the sweep; on a cluster, one every node can see."),
    samples: Optional[int] = typer.Option(None, help="Number of trials [default: the space's samples]."),
    sampler: Optional[str] = typer.Option(None, help="Optuna sampler: tpe, random, cmaes, gp, qmc, nsga2 or grid [default: the space's]."),
    select: Optional[str] = typer.Option(None, help="val: test accuracy at the best validation round (honest, the default); test: best test accuracy over rounds, as the papers report [default: the space's, else val]."),
    seeds: int = typer.Option(0, help="Rerun the best configuration with this many fresh seeds (mean ± std, as the papers)."),
    vary_partition: bool = typer.Option(False, help="Give each seed rerun its own partition too (partition_seed = seed); by default all share one, as in the papers."),
    grace: Optional[int] = typer.Option(None, help="ASHA grace period in rounds (enables ASHA)."),
    scheduler: Optional[str] = typer.Option(None, help="asha (Optuna's search; trials stopped early per --grace), or tune while training: pbt or pb2, population-based training over the space's float settings [default: the space's, else asha]."),
    patience: Optional[int] = typer.Option(None, help="Stop a trial whose best round is more than this many rounds old."),
    max_total_rounds: Optional[int] = typer.Option(None, help="End the sweep after this many rounds over all trials."),
    set_: list[str] = typer.Option([], "--set", help="Add to the space's fixed settings, as name=value (repeatable), e.g. rounds=20."),
    cpus_per_trial: float = typer.Option(1.0, help="CPUs reserved per trial."),
    gpus_per_trial: Optional[float] = typer.Option(None, help="GPUs per trial, fractional to share one GPU [default: 0.5 if the cluster has GPUs (two trials a GPU, the measured knee: docs/performance.md), else 0]."),
    max_concurrent: Optional[int] = typer.Option(None, help="At most this many trials at once [default: as resources allow]."),
    address: Optional[str] = typer.Option(None, help="Join a running Ray cluster (e.g. auto, or HEAD_IP:6379) instead of starting a local one."),
    study_db: Optional[Path] = typer.Option(None, callback=absolute, help="Keep the Optuna study in this SQLite file (viewable with optuna-dashboard)."),
    resume: bool = typer.Option(False, help="Continue an interrupted sweep of the same name: finished trials stay, unfinished ones resume from their checkpoints."),
    verbose: bool = typer.Option(False, help="Show Ray's own logs and trial tables."),
    compile_cache: Optional[Path] = typer.Option(None, callback=absolute, help="Folder where trials keep their compiled programs, shared by the sweep's trials and kept for later sweeps; a new folder starts cold [default: STORAGE/.compile-cache]."),
):
    """Search a method's hyperparameters over many federated runs (Ray Tune + Optuna)."""
    from tuner.space import load_space
    from tuner.sweep.cluster import Resources
    from tuner.sweep.stages import sweep as run_sweep

    overrides = {"samples": samples, "sampler": sampler, "select": select, "grace": grace, "patience": patience, "max_total_rounds": max_total_rounds,
                 "scheduler": scheduler}  # fmt: skip
    sp = load_space(space, method, overrides, parse_set(set_))
    stem, short = space.stem, method_class(sp.method).name  # a method of one's own: its name, not its file
    sweep_dir = user_path(storage / Path(name or (stem if stem.startswith(short) else f"{short}-{stem}")).expanduser())
    res = Resources(cpus_per_trial, gpus_per_trial, max_concurrent, address, verbose, compile_cache)
    if seeds < 0:
        raise UserError(f"--seeds must be 0 or more, not {seeds}.")
    for note in sp.notes:
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    how = f"{sp.population.kind} over {', '.join(sp.population.mutate)} every {sp.population.interval} rounds" if sp.population else f"sampler {sp.sampler}"
    console.print(f"sweep {sweep_dir}: {sp.samples} trials of {short}, {how}, selecting by {sp.select} accuracy", markup=False)
    summary = run_sweep(sp, sweep_dir, res, seeds=seeds, vary_partition=vary_partition, resume=resume, study_db=study_db)
    table = Table(title=f"Sweep {sweep_dir.name}", show_header=False)
    best = summary["best"]
    table.add_row("best configuration", ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary["best_config"].items()))
    table.add_row("chosen by", chosen_by(sp.select, best.get("best_val_acc"), best.get("best_val_round")))
    table.add_row("selected test accuracy", f"{100 * best['selected_acc']:.2f}% (round {best['best_round']})")
    if summary.get("ended_by"):
        table.add_row("ended by", escape(summary["ended_by"]))
    if summary.get("seeds"):
        import numpy as np

        accs = 100 * np.array(summary["seeds"])
        table.add_row(f"{len(accs)} fresh seeds", f"{accs.mean():.2f} ± {accs.std():.2f}%")
    table.add_row("results", f"{sweep_dir}  (tables: tuner report {sweep_dir} --out results/report)")
    console.print(table)


@app.command()
@user_errors
def reproduce(
    table: str = typer.Argument(..., help="Paper table: gpfl-table1, gpfl-table6, fedcp-table2, fedpac-table1, fedpac-table2, ... (see --help)."),
    seeds: int = typer.Option(3, help="Seeds per cell (the papers report mean ± std over 3 or 5)."),
    vary_partition: bool = typer.Option(False, help="Give each seed its own partition too (partition_seed = seed); by default all share one, as in the papers."),
    rounds: Optional[int] = typer.Option(None, help="Rounds per run [default: the paper's, 2000 for GPFL/FedCP, 200 for FedPAC]."),
    dataset: list[str] = typer.Option([], help="Only these datasets (repeatable), e.g. --dataset fmnist."),
    method: list[str] = typer.Option([], help="Only these methods (repeatable), e.g. --method gpfl; one of your own (--method ./mine.py:FedNew) runs in every setting of the table."),
    patience: Optional[int] = typer.Option(None, help="Stop a run whose best round is more than this many rounds old."),
    set_: list[str] = typer.Option([], "--set", help="Settings for every cell as name=value, e.g. eval_gap=5 or executor=sequential."),
    storage: Path = typer.Option(Path("results/reproduce"), callback=absolute, help="Directory for the experiment (one every node can see on a cluster)."),
    cpus_per_trial: float = typer.Option(1.0, help="CPUs reserved per run."),
    gpus_per_trial: Optional[float] = typer.Option(None, help="GPUs per run, fractional to share one [default: 0.5 if the cluster has GPUs (two runs a GPU, the measured knee), else 0]."),
    max_concurrent: Optional[int] = typer.Option(None, help="At most this many runs at once."),
    address: Optional[str] = typer.Option(None, help="Join a running Ray cluster instead of starting a local one."),
    resume: bool = typer.Option(False, help="Continue an interrupted reproduction."),
    verbose: bool = typer.Option(False, help="Show Ray's own logs and trial tables."),
):
    """Run every cell of a paper's table that the local data allows, with several seeds, then print the table."""
    from tuner.report.write import report as build_report
    from tuner.reproduce import reproduce as run_reproduction
    from tuner.sweep.cluster import Resources

    at_least("--seeds", seeds, 1)
    at_least("--rounds", rounds, 1)
    at_least("--patience", patience, 1)
    res = Resources(cpus_per_trial, gpus_per_trial, max_concurrent, address, verbose)
    sweep_dir, skipped = run_reproduction(table, storage, res, seeds=seeds, rounds=rounds, datasets=dataset, methods=method,
                                          patience=patience, settings=parse_set(set_), vary_partition=vary_partition, resume=resume)  # fmt: skip
    for reason in skipped:
        err.print(f"left out: {reason}", highlight=False, soft_wrap=True)
    from tuner.papers import TABLES

    result = build_report([sweep_dir], sweep_dir / "report")
    tables = result["tables"]
    paper_name, table_name = TABLES[table].paper, TABLES[table].name
    _print_tables(tables[(tables["paper"] == paper_name) & (tables["table"] == table_name)] if not tables.empty else tables)
    console.print(f"tables and plots in {sweep_dir / 'report'}")


@app.command()
@user_errors
def report(
    results: list[Path] = typer.Argument(..., callback=absolute, help="Run directories, sweeps, or folders holding them (searched recursively)."),
    out: Path = typer.Option(Path("results/report"), callback=absolute, help="Directory for the Parquet tables, Markdown, LaTeX and plots."),
    select: Optional[str] = typer.Option(None, help="test: best test accuracy over rounds (the papers); val: test accuracy at the best validation round [default: each run's own rule: its sweep's select, else test]."),
):
    """Collect runs and sweeps into Parquet tables and rebuild the papers' tables beside their published numbers."""
    from tuner.report.write import report as build_report

    result = build_report(results, out, select)
    for line in result["unreadable"]:
        err.print(f"skipped {line}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"{result['runs']} runs ({result['failed']} failed); {result['note']}")
    if result["unselectable"]:
        err.print(f"{result['unselectable']} runs have no accuracy to select by ({'validation' if select == 'val' else 'no evaluated round'}) and are left out of the tables.")
    if result["tables"].empty:
        console.print("None of these runs is in a setting of the papers' tables; the per-run summary is in runs.parquet.")
    for sweep in result["best"].to_dict("records") if not result["best"].empty else []:
        if sweep["running"]:
            err.print(f"note: sweep {sweep['path']} is {sweep['running']}; its figures are those so far.", markup=False, soft_wrap=True)
    _print_tables(result["tables"])
    _print_best(result["best"])
    console.print("written: " + ", ".join(str(p) for p in result["files"]))


def chosen_by(select: str, val_acc: float | None, val_round: float | None) -> str:
    """The figure that chose a trial: its best validation accuracy, or (the papers' convention) its best test accuracy."""
    if select == "test":
        return "best test accuracy (the papers' convention)"
    return f"best val {100 * val_acc:.2f}% (round {int(val_round)})"


def _print_best(best) -> None:
    """Each sweep's best configuration, as in best.md."""
    if best.empty:
        return
    table = Table(title="Best configuration of each sweep")
    for col in ("sweep", "method", "trials (failed, early)", "best configuration", "chosen by", "selected test acc", "seed reruns"):
        table.add_column(col)
    missing = lambda v: v is None or (isinstance(v, float) and math.isnan(v))  # noqa: E731
    for r in best.to_dict("records"):
        acc = "-" if missing(r.get("selected_acc")) else f"{100 * r['selected_acc']:.2f}% (round {int(r['best_round'])})"
        seeds = "-" if missing(r.get("seeds")) else f"{100 * r['seeds_mean']:.2f} ± {100 * r['seeds_std']:.2f}% (n={int(r['seeds'])})"
        chosen = "-" if missing(r.get("selected_acc")) else chosen_by(r["selected_by"], r["val_acc"], r["val_round"])
        table.add_row(r["sweep"], r["method"], f"{r['trials']} ({r['failed']}, {r['stopped_early']})", escape(str(r.get("config", "-"))), chosen, acc, seeds)
    console.print(table)


def _print_tables(tables) -> None:
    """Each paper table, only the columns and methods we ran, beside the published numbers."""
    from tuner.report.tables import agreement, agreement_line, wide_table

    if tables.empty:
        return
    for (paper_name, table_name), t in tables.groupby(["paper", "table"], sort=False):
        if not (t["seeds"] > 0).any():  # a setting of this table, run only by methods it has no row for
            continue
        frame = wide_table(t, compact=True)
        table = Table(title=escape(f"{paper_name} {table_name}: ours [seeds × rounds] beside the paper"))
        table.add_column("method")
        for column, part in frame.columns:
            table.add_column(f"{column}\n{part}", justify="right")
        for method, row in frame.iterrows():
            table.add_row(method, *map(escape, row.tolist()))
        console.print(table)
        for a in agreement(t).itertuples():
            console.print(f"  agreement, {agreement_line(a)}", highlight=False, soft_wrap=True)


@app.command()
@user_errors
def methods(
    template: Optional[str] = typer.Option(None, help="Print a starting file for a method of your own called NAME: tuner methods --template fednew > fednew.py"),
):
    """List every method and variant: its paper, the code it follows, what it shares and its hyperparameters; with those installed packages add."""
    if template is not None:
        from tuner.method_template import template as starting_file

        typer.echo(starting_file(template), nl=False)
        return
    from dataclasses import asdict

    from algorithms import METHODS
    from tuner.plugins import installed_methods

    table = Table(title="Methods (tuner run NAME --set hyperparameter=value; your own: tuner run FILE.py:CLASS)")
    table.add_column("name", no_wrap=True)  # what a user types: never broken over lines
    for col in ("paper name", "paper", "follows", "shared", "hyperparameters (defaults)"):
        table.add_column(col)
    installed = installed_methods()
    for name in [*METHODS, *installed]:
        cls = method_class(name)
        hp = ", ".join(f"{k}={v}" for k, v in asdict(cls.Hparams()).items()) or "-"
        where = f" (from {installed[name].value})" if name in installed else ""
        shared = " ".join(p.rstrip(".") for p in cls.shared) or "-"
        table.add_row(name, cls.title + where, cls.paper or "-", cls.source or "-", shared, hp)
    console.print(table)


@data_app.command("show")
@user_errors
def data_show(
    dataset: str = typer.Option("fmnist", help="A built-in dataset's name, or your own data as a path: a .parquet or .npz file, or PFLlib's train/ and test/ folders."),
    partition: str = typer.Option("dir:0.1", help="iid, pat:N, dir:BETA, pac:S, or natural (your data's own clients)."),
    clients: Optional[int] = typer.Option(None, help="Number of clients [default: 20; with --partition natural, the data's own]."),
    out: Path = typer.Option(Path("partition.png"), callback=absolute, help="PNG file to draw the partition into."),
    set_: list[str] = typer.Option([], "--set", help="Other data settings as name=value: seed, train_frac, val_frac, balance, groups, shift, pac_train, pac_test, data_dir."),
):
    """Draw a partition as the papers do (clients x classes, circle size = samples) and summarize it."""
    import torch

    from tuner.data.show import draw_partition, summary_rows
    from tuner.run import build_data

    cfg = make_config("fedavg", None, {"dataset": dataset, "partition": partition, "clients": clients}, set_)
    data = build_data(cfg, torch.device("cpu"))
    name = Path(cfg.dataset).name if is_user_data(cfg.dataset) else cfg.dataset
    draw_partition(data, out, f"{name} {cfg.partition}, {cfg.clients} clients")
    table = Table(title=f"{name} {cfg.partition}: {cfg.clients} clients")
    rows = summary_rows(data)
    for col in rows[0]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*[str(v) for v in r.values()])
    console.print(table)
    console.print(f"partition drawn to {out}")


if __name__ == "__main__":
    app()
