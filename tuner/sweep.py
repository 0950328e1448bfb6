"""Many federated runs as one Ray Tune experiment: the trainable, the stopping rules, the console.

A sweep directory (`--storage/--name`) holds one Ray Tune experiment per stage, each with an
`experiment.yaml` that `tuner report` reads to rebuild every trial's full RunConfig:

    search/   the Optuna search (OptunaSearch; ASHA and patience stop trials early)
    seeds/    the best configuration rerun with fresh seeds (`--seeds N`)

`tuner reproduce` writes one stage, `reproduce/`, whose trials carry their table cell.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import signal
import sys
import socket
import tempfile
import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
import yaml
import ray
from ray import tune
from ray.tune import Callback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.stopper import CombinedStopper, Stopper
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.config import TRIAL_RETRIES, apply_settings, auto_engine, trial_config, trial_settings, user_path
from tuner.run import FIGURES, SCORE, score, selection
from tuner.errors import DivergedError, Interrupted, OutOfMemory, UserError
from tuner.files import ensure_writable, unwritable_reason, write_atomic, write_text_atomic
from tuner.report import tune_failure
from tuner.space import Space

EXPERIMENT_FILE = "experiment.yaml"
RESERVE_FILE = ".storage-reserve"  # the space StorageWatch gives back when the storage fills
CHECKPOINT_FILE = "simulation.pt"
COMPILE_CACHE = ".compile-cache"  # beside the sweeps of one storage, so later sweeps find their programs compiled


# --- one trial
def federated_trial(config: dict[str, Any], base: dict[str, Any], select: str, report_every: int, compile_cache: str, worker_rounds: int) -> None:
    """Ray Tune function trainable: one federated run, reported every `report_every` rounds, checkpointed whole.
    Compiled programs land in `compile_cache`, which the sweep's trials share (and later sweeps, in a new process,
    read back instead of compiling again); a trial in a reused worker finds them in memory, so engine `auto`
    weighs compiling against the `worker_rounds` its worker runs, not the trial's own."""
    import ray
    import torch

    from tuner.run import build_simulation

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = compile_cache  # read by torch's inductor at each cache look-up

    cfg = trial_config(base, config)
    gpus = ray.get_gpu_ids()
    if cfg.device == "auto":  # the trial's share of the cluster decides, not what the node happens to have
        cfg = apply_settings(cfg, {"device": "cuda" if gpus and torch.cuda.is_available() else "cpu"}, "trial")
    if trial_settings(base, config).get("engine", "auto") == "auto":
        cfg = replace(cfg, engine=auto_engine(cfg.device, worker_rounds, cfg.backbone))
    cpus = int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))
    torch.set_num_threads(max(1, cpus))
    sim = build_simulation(cfg)
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        restore(sim, checkpoint)
    placement = {"node": ray.get_runtime_context().get_node_id(), "gpu_ids": ",".join(map(str, gpus))}
    while sim.round < cfg.rounds:
        try:
            row = sim.step()
        except (DivergedError, OutOfMemory) as e:  # recorded as the trial's failure; the sweep goes on
            # A divergence recurs from any checkpoint (the run is seeded and resumes exactly), so it is not retried;
            # out of memory may be a neighbour's on a shared GPU, so it is.
            failure = {"failed": str(e), "retry": isinstance(e, OutOfMemory)}
            tune.report({**placement, **selection(sim.history, select), "round": sim.round + 1, **failure})
            raise
        checkpoint_due = sim.round == cfg.rounds or sim.round % cfg.checkpoint_every == 0
        if not (checkpoint_due or sim.round % report_every == 0):
            continue
        metrics = {**placement, **row, **selection(sim.history, select)}
        if checkpoint_due:
            with tempfile.TemporaryDirectory() as d:
                write_atomic(Path(d) / CHECKPOINT_FILE, lambda p: torch.save(sim.state_dict(), p))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(metrics)


def restore(sim, checkpoint) -> None:
    """The trial's latest checkpoint, or, where it cannot be read (damaged by a kill or a full disk), the one
    before it (Tune keeps two), saying so on the trial's error stream; none readable: from round 1."""
    import torch

    latest = Path(checkpoint.path)
    older = sorted((p for p in latest.parent.glob("checkpoint_*") if p.name < latest.name), reverse=True)
    for candidate in [latest, *older]:
        try:
            state = torch.load(candidate / CHECKPOINT_FILE, weights_only=False)
        except Exception as e:  # unpickling a damaged file raises anything
            print(f"checkpoint {candidate} cannot be read ({type(e).__name__}: {e}); trying the one before", file=sys.stderr, flush=True)
            continue
        sim.load_state_dict(state)
        if candidate != latest:
            print(f"resumed from {candidate.name}, the checkpoint before the damaged one", file=sys.stderr, flush=True)
        return
    print("no checkpoint of this trial can be read; it starts again from round 1", file=sys.stderr, flush=True)


# --- stopping rules besides ASHA
class Patience(Stopper):
    """Stop a trial whose selected round is more than `patience` rounds old (PFLlib's auto_break)."""

    def __init__(self, patience: int):
        self.patience = patience

    def __call__(self, trial_id, result):
        return result["round"] - result["best_round"] > self.patience

    def stop_all(self):
        return False


class RoundBudget(Stopper):
    """End the sweep once its trials have run `max_total_rounds` rounds together."""

    def __init__(self, max_total_rounds: int):
        self.max_total_rounds = max_total_rounds
        self.rounds: dict[str, int] = {}

    def __call__(self, trial_id, result):
        self.rounds[trial_id] = result["round"]
        return False

    def stop_all(self):
        return sum(self.rounds.values()) >= self.max_total_rounds


def asha(grace: int | None, rounds: int) -> ASHAScheduler | None:
    """ASHA over rounds: a trial reaching a rung below the top quarter of its peers stops there."""
    return ASHAScheduler(time_attr="round", max_t=rounds, grace_period=grace) if grace else None


def stoppers(patience: int | None, max_total_rounds: int | None) -> Stopper | None:
    rules = ([Patience(patience)] if patience else []) + ([RoundBudget(max_total_rounds)] if max_total_rounds else [])
    return CombinedStopper(*rules) if rules else None


# --- the console
class SweepProgress(Callback):
    """Trials running, done, stopped early and failed, and the best so far, on one line (instead of Ray's tables)."""

    def __init__(self, total: int, rounds: int, select: str):
        self.total, self.rounds, self.select = total, rounds, select
        self._reset()

    def _reset(self):
        self.progress = None
        self.running: set[str] = set()
        self.ended: set[str] = set()  # trials counted done
        self.counts = {"early": 0, "failed": 0, "done": 0}
        self.restored = False
        self.best = -math.inf

    def __getstate__(self):  # Tune pickles its callbacks with the experiment; the live display stays behind
        return {"total": self.total, "rounds": self.rounds, "select": self.select}

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "select" not in state:  # saved before the rule had one score: it named its figure
            self.select = "test" if state.get("metric") == "best_acc" else "val"
        self._reset()

    def setup(self, **info):
        self.counts = stage_counts  # run_stage's, whether Tune made this callback or restored it from the experiment
        self.progress = Progress(
            TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
            TextColumn("running {task.fields[running]}  early-stopped {task.fields[early]}  failed {task.fields[failed]}  "
                       f"best {self.select} {{task.fields[best]}}"),
            TimeElapsedColumn(),
        )  # fmt: skip
        self.task = self.progress.add_task("sweep", total=self.total, running=0, early=0, failed=0, best="-")
        self.progress.start()

    def _show(self):
        best = f"{100 * self.best:.2f}%" if self.best > -math.inf else "-"
        done = self.counts["done"] + self.counts["failed"]
        self.progress.update(self.task, completed=done, running=len(self.running), early=self.counts["early"], failed=self.counts["failed"], best=best)

    def on_step_begin(self, iteration, trials, **info):
        self._count_restored(trials)

    def _count_restored(self, trials) -> None:
        """A resumed sweep's trials that finished or failed before count as done: at its first step, before any
        trial ends; or at its end, when every trial had ended before and Tune took no step."""
        if self.restored:
            return
        self.restored = True
        for t in trials:
            if t.status in ("TERMINATED", "ERROR"):
                self.counts["failed" if t.status == "ERROR" else "done"] += 1
                self.counts["early"] += t.status == "TERMINATED" and (t.last_result or {}).get("round", self.rounds) < self.rounds
                self.best = max(self.best, (t.last_result or {}).get(FIGURES[self.select], -math.inf))
        self._show()

    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(trial.trial_id)
        self._show()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        value = result.get(FIGURES[self.select])
        if value is not None and not math.isnan(value):
            self.best = max(self.best, value)
        if not result.get("failed") and result.get("round", 0) >= self.rounds:
            # done once its last round is reported: a stop before Tune completes it must not call it unfinished
            self._count_done(trial, result["round"])
        self._show()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.running.discard(trial.trial_id)
        self._count_done(trial, (trial.last_result or {}).get("round", self.rounds))
        self._show()

    def _count_done(self, trial, last_round: int) -> None:
        if trial.trial_id not in self.ended:
            self.ended.add(trial.trial_id)
            self.counts["done"] += 1
            self.counts["early"] += last_round < self.rounds

    def on_trial_error(self, iteration, trials, trial, **info):
        self.running.discard(trial.trial_id)
        if trial.trial_id in self.ended:  # it failed after its last round: failed, not done
            self.ended.discard(trial.trial_id)
            self.counts["done"] -= 1
        self.counts["failed"] += 1
        reason = ((trial.last_result or {}).get("failed") or (trial.error_file and tune_failure(Path(trial.error_file)))
                  or "it raised an error; see error.txt in its trial directory")  # fmt: skip
        self.progress.console.print(f"[yellow]trial {trial.trial_id} failed:[/] {reason}", highlight=False)
        self._show()

    def on_experiment_end(self, trials, **info):
        self._count_restored(trials)
        self.progress.stop()


class FinalFailures(Callback):
    """A trial that reports a failure it would meet again is failed at once, not retried from its checkpoint."""

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("failed") and not result.get("retry"):
            trial.max_failures = 0  # read by Tune when the trial's error arrives, after this result


STORAGE_RESERVE = 16 * 2**20  # bytes held free in a sweep's storage while it runs, for Ray Tune's last state snapshot
storage_failures: dict[str, str] = {}  # a reserve file -> why its storage failed; set by StorageWatch, read by run_stage
# The running stage's trials done (early-stopped among them) and failed, as SweepProgress counts them: Tune marks a
# trial stopped by Ctrl-C terminated like a finished one, and a restored experiment brings its own callbacks.
stage_counts: dict[str, int] = {}


class StorageWatch(Callback):
    """A failing trial may have met a full or unwritable storage; then every later trial would fail too. The sweep
    then stops as on Ctrl-C, with the reserve given back first: on a full disk Ray Tune cuts short the experiment
    state and the trial files it rewrites, and --resume would find them damaged."""

    def __init__(self, reserve: Path):
        self.reserve = reserve

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._check(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._check(trial)

    def _check(self, trial) -> None:
        if str(self.reserve) in storage_failures:
            return
        checkpoints = sorted(Path(trial.path).glob("checkpoint_*"))  # room for one more checkpoint, or 1 MiB
        room = max(2**20, sum(f.stat().st_size for f in checkpoints[-1].rglob("*") if f.is_file()) if checkpoints else 0)
        reason = unwritable_reason(self.reserve.parent, room)
        if reason:
            storage_failures[str(self.reserve)] = reason
            self.reserve.unlink(missing_ok=True)
            if threading.current_thread() is threading.main_thread():  # where Tune catches it; elsewhere the sweep runs on
                os.kill(os.getpid(), signal.SIGINT)


# --- a whole stage
@dataclass
class Resources:
    cpus_per_trial: float = 1
    gpus_per_trial: float | None = None  # None: 1 / TRIALS_PER_GPU when the cluster has GPUs, else 0
    max_concurrent: int | None = None
    address: str | None = None
    verbose: bool = False
    compile_cache: Path | None = None  # where trials keep compiled programs (torch's on-disk caches); None: beside the sweep


def quiet(verbose: bool) -> None:
    """Ray's and Optuna's own logging only with --verbose: the progress line says what matters."""
    if not verbose:
        warnings.filterwarnings("ignore", module="ray")
        for name in ("ray", "ray.tune", "ray.train"):  # failures reach the progress line as one sentence instead
            logging.getLogger(name).setLevel(logging.CRITICAL)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", message="The reported value is ignored")  # a resumed trial repeats its rounds


def check_request(res: Resources) -> None:
    """What a trial asks for, checked before Ray starts (Ray waits for ever on a request no node can meet)."""
    if not res.cpus_per_trial > 0:
        raise UserError(f"--cpus-per-trial must be positive, not {res.cpus_per_trial:g}.")
    gpus = res.gpus_per_trial
    if gpus is not None and (gpus < 0 or (gpus > 1 and not float(gpus).is_integer())):
        raise UserError(f"--gpus-per-trial must be 0, a fraction of one GPU (0.5) or a whole number of GPUs, not {gpus:g}.")
    if res.max_concurrent is not None and res.max_concurrent < 1:
        raise UserError(f"--max-concurrent must be at least 1, not {res.max_concurrent}.")


def check_fits(request: dict[str, float]) -> None:
    """A trial must fit on one node of the cluster (once connected): else it would never be placed."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if any(n.get("CPU", 0) >= request["cpu"] and n.get("GPU", 0) >= request["gpu"] for n in nodes):
        return
    largest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={})
    raise UserError(
        f"No node of the Ray cluster has {request['cpu']:g} CPUs and {request['gpu']:g} GPUs for one trial (the largest has "
        f"{largest.get('CPU', 0):g} CPUs and {largest.get('GPU', 0):g} GPUs); lower --cpus-per-trial or --gpus-per-trial."
    )


def start_ray(res: Resources) -> None:
    import ray

    quiet(res.verbose)
    check_request(res)
    _check_reachable(res.address)
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    try:
        ray.init(address=res.address, logging_level=logging.INFO if res.verbose else logging.ERROR,
                 log_to_driver=res.verbose, include_dashboard=False, configure_logging=True)  # fmt: skip
    except ConnectionError as e:
        raise UserError(f"Cannot reach a Ray cluster at {res.address}: {e}; start one with `ray start --head` or check --address.") from None
    if threading.current_thread() is threading.main_thread():  # after ray.init, which installs its own handler
        signal.signal(signal.SIGTERM, _stop_like_ctrl_c)


def _check_reachable(address: str | None) -> None:
    """ray.init retries an unreachable head for minutes; a plain TCP connect says so in seconds."""
    if not address or address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or address, int(port or 6379)), timeout=5).close()
    except (OSError, ValueError):
        raise UserError(f"No Ray cluster answers at {address}; start one with `ray start --head` there, or fix --address.") from None


def _stop_like_ctrl_c(signum, frame):
    """SIGTERM (a scheduler's stop) ends a sweep as Ctrl-C does: Ray Tune saves the experiment's state and stops."""
    os.kill(os.getpid(), signal.SIGINT)


# Runs that share one GPU before their total rounds/s stops rising by 10 %: the GPU campaign's sharing
# stage (bench/gpu_campaign.py), H100 80GB, commit 91f1f1c, eager engine: k=1 0.24, k=2 0.47 rounds/s
# (the stage ran out of time before k=4). Measure again with the compiled engine, which busies one GPU more.
TRIALS_PER_GPU = 2


def trial_resources(res: Resources) -> dict[str, float]:
    import ray

    gpus = res.gpus_per_trial
    if gpus is None:
        gpus = 1 / TRIALS_PER_GPU if ray.cluster_resources().get("GPU", 0) > 0 else 0
    return {"cpu": res.cpus_per_trial, "gpu": gpus}


def worker_rounds(request: dict[str, float], trials: int, rounds: int, max_concurrent: int | None, cluster: dict) -> int:
    """The rounds one worker runs in a stage: its share of the trials (Tune reuses workers, and their programs)."""
    workers = int(cluster.get("CPU", 1) // request["cpu"])
    if request["gpu"]:
        workers = min(workers, int(cluster.get("GPU", 0) // request["gpu"]))
    return rounds * math.ceil(trials / max(1, min(workers, max_concurrent or workers, trials)))


def write_experiment(path: Path, stage: str, base: dict[str, Any], select: str, **extra) -> None:
    path.mkdir(parents=True, exist_ok=True)
    info = {"stage": stage, "select": select, "settings": base, **extra}
    write_text_atomic(path / EXPERIMENT_FILE, yaml.safe_dump(info, sort_keys=False))


def run_stage(
    sweep_dir: Path, stage: str, base: dict[str, Any], select: str, report_every: int, res: Resources,
    *, param_space: dict | None = None, searcher=None, scheduler=None, stopper=None, samples: int = 1, expected: int | None = None,
    rounds: int, resume: bool, extra: dict | None = None, budget: int | None = None,
):  # fmt: skip
    """Run (or continue) one Ray Tune experiment in sweep_dir/stage and return its ResultGrid."""
    check_request(res)  # before anything is written or started
    ensure_writable(sweep_dir, "the sweep's storage")
    start_ray(res)
    path = sweep_dir / stage
    request = trial_resources(res)
    check_fits(request)
    cache = str(res.compile_cache or sweep_dir.parent / COMPILE_CACHE)
    shared_rounds = worker_rounds(request, samples if expected is None else expected, rounds, res.max_concurrent, ray.cluster_resources())
    trainable = tune.with_parameters(federated_trial, base=base, select=select, report_every=report_every, compile_cache=cache, worker_rounds=shared_rounds)
    trainable = tune.with_resources(trainable, request)
    if resume and tune.Tuner.can_restore(str(path)):  # finished and failed trials stay as they are
        drop_damaged_errors(path)
        tuner = tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=False)
    else:
        write_experiment(path, stage, base, select, **(extra or {}))
        tuner = tune.Tuner(
            trainable,
            param_space=param_space or {},
            tune_config=tune.TuneConfig(metric=SCORE, mode="max", search_alg=searcher, scheduler=scheduler,
                                        num_samples=samples, max_concurrent_trials=res.max_concurrent,
                                        # a trial is seeded and built whole from its config, so a worker that ran
                                        # one runs the next alike, without the ~2.5 s of starting and importing torch
                                        reuse_actors=True),  # fmt: skip
            run_config=tune.RunConfig(
                name=stage, storage_path=str(sweep_dir), stop=stopper,
                callbacks=[SweepProgress(expected or samples, rounds, select), FinalFailures(), StorageWatch(sweep_dir / RESERVE_FILE)],
                # Two checkpoints: a kill while a new one registers can leave the saved experiment state
                # pointing at the one before, which keeping one alone would already have deleted.
                verbose=2 if res.verbose else 0, checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
            ),
        )
    reserve = sweep_dir / RESERVE_FILE
    storage_failures.pop(str(reserve), None)
    stage_counts.update(early=0, failed=0, done=0)
    try:
        reason = unwritable_reason(sweep_dir, STORAGE_RESERVE, keep_as=reserve)
        if reason:
            raise storage_failed(sweep_dir, reason)
        grid = tuner.fit()
    except Exception as e:  # the storage filled up or went away under Ray Tune's own writes, or a trial met it
        reason = storage_failures.pop(str(reserve), None) or (e.strerror if isinstance(e, OSError) else None)
        if reason is None or isinstance(e, UserError):
            raise
        raise storage_failed(sweep_dir, reason) from None
    finally:
        reserve.unlink(missing_ok=True)
    if str(reserve) in storage_failures:
        raise storage_failed(sweep_dir, storage_failures.pop(str(reserve)))
    ended = stage_counts["done"] + stage_counts["failed"]  # a trial stopped by Ctrl-C is neither; one never begun neither
    spent = sum((r.metrics or {}).get("round", 0) for r in grid)
    unfinished = 0 if budget is not None and spent >= budget else (expected or samples) - ended  # a spent budget ends trials
    if unfinished:  # Ray stopped on Ctrl-C / SIGTERM after saving the experiment's state
        raise Interrupted(
            f"Stopped with {unfinished} trials unfinished; finished trials and checkpoints are in {path}. "
            "Run the same command with --resume to continue."
        )
    return grid


def storage_failed(sweep_dir: Path, reason: str) -> UserError:
    return UserError(
        f"Cannot write to the sweep's storage {sweep_dir} ({reason}); the sweep stopped and what is already there stays: "
        "free space or fix the folder, then run the same command with --resume."
    )


def drop_damaged_errors(path: Path) -> None:
    """A trial's pickled error cut short (a full disk, a kill mid-write) would stop Tune from reading the experiment;
    without it Tune reads the same error from error.txt."""
    for pickled in path.glob("*/error.pkl"):
        try:
            with open(pickled, "rb") as f:
                pickle.load(f)
        except (EOFError, pickle.UnpicklingError):
            pickled.unlink()


def seed_grid(seeds: list[int], vary_partition: bool) -> dict:
    """Tune's grid over seeds: the run seed alone (one partition, as the papers), or each seed with its own partition."""
    if vary_partition:
        return {"seeding": tune.grid_search([{"seed": s, "partition_seed": s} for s in seeds])}
    return {"seed": tune.grid_search(seeds)}


def sweep(space: Space, sweep_dir: Path, res: Resources, *, seeds: int = 0, vary_partition: bool = False, resume: bool = False,
          study_db: Path | None = None) -> dict:  # fmt: skip
    """The search stage, then the seed reruns of its best configuration; returns the best trial's figures."""
    from ray.tune.search.optuna import OptunaSearch

    quiet(res.verbose)
    sweep_dir = user_path(sweep_dir)  # Ray and pyarrow read a relative path as a URI without a scheme
    search_dir = sweep_dir / "search"
    if not resume and search_dir.exists():
        raise UserError(f"{sweep_dir} already holds a sweep; pass --resume to continue it, or --name to start another.")
    if resume and not search_dir.exists():
        raise UserError(f"{sweep_dir} holds no sweep to resume; drop --resume to start it.")
    base = {"method": space.method, **space.settings}
    cfg = space.base_config()
    restoring = resume and tune.Tuner.can_restore(str(search_dir))
    searcher = None
    if not restoring:  # a restored sweep brings its own searcher; a new one would enqueue the default point again
        storage = optuna.storages.RDBStorage(f"sqlite:///{study_db.resolve()}") if study_db else None
        searcher = OptunaSearch(
            space=space.search, metric=SCORE, mode="max", sampler=space.make_sampler(cfg.seed), storage=storage,
            study_name=sweep_dir.name, points_to_evaluate=None if space.sampler == "grid" else [space.defaults()],
        )  # fmt: skip
    grid = run_stage(
        sweep_dir, "search", base, space.select, space.report_every, res,
        searcher=searcher, scheduler=asha(space.stop.grace, cfg.rounds), stopper=stoppers(space.stop.patience, space.stop.max_total_rounds),
        samples=space.samples, rounds=cfg.rounds, resume=restoring, budget=space.stop.max_total_rounds,
        extra={"method": space.method, "space": space.source, "sampler": space.sampler},
    )  # fmt: skip
    best = _best(grid, space.select)
    if best is None:
        raise UserError(f"No trial of {sweep_dir} reported a result; see the error.txt files under {search_dir}.")
    summary = {"best_config": dict(best.config), "best": {k: best.metrics.get(k) for k in ("best_acc", "selected_acc", "best_round", "best_val_acc", "best_val_round")}}
    if seeds:
        seeds_grid = run_stage(
            sweep_dir, "seeds", base, space.select, space.report_every, res,
            param_space={**best.config, **seed_grid(list(range(cfg.seed + 1, cfg.seed + 1 + seeds)), vary_partition)},
            stopper=stoppers(space.stop.patience, None), samples=1, expected=seeds, rounds=cfg.rounds,
            resume=resume, extra={"method": space.method, "best_of": "search"},
        )  # fmt: skip
        accs = [r.metrics.get("selected_acc") for r in seeds_grid if r.metrics and r.error is None]
        summary["seeds"] = accs
    write_text_atomic(sweep_dir / "summary.yaml", yaml.safe_dump(_plain(summary), sort_keys=False))
    return summary


def _best(grid, select: str):
    """The best trial by the selection rule (its score); of equal scores, the first trial."""
    scores = [(_score(r.metrics, select), r) for r in grid if r.metrics]
    return max(((v, r) for v, r in scores if not math.isnan(v)), key=lambda vr: vr[0], default=(None, None))[1]


def _score(metrics: dict, select: str) -> float:
    """A trial's score; a sweep resumed from before scores were reported is scored from its figures alike."""
    if SCORE in metrics:
        return metrics[SCORE]
    figure, at = metrics.get(FIGURES[select]), metrics.get("best_round")
    return math.nan if figure is None or at is None or math.isnan(figure) or math.isnan(at) else score(figure, at)


def _plain(obj):
    """YAML-safe copy (numpy scalars to Python)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj.item() if hasattr(obj, "item") else obj
