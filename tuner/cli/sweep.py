"""`tuner sweep` (a method's hyperparameter search as Ray Tune trials) and `tuner reproduce` (every cell of a
paper's table)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from tuner.cli.common import (
    ADDRESS_HELP,
    GPUS_HELP,
    METHOD_HELP,
    VERBOSE_HELP,
    absolute,
    app,
    at_least,
    console,
    err,
    user_errors,
)
from tuner.cli.console_tables import chosen_by, print_tables
from tuner.errors import UserError
from tuner.files import user_path
from tuner.plugins import method_class
from tuner.settings.config import parse_set
from tuner.sweep.schedulers import SCHEDULERS

SCHEDULERS_HELP = "; ".join(f"{s.name}: {s.help}" for s in SCHEDULERS.values())


def pack_size(text: str, method: str | None = None) -> int:
    """--pack as a number of trials: N, or 0 for auto (by the cluster's devices: tuner/sweep/pack_host.py
    AUTO_PACK); a method whose runs cannot be packed says why, and its trials run as today (in a reproduction, each
    such cell's)."""
    if text == "auto":
        size = 0
    else:
        try:
            size = int(text)
        except ValueError:
            raise UserError(f"--pack takes a number of trials (8) or auto, not {text!r}.") from None
        if size < 1:
            raise UserError(f"--pack takes a number of trials of 1 or more, not {size}.")
    reason = method_class(method).unpackable if method else ""
    if size != 1 and reason:
        err.print(f"note: {method_class(method).title}'s runs cannot be packed: {reason}; its trials run one by one.")
        return 1
    return size


@app.command()
@user_errors
def sweep(
    method: str = typer.Argument(..., help=METHOD_HELP),
    space: Path = typer.Option(..., callback=absolute, help="Search-space YAML file, e.g. search_spaces/gpfl.yaml."),
    name: str | None = typer.Option(
        None, help="Sweep name: a directory under --storage (or a path of its own) \\[default: METHOD-SPACE]."
    ),
    storage: Path = typer.Option(
        Path("results/sweeps"), callback=absolute, help="Directory for the sweep; on a cluster, one every node can see."
    ),
    samples: int | None = typer.Option(None, help="Number of trials \\[default: the space's samples]."),
    sampler: str | None = typer.Option(
        None, help="Optuna sampler: tpe, random, cmaes, gp, qmc, nsga2 or grid \\[default: the space's]."
    ),
    select: str | None = typer.Option(
        None,
        help="val (test accuracy at the best validation round) or test (the best, as the papers) \\[default: the "
        "space's, else val].",
    ),
    seeds: int = typer.Option(
        0, help="Rerun the best configuration with this many fresh seeds (mean ± std, as the papers)."
    ),
    vary_partition: bool = typer.Option(
        False,
        help="Give each seed rerun its own partition too (partition_seed = seed); by default all share one, "
        "as in the papers.",
    ),
    grace: int | None = typer.Option(None, help="ASHA grace period in rounds (enables ASHA)."),
    scheduler: str | None = typer.Option(None, help=f"{SCHEDULERS_HELP} \\[default: the space's, else asha]."),
    patience: int | None = typer.Option(None, help="Stop a trial whose best round is more than this many rounds old."),
    max_total_rounds: int | None = typer.Option(None, help="End the sweep after this many rounds over all trials."),
    set_: list[str] = typer.Option(
        [], "--set", help="Add to the space's fixed settings, as name=value (repeatable), e.g. rounds=20."
    ),
    cpus_per_trial: float = typer.Option(1.0, help="CPUs reserved per trial."),
    gpus_per_trial: float | None = typer.Option(
        None,
        help=GPUS_HELP,
    ),
    max_concurrent: int | None = typer.Option(
        None, help="At most this many trials at once \\[default: as resources allow]."
    ),
    address: str | None = typer.Option(None, help=ADDRESS_HELP),
    study_db: Path | None = typer.Option(
        None, callback=absolute, help="Keep the Optuna study in this SQLite file (viewable with optuna-dashboard)."
    ),
    resume: bool = typer.Option(
        False,
        help="Continue an interrupted sweep of the same name: finished trials stay, unfinished ones resume "
        "from their checkpoints.",
    ),
    verbose: bool = typer.Option(False, help=VERBOSE_HELP),
    compile_cache: Path | None = typer.Option(
        None,
        callback=absolute,
        help="Folder of the trials' compiled programs, kept for later sweeps \\[default: STORAGE/.compile-cache].",
    ),
    pack: str = typer.Option(
        "1",
        help="Trials each device trains as one program, N or auto (8 on a GPU, 1 on a CPU, where packing was "
        "measured slower); each still a trial of its own, equal to its run alone; 1: each trial its own run.",
    ),
):
    """Search a method's hyperparameters over many federated runs (Ray Tune + Optuna)."""
    from tuner.sweep.cluster import Resources
    from tuner.sweep.space_file import load_space
    from tuner.sweep.stages import sweep as run_sweep

    overrides = {
        "samples": samples,
        "sampler": sampler,
        "select": select,
        "grace": grace,
        "patience": patience,
        "max_total_rounds": max_total_rounds,
        "scheduler": scheduler,
    }
    sp = load_space(space, method, overrides, parse_set(set_))
    stem, short = space.stem, method_class(sp.method).name  # a method of one's own: its name, not its file
    sweep_dir = user_path(storage / Path(name or (stem if stem.startswith(short) else f"{short}-{stem}")).expanduser())
    res = Resources(
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        max_concurrent=max_concurrent,
        address=address,
        verbose=verbose,
        compile_cache=compile_cache,
        pack=pack_size(pack, sp.method),
    )
    if seeds < 0:
        raise UserError(f"--seeds must be 0 or more, not {seeds}.")
    for note in sp.notes:
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    how = (
        f"{sp.population.kind} over {', '.join(sp.population.mutate)} every {sp.population.interval} rounds"
        if sp.population
        else f"sampler {sp.sampler}"
    )
    console.print(
        f"sweep {sweep_dir}: {sp.samples} trials of {short}, {how}, selecting by {sp.select} accuracy", markup=False
    )
    summary = run_sweep(
        sp, sweep_dir, res, seeds=seeds, vary_partition=vary_partition, resume=resume, study_db=study_db
    )
    table = Table(title=f"Sweep {sweep_dir.name}", show_header=False)
    best = summary["best"]
    table.add_row(
        "best configuration",
        ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary["best_config"].items()),
    )
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
    table: str = typer.Argument(
        ...,
        help="Paper table: gpfl-table1, gpfl-table6, fedcp-table2, fedpac-table1, ...; or roster: every method at the "
        "setting --set names.",
    ),
    seeds: int = typer.Option(3, help="Seeds per cell (the papers report mean ± std over 3 or 5)."),
    vary_partition: bool = typer.Option(
        False,
        help="Give each seed its own partition too (partition_seed = seed); by default all share one, as in "
        "the papers.",
    ),
    rounds: int | None = typer.Option(
        None, help="Rounds per run \\[default: the paper's, 2000 for GPFL/FedCP, 200 for FedPAC]."
    ),
    dataset: list[str] = typer.Option([], help="Only these datasets (repeatable), e.g. --dataset fmnist."),
    method: list[str] = typer.Option(
        [],
        help="Only these methods (repeatable), e.g. --method gpfl; one of your own (--method "
        "./mine.py:FedNew) runs in every setting of the table.",
    ),
    patience: int | None = typer.Option(None, help="Stop a run whose best round is more than this many rounds old."),
    set_: list[str] = typer.Option(
        [], "--set", help="Settings for every cell as name=value, e.g. eval_gap=5 or executor=sequential."
    ),
    storage: Path = typer.Option(
        Path("results/reproduce"),
        callback=absolute,
        help="Directory for the experiment (one every node can see on a cluster).",
    ),
    cpus_per_trial: float = typer.Option(1.0, help="CPUs reserved per run."),
    gpus_per_trial: float | None = typer.Option(
        None,
        help=GPUS_HELP,
    ),
    max_concurrent: int | None = typer.Option(None, help="At most this many runs at once."),
    address: str | None = typer.Option(None, help=ADDRESS_HELP),
    resume: bool = typer.Option(False, help="Continue an interrupted reproduction."),
    verbose: bool = typer.Option(False, help=VERBOSE_HELP),
    tune: bool = typer.Option(
        False, help="Tune every method at the same budget, then rerun best and defaults on fresh seeds (below)."
    ),
    trials: int = typer.Option(20, help="With --tune: trials of each method's search."),
    searches: int = typer.Option(
        1,
        help="With --tune: independent searches of each method (their own sampler and run seeds), each one's best "
        "rerun on the seeds, so the gain's interval holds the search's chance too.",
    ),
    space_dir: Path = typer.Option(
        Path("search_spaces"), callback=absolute, help="With --tune: where each method's space file is (METHOD.yaml)."
    ),
    sampler: str = typer.Option("tpe", help="With --tune: the Optuna sampler every search uses, seeded alike."),
    grace: int | None = typer.Option(None, help="With --tune: ASHA's grace period in rounds \\[default: rounds / 4]."),
    tuned_dir: Path = typer.Option(
        Path("results/tuned"), callback=absolute, help="With --tune: where the tuned settings files go."
    ),
    pack: str = typer.Option(
        "1",
        help="Runs each device trains as one program, N or auto: a cell's seeds pack (each run as it is alone); "
        "1: each run its own.",
    ),
):
    """Run every cell of a paper's table that the local data allows, with several seeds, then print the table."""
    from tuner.report.write import report as build_report
    from tuner.sweep.cluster import Resources

    at_least("--seeds", seeds, 2 if tune else 1)
    at_least("--rounds", rounds, 1)
    at_least("--patience", patience, 1)
    at_least("--trials", trials, 1)
    at_least("--searches", searches, 1)
    at_least("--grace", grace, 1)
    res = Resources(
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        max_concurrent=max_concurrent,
        address=address,
        verbose=verbose,
        pack=pack_size(pack),
    )
    common = dict(rounds=rounds, datasets=dataset, methods=method, patience=patience, settings=parse_set(set_))
    if tune:
        from tuner.experiments.tuned_comparison import reproduce_tuned

        if vary_partition:
            raise UserError("--tune pairs every method's runs over seeds of one partition; drop --vary-partition.")
        sweep_dir, skipped = reproduce_tuned(
            table,
            storage,
            res,
            trials=trials,
            seeds=seeds,
            space_dir=space_dir,
            sampler=sampler,
            grace=grace,
            tuned_dir=tuned_dir,
            resume=resume,
            searches=searches,
            **common,
        )
    else:
        from tuner.experiments.reproduce import reproduce as run_reproduction

        sweep_dir, skipped = run_reproduction(
            table, storage, res, seeds=seeds, vary_partition=vary_partition, resume=resume, **common
        )
    for reason in skipped:
        err.print(f"left out: {reason}", highlight=False, soft_wrap=True)
    from tuner.settings.papers import TABLES

    result = build_report([sweep_dir], sweep_dir / "report")
    tables = result["tables"]
    if table in TABLES:
        paper_name, table_name = TABLES[table].paper, TABLES[table].name
        print_tables(
            tables[(tables["paper"] == paper_name) & (tables["table"] == table_name)] if not tables.empty else tables
        )
    if tune:
        from tuner.report.fair import fair_markdown

        fair_methods, fair_columns = result["fair"]
        if not fair_methods.empty:
            console.print(fair_markdown(fair_methods, fair_columns), markup=False, highlight=False, soft_wrap=True)
        console.print(f"every method tuned at the same budget: {sweep_dir / 'report' / 'fair.md'}", markup=False)
        console.print(f"tuned settings: {tuned_dir} (tuner run METHOD --tuned SETTING)", markup=False)
    console.print(f"tables and plots in {sweep_dir / 'report'}")
