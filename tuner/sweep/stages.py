"""A sweep as Ray Tune experiments, one a stage, in the sweep's directory (`--storage/--name`), each with an
`experiment.yaml` that `tuner report` reads to rebuild every trial's full RunConfig:

    search/   the Optuna search (OptunaSearch; ASHA and patience stop trials early), or a population trained
              with PBT or PB2 (tuner/sweep/schedulers.py)
    seeds/    the best configuration rerun with fresh seeds (`--seeds N`)

`tuner reproduce` writes one stage, `reproduce/`, whose trials carry their table cell. A stage resumes where
it stopped (`--resume`), and stops cleanly, with what it wrote kept, on Ctrl-C, SIGTERM or a full storage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import ray
import yaml
from ray import tune

from tuner.engine.compile import COMPILE_CACHE
from tuner.errors import Interrupted, UserError, first_sentence
from tuner.files import ensure_writable, folder_lock, user_path, write_text_atomic
from tuner.selection import SCORE, best_of, selection, started, trial_dirname, trial_score
from tuner.sweep.cluster import Resources, check_fits, check_request, start_ray, trial_resources, worker_rounds
from tuner.sweep.console import SweepProgress, quiet, stage_counts
from tuner.sweep.recovery import (
    RESERVE_FILE,
    ProgressRows,
    ResultRows,
    StoppableOptunaSearch,
    StorageWatch,
    drop_damaged_errors,
    refuse_damaged_state,
    requeue_lost_trials,
    stopping_cleanly,
)
from tuner.sweep.schedulers import first_population, scheduler_of, tune_domain
from tuner.sweep.space import Space
from tuner.sweep.stopping import FinalFailures, stoppers
from tuner.sweep.storage import whole_file_storage
from tuner.sweep.trainable import federated_trial
from tuner.sweep.trials import TRIAL_RETRIES

EXPERIMENT_FILE = "experiment.yaml"


def write_experiment(path: Path, stage: str, base: dict[str, Any], select: str, **extra) -> None:
    path.mkdir(parents=True, exist_ok=True)
    info = {"stage": stage, "select": select, "settings": base, **extra}
    write_text_atomic(path / EXPERIMENT_FILE, yaml.safe_dump(info, sort_keys=False))


def run_stage(
    sweep_dir: Path,
    stage: str,
    base: dict[str, Any],
    select: str,
    report_every: int,
    res: Resources,
    *,
    param_space: dict | None = None,
    searcher=None,
    scheduler=None,
    stopper=None,
    samples: int = 1,
    expected: int | None = None,
    sharing: int | None = None,
    rounds: int,
    resume: bool,
    extra: dict | None = None,
    budget: int | None = None,
    keep_checkpoints: int = 2,
):
    """Run (or continue) one Ray Tune experiment in sweep_dir/stage and return its ResultGrid. `sharing`: how many of
    its trials run one method in one setting, and so the same compiled programs [default: all of them]."""
    check_request(res)  # before anything is written or started
    ensure_writable(sweep_dir, "the sweep's storage")
    start_ray(res)
    path = sweep_dir / stage
    request = trial_resources(res)
    check_fits(request)
    cache = str(res.compile_cache or sweep_dir.parent / COMPILE_CACHE)
    alike = sharing or (samples if expected is None else expected)
    shared_rounds = worker_rounds(request, alike, rounds, res.max_concurrent, ray.cluster_resources())
    trainable = tune.with_parameters(
        federated_trial,
        base=base,
        select=select,
        report_every=report_every,
        compile_cache=cache,
        worker_rounds=shared_rounds,
    )
    trainable = tune.with_resources(trainable, request)
    if resume and tune.Tuner.can_restore(str(path)):  # finished and failed trials stay as they are
        refuse_damaged_state(path)
        drop_damaged_errors(path)
        tuner = restored(path, trainable)
    else:
        write_experiment(path, stage, base, select, **(extra or {}))
        tuner = tune.Tuner(
            trainable,
            param_space=param_space or {},
            tune_config=tune.TuneConfig(
                metric=SCORE,
                mode="max",
                search_alg=searcher,
                scheduler=scheduler,
                num_samples=samples,
                max_concurrent_trials=res.max_concurrent,
                # a trial is seeded and built whole from its config, so a worker that ran
                # one runs the next alike, without the ~2.5 s of starting and importing torch
                reuse_actors=True,
                trial_dirname_creator=trial_dirname,
            ),
            run_config=tune.RunConfig(
                name=stage,
                storage_path=str(sweep_dir),
                storage_filesystem=whole_file_storage(),
                stop=stopper,
                callbacks=[
                    SweepProgress(expected or samples, rounds, select),
                    FinalFailures(),
                    StorageWatch(sweep_dir / RESERVE_FILE),
                    ResultRows(),  # in place of Ray Tune's own writers of these files
                    ProgressRows(),
                ],
                # Two checkpoints: a kill while a new one registers can leave the saved experiment state
                # pointing at the one before, which keeping one alone would already have deleted.
                verbose=2 if res.verbose else 0,
                checkpoint_config=tune.CheckpointConfig(num_to_keep=keep_checkpoints),
                failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
            ),
        )
    stage_counts.update(early=0, failed=0, done=0)
    with stopping_cleanly(sweep_dir) as going_on:
        grid = tuner.fit()
        for _ in range(TRIAL_RETRIES):  # trials whose worker was killed before they began run again, from round 1
            if not going_on() or not (lost := requeue_lost_trials(path)):
                break
            print(
                f"{lost} trials lost their worker while not running (killed between two trials); running them again",
                flush=True,
            )
            stage_counts.update(early=0, failed=0, done=0)
            grid = restored(path, trainable).fit()
    # a trial stopped by Ctrl-C is neither done nor failed; one never begun neither
    ended = stage_counts["done"] + stage_counts["failed"]
    spent = sum((r.metrics or {}).get("round", 0) for r in grid)
    # a spent budget ends the trials it stopped
    unfinished = 0 if budget is not None and spent >= budget else (expected or samples) - ended
    if unfinished:  # Ray stopped on Ctrl-C / SIGTERM after saving the experiment's state
        raise Interrupted(
            f"Stopped with {unfinished} trials unfinished; finished trials and checkpoints are in {path}. "
            "Run the same command with --resume to continue."
        )
    return grid


def restored(path: Path, trainable) -> tune.Tuner:
    """A stage's experiment as Ray Tune saved it: finished and failed trials stay as they are."""
    return tune.Tuner.restore(
        str(path), trainable, resume_unfinished=True, resume_errored=False, storage_filesystem=whole_file_storage()
    )


def seed_grid(seeds: list[int], vary_partition: bool) -> dict:
    """Tune's grid over seeds: the run seed alone (one partition, as the papers), or each seed with its own
    partition."""
    if vary_partition:
        return {"seeding": tune.grid_search([{"seed": s, "partition_seed": s} for s in seeds])}
    return {"seed": tune.grid_search(seeds)}


def sweep(
    space: Space,
    sweep_dir: Path,
    res: Resources,
    *,
    seeds: int = 0,
    vary_partition: bool = False,
    resume: bool = False,
    study_db: Path | None = None,
) -> dict:
    """The search stage, then the seed reruns of its best configuration; returns the best trial's figures."""
    quiet(res.verbose)
    if seeds and space.population:
        raise UserError(
            f"--seeds reruns one configuration, and a {space.population.kind} trial's is a schedule: replay it with "
            "`tuner run --schedule` and --set seed=N (docs/sweeps.md), or drop --seeds."
        )
    sweep_dir = user_path(sweep_dir)  # Ray and pyarrow read a relative path as a URI without a scheme
    search_dir = sweep_dir / "search"
    if not resume and search_dir.exists():
        raise UserError(f"{sweep_dir} already holds a sweep; pass --resume to continue it, or --name to start another.")
    if resume and not search_dir.exists():
        raise UserError(f"{sweep_dir} holds no sweep to resume; drop --resume to start it.")
    check_request(res)  # a request no node meets, and a storage that cannot be written, before the lock
    ensure_writable(sweep_dir, "the sweep's storage")
    with folder_lock(sweep_dir, "The sweep", "choose another --name"):
        return _sweep(space, sweep_dir, res, seeds, vary_partition, resume, study_db)


def _sweep(
    space: Space, sweep_dir: Path, res: Resources, seeds: int, vary_partition: bool, resume: bool, study_db: Path | None
) -> dict:
    search_dir = sweep_dir / "search"
    base = {"method": space.method, **space.settings}
    cfg = space.base_config()
    restoring = resume and tune.Tuner.can_restore(str(search_dir))
    kind, pop = scheduler_of(space), space.population
    # A population's trials draw their first values from Tune's domains and take states from each other: a donor's
    # checkpoint at every perturbation, kept until its recipients have read it. Optuna's draw them through the searcher.
    param_space = {n: tune_domain(d) for n, d in space.search.items()} if kind.hands_states else None
    keep = 4 if kind.hands_states else 2
    if kind.hands_states:
        base = {**base, "checkpoint_every": pop.interval}
    searcher = None  # a restored sweep brings its own; a new one would enqueue the default point again
    if not restoring and kind.hands_states:
        searcher = first_population(space, cfg.seed)
    elif not restoring:
        storage = study_storage(study_db) if study_db else None
        searcher = StoppableOptunaSearch(
            space=space.search,
            metric=SCORE,
            mode="max",
            sampler=space.make_sampler(cfg.seed),
            storage=storage,
            study_name=sweep_dir.name,
            points_to_evaluate=space.first_points(),
        )
    grid = run_stage(
        sweep_dir,
        "search",
        base,
        space.select,
        space.report_every,
        res,
        param_space=param_space,
        searcher=searcher,
        scheduler=kind.build(space, cfg.rounds),
        stopper=stoppers(space.stop.patience, space.stop.max_total_rounds, search_dir),
        samples=space.samples,
        rounds=cfg.rounds,
        resume=restoring,
        budget=space.stop.max_total_rounds,
        keep_checkpoints=keep,
        extra={
            "method": space.method,
            "space": space.source,
            "sampler": space.sampler,
            "scheduler": kind.name,
            "log_scale": [name for name, dist in space.search.items() if getattr(dist, "log", False)],
        },  # the report's axes
    )
    figures = {r.path: population_figures(r, space.select) if pop else r.metrics for r in grid if r.metrics}
    best = best_of(
        (r for r in grid if r.metrics), lambda r: trial_score(figures[r.path], space.select), lambda r: started(r.path)
    )
    refused = [r.metrics["failed"] for r in grid if r.metrics and r.metrics.get("failed_kind") == "refused"]
    refusal = (
        UserError(
            f"{len(refused)} trial{'s' if len(refused) > 1 else ''} of {sweep_dir} refused a setting the search gave "
            f"({refused[0]}); fix the space and sweep again (--name for a new sweep)."
        )
        if refused
        else None
    )
    if best is None:
        raise refusal or UserError(
            f"No trial of {sweep_dir} reported a result; see the error.txt files under {search_dir}."
        )
    summary = {
        "best_config": dict(best.config),
        "best": {
            k: figures[best.path].get(k)
            for k in ("best_acc", "selected_acc", "best_round", "best_val_acc", "best_val_round")
        },
    }
    spent, budget = sum((r.metrics or {}).get("round", 0) for r in grid), space.stop.max_total_rounds
    if budget and spent >= budget:  # trials stopped short by the budget: said, not left to look like early stopping
        summary["ended_by"] = f"the round budget: {spent} rounds over all trials reached max_total_rounds {budget}"
    if refusal:  # the search's best so far stays written; no seeds are run on a space that needs fixing
        write_text_atomic(sweep_dir / "summary.yaml", yaml.safe_dump(_plain(summary), sort_keys=False))
        raise refusal
    if seeds:
        seeds_grid = run_stage(
            sweep_dir,
            "seeds",
            base,
            space.select,
            space.report_every,
            res,
            param_space={**best.config, **seed_grid(list(range(cfg.seed + 1, cfg.seed + 1 + seeds)), vary_partition)},
            stopper=stoppers(space.stop.patience, None),
            samples=1,
            expected=seeds,
            rounds=cfg.rounds,
            resume=resume,
            extra={"method": space.method, "best_of": "search"},
        )
        accs = [r.metrics.get("selected_acc") for r in seeds_grid if r.metrics and r.error is None]
        summary["seeds"] = accs
    write_text_atomic(sweep_dir / "summary.yaml", yaml.safe_dump(_plain(summary), sort_keys=False))
    return summary


def population_figures(result, select: str) -> dict:
    """A population-based trial's figures from the rounds its state went through (its last report may come from
    before its last exploit: Tune keeps what a trial reported before an exploit and may drop what follows it)."""
    from tuner.sweep.trial_files import lineage_rows

    rows, _ = lineage_rows(Path(result.path), pd.DataFrame())
    return (
        {**result.metrics, **selection(rows.to_dict("records"), select), "round": int(rows["round"].max())}
        if len(rows)
        else result.metrics
    )


def study_storage(path: Path) -> optuna.storages.RDBStorage:
    """The Optuna study kept in an SQLite file; a folder, or a file that cannot be opened, is one sentence."""
    if path.is_dir():
        raise UserError(f"--study-db {path} is a folder; name a file, e.g. {path / 'study.db'}.")
    try:
        return optuna.storages.RDBStorage(f"sqlite:///{path.resolve()}")
    except Exception as e:  # sqlalchemy's OperationalError, or a file that is not SQLite
        reason = first_sentence(getattr(e, "orig", None) or e)
        raise UserError(
            f"--study-db {path} cannot be opened as an SQLite file ({reason}); name a file in a folder you "
            "can write to."
        ) from None


def _plain(obj):
    """YAML-safe copy (numpy scalars to Python)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj.item() if hasattr(obj, "item") else obj
