"""One runner for every experiment: a stage described as data (`Stage`) run as one Ray Tune experiment, and the
folder a plan of stages writes in held (`holding`). `tuner sweep` (tuner/sweep/stages.py), `tuner reproduce` and
the tuned comparison (tuner/experiments/) build their stages and read their results; locking, resuming, a saved
state that cannot be resumed, a stop and the trials it left unfinished are this module's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
import yaml
from ray import tune
from ray.tune import Result

from tuner.engine.compile import COMPILE_CACHE
from tuner.errors import Interrupted, UserError
from tuner.files import ensure_writable, folder_lock, user_path, write_text_atomic
from tuner.selection import SCORE, trial_dirname
from tuner.sweep.cluster import Resources, check_fits, check_request, start_ray, trial_resources, worker_rounds
from tuner.sweep.console import SweepProgress, stage_counts
from tuner.sweep.pack_host import AUTO_PACK, PACK_TRIAL_CPUS, start_hosts, stop_hosts
from tuner.sweep.recovery import (
    RESERVE_FILE,
    ProgressRows,
    ResultRows,
    StorageWatch,
    drop_damaged_errors,
    refuse_damaged_state,
    requeue_lost_trials,
    stopping_cleanly,
)
from tuner.sweep.stopping import FinalFailures
from tuner.sweep.storage import whole_file_storage
from tuner.sweep.trainable import federated_trial
from tuner.sweep.trials import TRIAL_RETRIES

EXPERIMENT_FILE = "experiment.yaml"
Trainable = Any  # Tune's trainable with its parameters and resources bound (tune.with_resources)


@dataclass(frozen=True)
class Stage:
    """One Ray Tune experiment, in its folder `name` under the plan's: the trials' fixed settings (`base`), what
    they search (`searcher`, or Tune's domains and grids in `param_space`), how they stop and are chosen, and what
    its experiment.yaml records beside them for the report (`record`)."""

    name: str
    base: dict[str, Any]
    rounds: int
    select: str = "val"
    param_space: dict[str, Any] = field(default_factory=dict)
    searcher: Any = None  # Optuna's, a population's first draws, or one search a table cell
    scheduler: Any = None
    stopper: Any = None
    samples: int = 1
    expected: int | None = None  # its trials, where grids multiply the samples
    sharing: int | None = None  # how many of its trials run one method in one setting [default: all of them]
    report_every: int = 1
    budget: int | None = None  # rounds over all trials; a budget spent ends the trials it stopped
    keep_checkpoints: int = 2
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def trials(self) -> int:
        return self.samples if self.expected is None else self.expected


@contextmanager
def holding(folder: Path, noun: str, change: str, started: str, resume: bool, res: Resources) -> Iterator[Path]:
    """The folder a plan of stages writes in (`noun`: a sweep, a reproduction, a comparison), held by this process
    while it runs: a second command on it is refused in one sentence naming the holder, as is a folder that
    already holds the plan (its `started` file or folder exists) where --resume was not asked, or holds none to
    resume. The cluster's request and the storage are checked before anything is written. `change`: the option
    the user may change instead."""
    folder = user_path(folder)  # Ray and pyarrow read a relative path as a URI without a scheme
    if not resume and (folder / started).exists():
        raise UserError(f"{folder} already holds a {noun}; pass --resume to continue it, or {change}.")
    if resume and not (folder / started).exists():
        raise UserError(f"{folder} holds no {noun} to resume; drop --resume to start it.")
    check_request(res)  # a request no node meets, and a storage that cannot be written, before the lock
    ensure_writable(folder, "the sweep's storage")
    with folder_lock(folder, f"The {noun}", change):
        yield folder


def run_stage(folder: Path, stage: Stage, res: Resources, resume: bool) -> list[Result]:
    """Run (or continue, where `resume` and its saved state exist) one stage in folder/stage.name; returns its
    trials' results. Ends in Interrupted where a stop left trials unfinished."""
    check_request(res)  # before anything is written or started
    ensure_writable(folder, "the sweep's storage")
    start_ray(res)
    path = folder / stage.name
    cache = str(res.compile_cache or folder.parent / COMPILE_CACHE)
    if res.pack == 0:  # auto: by the cluster's devices
        res = replace(res, pack=AUTO_PACK["cuda" if ray.cluster_resources().get("GPU", 0) else "cpu"])
    hosts = start_hosts(res.pack, res.cpus_per_trial, cache) if res.pack > 1 else []
    if hosts and res.max_concurrent is None:
        res = replace(res, max_concurrent=res.pack * len(hosts))
    try:
        return _run(folder, path, stage, res, resume, _trainable(folder, stage, res, hosts))
    finally:
        stop_hosts(hosts)


def _run(folder: Path, path: Path, stage: Stage, res: Resources, resume: bool, trainable: Trainable) -> list[Result]:
    if resume and tune.Tuner.can_restore(str(path)):  # finished and failed trials stay as they are
        refuse_damaged_state(path)
        drop_damaged_errors(path)
        tuner = restored(path, trainable)
    else:
        path.mkdir(parents=True, exist_ok=True)
        info = {"stage": stage.name, "select": stage.select, "settings": stage.base, **stage.record}
        write_text_atomic(path / EXPERIMENT_FILE, yaml.safe_dump(info, sort_keys=False))
        tuner = _new_tuner(folder, stage, res, trainable)
    stage_counts.update(early=0, failed=0, done=0)
    with stopping_cleanly(folder) as going_on:
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
    results = [grid[i] for i in range(len(grid))]
    spent = sum((r.metrics or {}).get("round", 0) for r in results)
    unfinished = 0 if stage.budget is not None and spent >= stage.budget else stage.trials - ended
    if unfinished:  # Ray stopped on Ctrl-C / SIGTERM after saving the experiment's state
        raise Interrupted(
            f"Stopped with {unfinished} trials unfinished; finished trials and checkpoints are in {path}. "
            "Run the same command with --resume to continue."
        )
    return results


def _trainable(folder: Path, stage: Stage, res: Resources, hosts: list) -> Trainable:
    """The federated trial with its stage's constants, asking for its share of a node (a packed trial: a sliver,
    as its host computes)."""
    request = {"cpu": PACK_TRIAL_CPUS, "gpu": 0} if hosts else trial_resources(res)
    check_fits(request)
    shared_rounds = worker_rounds(
        request, stage.sharing or stage.trials, stage.rounds, res.max_concurrent, ray.cluster_resources()
    )
    trainable = tune.with_parameters(
        federated_trial,
        base=stage.base,
        select=stage.select,
        report_every=stage.report_every,
        compile_cache=str(res.compile_cache or folder.parent / COMPILE_CACHE),
        worker_rounds=shared_rounds,
        hosts=hosts,
    )
    return tune.with_resources(trainable, request)


def _new_tuner(folder: Path, stage: Stage, res: Resources, trainable: Trainable) -> tune.Tuner:
    return tune.Tuner(
        trainable,
        param_space=stage.param_space,
        tune_config=tune.TuneConfig(
            metric=SCORE,
            mode="max",
            search_alg=stage.searcher,
            scheduler=stage.scheduler,
            num_samples=stage.samples,
            max_concurrent_trials=res.max_concurrent,
            # a trial is seeded and built whole from its config, so a worker that ran
            # one runs the next alike, without the ~2.5 s of starting and importing torch
            reuse_actors=True,
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=stage.name,
            storage_path=str(folder),
            storage_filesystem=whole_file_storage(),
            stop=stage.stopper,
            callbacks=[
                SweepProgress(stage.trials, stage.rounds, stage.select),
                FinalFailures(),
                StorageWatch(folder / RESERVE_FILE),
                ResultRows(),  # in place of Ray Tune's own writers of these files
                ProgressRows(),
            ],
            # Two checkpoints: a kill while a new one registers can leave the saved experiment state
            # pointing at the one before, which keeping one alone would already have deleted.
            verbose=2 if res.verbose else 0,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=stage.keep_checkpoints),
            failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
        ),
    )


def restored(path: Path, trainable: Trainable) -> tune.Tuner:
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
