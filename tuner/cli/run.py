"""`tuner run`: one federated simulation, its progress, a Ctrl-C that stops at a round's end, and its summary."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from tuner.cli.common import (
    DATA_EPILOG,
    DATASET_HELP,
    METHOD_HELP,
    PARTITION_HELP,
    SET_HELP,
    absolute,
    app,
    at_least,
    console,
    err,
    make_config,
    user_errors,
)
from tuner.errors import UserError
from tuner.files import user_path
from tuner.interrupts import StopAtRoundEnd
from tuner.plugins import canonical, method_class
from tuner.settings.config import RunConfig

RUN_EPILOG = (
    "--out holds config.yaml, metrics.parquet (a row a round) and checkpoint.pt. "
    "--schedule takes a trial's rounds.parquet (a population-based sweep's; `tuner report` writes the best one's) "
    "or a CSV of round and one column a setting. " + DATA_EPILOG
)


@app.command(epilog=RUN_EPILOG)
@user_errors
def run(
    method: str = typer.Argument(
        ...,
        help=METHOD_HELP,
    ),
    dataset: str | None = typer.Option(
        None,
        help=DATASET_HELP,
    ),
    partition: str | None = typer.Option(
        None,
        help=PARTITION_HELP,
    ),
    clients: int | None = typer.Option(
        None, help="Number of clients \\[default: 20; with --partition natural, the data's own]."
    ),
    rounds: int | None = typer.Option(
        None, help="Communication rounds (with --resume: the new total) \\[default: 100]."
    ),
    out: Path | None = typer.Option(
        None,
        callback=absolute,
        help="The run's folder; one holding a run is refused unless --resume "
        "\\[default: results/runs/METHOD-DATE-TIME].",
    ),
    config: Path | None = typer.Option(None, callback=absolute, help="YAML file of settings (same names as --set)."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    resume: bool = typer.Option(False, help="Continue the run in --out from its checkpoint up to --rounds."),
    schedule: Path | None = typer.Option(
        None,
        callback=absolute,
        help="Replay settings round by round from this file [--rounds default: its last round].",
    ),
    tuned: str | None = typer.Option(
        None,
        help="Start from the settings tuned for METHOD at this setting (`tuner methods` lists them), e.g. "
        "fmnist-dir0.1-20c-cnn4; options and --set go over them.",
    ),
    seeds: str | None = typer.Option(
        None,
        help="Run these seeds (e.g. 0,1,2) packed into one program, each in its own folder --out/seed-N as it "
        "would be written alone (with --resume, each continued or started).",
    ),
):
    """Run one federated simulation and write its per-round metrics."""
    from tuner.run_folder import RunDir
    from tuner.settings.schedule import load_schedule

    if out is None:
        if resume:
            raise UserError("--resume continues the run in the folder --out names; name it.")
        out = user_path(Path("results/runs") / f"{method_class(method).name}-{time.strftime('%Y%m%d-%H%M%S')}")
    chosen = None if seeds is None else seed_list(seeds, set_)
    folder = out if chosen is None else next((out / f"seed-{s}" for s in chosen if (out / f"seed-{s}").exists()), None)
    if resume and folder is not None:
        cfg = RunDir(folder).read_config()
        if cfg.method != canonical(method):
            raise UserError(f"{folder} holds a {cfg.method} run, not {method}; name {cfg.method} to resume it.")
        at_least("--rounds", rounds, 1)
        cfg = replace(cfg, rounds=cfg.rounds if rounds is None else rounds)
    elif resume:
        raise UserError(f"{out} holds none of the seeds' folders (seed-N), so there is no run to resume there.")
    else:
        opts = {"dataset": dataset, "partition": partition, "clients": clients, "rounds": rounds}
        cfg = make_config(method, config, opts, set_, tuned)
    table = None if schedule is None else load_schedule(schedule, cfg)
    if table is not None and rounds is None and not resume:
        cfg = replace(cfg.settings(), rounds=len(table))
    if chosen is None:
        run_one(cfg, out, resume, table, f"tuner run {cfg.method} --resume --out {out}")
        return
    again = f"tuner run {cfg.method} --seeds {seeds} --resume --out {out}"
    groups: dict[tuple[bool, int | None], list[tuple[int, Path]]] = {}
    for seed in chosen:
        here = out / f"seed-{seed}"
        done = RunDir(here).saved_round() if resume and here.exists() else None
        if done is not None and done >= cfg.rounds:
            console.print(f"seed {seed}: {here} has run its {cfg.rounds} rounds")
            continue
        groups.setdefault((resume and here.exists(), done), []).append((seed, here))
    for (go_on, _), group in groups.items():  # the seeds at one round run as one pack
        run_seeds(cfg, group, go_on, table, again)


def run_seeds(cfg: RunConfig, group: list[tuple[int, Path]], resume: bool, table, again: str) -> None:
    """Seeds at one round: packed into one program (tuner/engine/pack.py), or one after another where they cannot
    be (a schedule rebuilds its run as it goes; a method that cannot be packed says why)."""
    cfgs = [replace(cfg.settings(), seed=seed) for seed, _ in group]
    if table is None and len(group) > 1:
        try:
            return run_packed(cfgs, [here for _, here in group], resume, again)
        except ValueError as e:
            console.print(f"{e}; the seeds run one after another.")
    for one, (seed, here) in zip(cfgs, group, strict=True):
        run_one(one, here, resume, table, again, f"seed {seed}")


def run_packed(cfgs: list[RunConfig], outs: list[Path], resume: bool, again: str) -> None:
    """Runs packed into one program, a progress line each; a stop (Ctrl-C, SIGTERM) says how to continue and exits
    130."""
    from tuner.packed_run import run_pack
    from tuner.run_folder import RunDir

    rounds = cfgs[0].rounds
    with Progress(*progress_columns(), console=console, transient=False) as progress:
        name = method_class(cfgs[0].method).name
        tasks = [progress.add_task(f"{name} seed {c.seed} round", total=rounds, acc="-", best="-") for c in cfgs]
        done = [0] * len(cfgs)

        def on_round(r: int, row: dict) -> None:
            progress.update(
                tasks[r], completed=row["round"], acc=percent(row.get("acc")), best=percent(row.get("best_acc"))
            )
            done[r] += 1

        t0 = time.perf_counter()
        stop = StopAtRoundEnd(progress.console)
        try:
            with stop.installed():
                pack = run_pack(cfgs, outs, resume=resume, on_round=on_round, stop_requested=stop)
        except KeyboardInterrupt:  # the second Ctrl-C: at once, mid-round
            pack = None
        if pack is None or pack.round < rounds:
            progress.stop()
            stopped(outs[0].parent / "seed-N", RunDir(outs[0]).saved_round(), again)
    seconds = time.perf_counter() - t0
    for r, out in enumerate(outs):
        summarize(pack.histories[r], out, seconds, done[r])


def seed_list(text: str, sets: list[str]) -> list[int]:
    """--seeds as whole numbers, each once; a --set seed=... beside it is a contradiction to name."""
    if any(s.split("=", 1)[0].strip() == "seed" for s in sets):
        raise UserError("--seeds sets each run's seed; drop --set seed=... or --seeds.")
    try:
        chosen = [int(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"--seeds takes whole numbers separated by commas (0,1,2), not {text!r}.") from None
    if len(set(chosen)) < len(chosen) or min(chosen) < 0:
        raise UserError(f"--seeds takes each seed once and none below 0, not {text!r}.")
    return chosen


def run_one(cfg: RunConfig, out: Path, resume: bool, table, again: str, label: str = "") -> None:
    """One run with its progress line and summary; a stop (Ctrl-C, SIGTERM) says how to continue and exits 130."""
    from tuner.federated_run import run as run_simulation
    from tuner.run_folder import RunDir

    done = 0
    with Progress(*progress_columns(), console=console, transient=False) as progress:
        title = " ".join(filter(None, [method_class(cfg.method).name, label, "round"]))
        task = progress.add_task(title, total=cfg.rounds, acc="-", best="-")

        def on_round(row: dict) -> None:
            nonlocal done
            progress.update(
                task, completed=row["round"], acc=percent(row.get("acc")), best=percent(row.get("best_acc"))
            )
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
            stopped(out, RunDir(out).saved_round(), again)
    summarize(sim.history, out, time.perf_counter() - t0, done)


def progress_columns() -> list:
    return [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}  best test {task.fields[best]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]


def percent(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"


def stopped(out: Path, saved: int | None, again: str) -> None:
    """A stopped run: where its rows are and how to continue it; exit code 130."""
    advice = (
        f"continue from its checkpoint of round {saved} with: {again}"
        if saved is not None
        else "no checkpoint was written yet, so run it again without --resume"
    )
    err.print(
        f"Stopped; the rows so far are in {out / 'metrics.parquet'}; {advice}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(130)


def summarize(history: list[dict], out: Path, seconds: float, rounds_run: int) -> None:
    evals = [h for h in history if "acc" in h]
    table = Table(title="Run summary", show_header=False)
    if evals:
        best = max(evals, key=lambda h: h["acc"])
        table.add_row("best accuracy", f"{100 * best['acc']:.2f}% (round {best['round']})")
        last = evals[-1]
        table.add_row(
            "last accuracy", f"{100 * last['acc']:.2f}% (round {last['round']}), client std {100 * last['acc_std']:.2f}"
        )
        if "val_acc" in last:
            table.add_row("last val accuracy", f"{100 * last['val_acc']:.2f}%")
    table.add_row("rounds run", f"{rounds_run} in {seconds:.1f} s ({seconds / max(rounds_run, 1):.2f} s/round)")
    table.add_row("results", str(out))
    console.print(table)
