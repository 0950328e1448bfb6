"""One federated run as a Ray Tune trial: built from its configuration, reported every few rounds with the
selection rule's figures, checkpointed whole, and restored from its latest readable checkpoint, or from another
trial's (population-based training's exploit: this trial's settings over the donor's state).

Beside each checkpoint, `rounds.parquet` holds every round its state went through: the round's figures, the
trial that ran it, when it ended, and the values of the trial's searched settings then (its schedule,
tuner/settings/schedule.py; a donor's rounds come with its state). A trial handed a donor's state from the donor's last
round has no round left to run and reports that state as its own, so its folder ends with it."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune

if TYPE_CHECKING:
    from tuner.engine.simulation import Simulation

from tuner.errors import DivergedError, OutOfMemory, UserError
from tuner.files import write_atomic
from tuner.selection import selection

CHECKPOINT_FILE = "simulation.pt"


def federated_trial(
    config: dict[str, Any],
    base: dict[str, Any],
    select: str,
    report_every: int,
    compile_cache: str,
    worker_rounds: int,
    hosts: list | None = None,
) -> None:
    """Ray Tune function trainable: one federated run, reported every `report_every` rounds, checkpointed whole.
    Compiled programs land in `compile_cache`, which the sweep's trials share (and later sweeps, in a new process,
    read back instead of compiling again); a trial in a reused worker finds them in memory, so engine `auto`
    weighs compiling against the `worker_rounds` its worker runs, not the trial's own. `hosts`: a packed sweep's
    PackHosts (tuner/sweep/pack_host.py), where the run lives, in the least held host of the trial's node."""
    # torch and the engine are imported by the trial, not when Tune starts the worker: a worker started for a trial
    # that a reused one then took is stopped at once, where Tune would wait up to 5 s for its imports to end.
    import ray
    import torch

    from tuner.engine.compile import use_cache
    from tuner.federated_run import build_simulation
    from tuner.plugins import method_class
    from tuner.settings.schedule import RAN_AT, ROUNDS_FILE, write_rounds
    from tuner.sweep.trials import trial_config, trial_settings

    use_cache(compile_cache)

    searched = {k: v for k, v in config.items() if not isinstance(v, dict)}  # the schedule's columns
    trial = tune.get_context().get_trial_name()
    settings, gpus, node = trial_settings(base, config), ray.get_gpu_ids(), ray.get_runtime_context().get_node_id()
    placement = {"node": node, "gpu_ids": ",".join(map(str, gpus))}
    config = placed(config, settings, gpus, bool(hosts))
    sim: Any = None
    packed = False
    try:
        cfg = trial_config(base, config, worker_rounds)
        packed = bool(hosts) and not method_class(cfg.method).unpackable  # such a method's runs run alone
        sim = (
            hosted(hosts or [], node, trial_settings(base, config), worker_rounds) if packed else build_simulation(cfg)
        )

        def report(checkpointed: bool, handed_over: bool = False) -> None:
            """The state's last round, with the selection rule's figures (and the whole state where checkpointed);
            `handed_over`: a donor's state reported as this trial's, a round it did not train."""
            # when, to the microsecond (Ray's timestamp is whole seconds): trials of a second are ordered by it
            metrics = {**placement, "reported_at": time.time(), **sim.history[-1], **selection(sim.history, select)}
            if handed_over:
                metrics["handed_over"] = True
            if not checkpointed:
                tune.report(metrics)
                return
            with tempfile.TemporaryDirectory() as d:
                write_atomic(Path(d) / CHECKPOINT_FILE, lambda p: torch.save(sim.state_dict(), p))
                write_rounds(Path(d) / ROUNDS_FILE, sim.history, schedule, list(searched))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))

        checkpoint = tune.get_checkpoint()
        schedule = restore(sim, checkpoint) if checkpoint else []
        if (
            checkpoint
            and sim.round >= cfg.rounds
            and Path(checkpoint.path).parent.name != Path(tune.get_context().get_trial_dir()).name
        ):
            # PBT may hand over a donor's state from its last round (the donor not yet seen finished): this trial
            # ends with that state, recorded as its own (its own state at its last round was recorded when run)
            report(checkpointed=True, handed_over=True)
        while sim.round < cfg.rounds:
            sim.step()
            schedule.append({"round": sim.round, "trial": trial, RAN_AT: time.time(), **searched})
            checkpoint_due = sim.round == cfg.rounds or sim.round % cfg.checkpoint_every == 0
            if checkpoint_due or sim.round % report_every == 0:
                report(checkpointed=checkpoint_due)
    except UserError as e:  # recorded as the trial's failure, with its kind; the sweep goes on
        report_failure(e, sim, placement, select)
        raise
    finally:  # a packed trial leaves its host: ended, failed, or stopped by its scheduler (Tune's SystemExit)
        if packed and sim is not None:
            sim.close()


def placed(config: dict[str, Any], settings: dict[str, Any], gpus: list, packed: bool) -> dict[str, Any]:
    """The trial's config on its device, its threads its CPUs: the trial's share of the cluster decides, not what the
    node happens to have (a packed trial's device is its host's)."""
    import ray
    import torch

    torch.set_num_threads(max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))))
    if settings.get("device", "auto") == "auto" and not packed:
        return {**config, "device": "cuda" if gpus and torch.cuda.is_available() else "cpu"}
    return config


def hosted(hosts: list, node: str, settings: dict[str, Any], worker_rounds: int) -> Any:
    """The trial's run in the least held PackHost of its node (tuner/sweep/pack_host.py)."""
    from tuner.sweep.pack_host import HostedRun, least_held

    return HostedRun(least_held(hosts, node), tune.get_context().get_trial_id(), settings, worker_rounds)


def report_failure(e: UserError, sim: Simulation | None, placement: dict, select: str) -> None:
    """A trial's failure reported with its kind. Out of memory may be a neighbour's on a shared GPU, so it is
    retried; a divergence recurs from any checkpoint (the run is seeded and resumes exactly), and a setting the run
    refuses is refused again."""
    history, at = (sim.history, sim.round + 1) if sim else ([], 0)
    kind = "out of memory" if isinstance(e, OutOfMemory) else "diverged" if isinstance(e, DivergedError) else "refused"
    tune.report(
        {
            **placement,
            **selection(history, select),
            "round": at,
            "failed": str(e),
            "failed_kind": kind,
            "retry": kind == "out of memory",
        }
    )


def restore(sim: Simulation, checkpoint: tune.Checkpoint) -> list[dict]:
    """The trial's latest checkpoint, or, where it cannot be read (damaged by a kill or a full disk), the one
    before it (Tune keeps two), saying so on the trial's error stream; none readable: from round 1. Returns the
    schedule that brought the state there (a donor's, after an exploit)."""
    import torch

    from tuner.settings.schedule import ROUNDS_FILE, read_rounds

    latest = Path(checkpoint.path)
    older = sorted((p for p in latest.parent.glob("checkpoint_*") if p.name < latest.name), reverse=True)
    for candidate in [latest, *older]:
        try:
            # tensors and numbers only: never runs code
            state = torch.load(candidate / CHECKPOINT_FILE, weights_only=True)
        except Exception as e:  # unpickling a damaged file raises anything
            print(
                f"checkpoint {candidate} cannot be read ({type(e).__name__}: {e}); trying the one before",
                file=sys.stderr,
                flush=True,
            )
            continue
        sim.load_state_dict(state)
        if candidate != latest:
            print(f"resumed from {candidate.name}, the checkpoint before the damaged one", file=sys.stderr, flush=True)
        rounds = candidate / ROUNDS_FILE
        return [r for r in read_rounds(rounds)[0] if r["round"] <= sim.round] if rounds.exists() else []
    print("no checkpoint of this trial can be read; it starts again from round 1", file=sys.stderr, flush=True)
    return []
