"""Assemble a simulation from a RunConfig, and run it with its results written as it goes into its folder
(tuner/run_folder.py), so a stopped run resumes exactly and a diverging one keeps its rows."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from algorithms.base import Method, Unsupported
from algorithms.net import Net
from algorithms.rounds import Federation, Training
from tuner.data.dataset import Dataset
from tuner.data.datasets import load_dataset
from tuner.data.federated import FederatedData, build
from tuner.data.partition import PartitionSpec, partition
from tuner.data.user_data import is_user_data
from tuner.engine.executors import EngineSettings
from tuner.engine.simulation import Simulation
from tuner.errors import UserError
from tuner.files import ensure_writable, folder_lock, write_atomic
from tuner.models import build_backbone, with_conv_form
from tuner.plugins import method_class
from tuner.run_folder import RunDir
from tuner.settings.config import RunConfig, RunPlan, apply_settings
from tuner.settings.schedule import SCHEDULE_FILE, load_schedule, settings_at

Decode = Callable[[torch.Tensor], torch.Tensor]  # stored samples to model inputs
PARTITION_BATCH = 10  # PFLlib's generators fix the floor with their batch of 10, whatever batch a run trains with


def partition_spec(cfg: RunPlan, ds: Dataset) -> PartitionSpec:
    """The partition depends on the data settings only: never on the run's seed or batch size."""
    kind, value = cfg.split
    n = len(ds.y)
    min_samples = cfg.min_samples
    if min_samples is None and kind == "natural":  # the user's clients, every one, unless min_samples leaves some out
        min_samples = 0
    elif min_samples is None:  # PFLlib's floor: a few batches of training data, at most half a fair share
        min_samples = int(min(PARTITION_BATCH / (1 - cfg.train_frac), n / cfg.clients / 2))
    grey = ds.kind == "image" and ds.input_shape[0] == 1
    return PartitionSpec(
        kind=kind,
        value=value,
        clients=cfg.clients,
        seed=cfg.partition_seed,
        train_frac=cfg.train_frac,
        val_frac=cfg.val_frac,
        val_seed=cfg.val_seed,
        min_samples=min_samples,
        balance=cfg.balance,
        groups=cfg.groups,
        pac_train=cfg.pac_train or (1000 if ds.name == "emnist" else 600),
        pac_test=cfg.pac_test or (600 if grey else 300),
    )


def build_data(cfg: RunPlan, device: torch.device) -> FederatedData:
    ds = load_dataset(cfg.dataset, cfg.data_dir, cfg.download)
    if cfg.augment and ds.kind != "image":
        raise UserError(f"augment=true crops and flips images; {cfg.dataset} holds {ds.kind} data.")
    spec = partition_spec(cfg, ds)
    if spec.kind == "natural" and ds.owners is None:
        raise UserError(
            f"Partition natural keeps the clients of the data, and {cfg.dataset} names none; give it a client "
            "column, or choose iid, pat:N, dir:BETA."
        )
    cache = "" if is_user_data(cfg.dataset) else ds.name
    part = partition(
        ds.y.numpy(), ds.num_classes, spec, ds.pac_groups, dataset=cache, owners=ds.owners, is_train=ds.is_train
    )
    data = build(ds, part, cfg.shift, cfg.partition_seed, cfg.normalize, device)
    check_scored(cfg, data, own_split=spec.kind == "natural" and ds.is_train is not None)
    return data


def check_batches(cfg: RunPlan, data: FederatedData) -> None:
    """Every client trains: one full batch at least (the last partial batch is dropped, as PFLlib does)."""
    counts = data.train.counts
    short = [i for i, n in enumerate(counts) if n < cfg.batch_size]
    if not short:
        return
    smallest = min(short, key=counts.__getitem__)
    fewest = counts[smallest]
    where = (
        f"{len(short)} of its {len(counts)} clients have fewer training samples than one batch of {cfg.batch_size} "
        f"(the fewest: client {data.client_name(smallest)}, {fewest})"
    )
    # its clients are the data's: fewer clients or a new draw do not apply
    if cfg.split.kind == "natural":
        raise UserError(
            f"{cfg.dataset}: {where}; use batch_size={fewest} or less, or leave such clients out with "
            f"--set min_samples={cfg.batch_size} (natural partitions keep the clients with that many training samples)."
        )
    smaller = f", batch_size={fewest} or less" if fewest else ""
    raise UserError(
        f"Partition {cfg.partition} of {cfg.dataset}: {where}; use fewer clients{smaller}, "
        f"or min_samples={cfg.batch_size} or more (redrawn until every client has that many)."
    )


def check_scored(cfg: RunPlan, data: FederatedData, own_split: bool) -> None:
    """Every client is scored: a mean over fewer clients than the run names would be another experiment."""
    splits = [("test", data.test)] + ([("validation", data.val)] if cfg.val_frac > 0 else [])
    for split, part in splits:
        counts = part.counts if part is not None else [0] * data.num_clients  # no client drew a validation row
        empty = [i for i, n in enumerate(counts) if n == 0]
        if not empty:
            continue
        names = ", ".join(data.client_name(i) for i in empty[:5]) + (", ..." if len(empty) > 5 else "")
        if split == "validation":
            fix = f"raise val_frac above {cfg.val_frac:g}, or leave small clients out with min_samples"
        elif own_split:  # the data's own test rows
            fix = "give those clients rows whose split is test, or drop their rows"
        elif cfg.split.kind == "natural":  # too few rows for 25 % to round to one
            fix = (
                "leave such small clients out with --set min_samples=N (natural partitions keep the clients "
                "with N training samples or more)"
            )
        else:
            fix = f"lower train_frac below {cfg.train_frac:g}, or use fewer clients"
        raise UserError(
            f"{cfg.dataset}: {len(empty)} clients have no {split} sample and would never be scored (client "
            f"{names}); {fix}."
        )


def build_simulation(cfg: RunConfig, data: FederatedData | None = None) -> Simulation:
    """The simulation a configuration describes: the edge where code that writes its own RunConfig (a benchmark,
    a notebook, a plan's settings() changed) has it planned; settings from files and options arrive planned by
    tuner.settings.config.resolve_layers, and a plan is taken as it is.

    Args:
        cfg: the run's settings, planned here if they are not yet.
        data: the clients' data already on the run's device (a benchmark's), else loaded and partitioned from cfg.

    Returns:
        a Simulation at round 0: `step()` trains a round, `history` holds the rows, `executor.ran` what ran.

    Raises:
        UserError: a setting the run refuses, data it cannot load, a backbone or method that cannot run it.
    """
    return planned_simulation(cfg, data)[1]


def planned_simulation(cfg: RunConfig, data: FederatedData | None = None) -> tuple[RunPlan, Simulation]:
    """The run's plan and its simulation (build_simulation)."""
    plan, data = planned_data(cfg, data)
    return plan, Simulation(build_method(plan, data), data, engine_settings(plan))


def planned_data(cfg: RunConfig, data: FederatedData | None) -> tuple[RunPlan, FederatedData]:
    """The run's plan and its data on its device, decoded to its float type."""
    plan = cfg.resolved()
    device = torch.device(plan.device)
    if plan.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for deterministic matmuls
    torch.use_deterministic_algorithms(plan.deterministic)  # per run: a process may build several
    data = data or build_data(plan, device)
    check_batches(plan, data)
    if plan.dtype != "float32":
        data = replace(data, decode=_decoding_to(getattr(torch, plan.dtype), data.decode))
    return plan, data


def engine_settings(plan: RunPlan) -> EngineSettings:
    return EngineSettings(
        seed=plan.seed,
        join_ratio=plan.join,
        eval_gap=plan.eval_gap,
        executor=plan.executor,
        engine=plan.engine,
        cohort_chunk=plan.cohort_chunk,
        steps_per_call=plan.steps_per_call,
        eval_batch=plan.eval_batch,
        augment=plan.augment,
        full_last_round=plan.full_last_round,
    )


def build_method(cfg: RunPlan, data: FederatedData) -> Method:
    """The run's method over its backbone, both drawn from the run's seed (the same for every executor and resume);
    `cfg` resolved."""
    method_cls = method_class(cfg.method)
    training = Training(
        lr=cfg.lr,
        local_epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        num_classes=data.num_classes,
        clients=data.num_clients,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        rounds=cfg.rounds,
        participation=sum(cfg.join) / 2,
        seed=cfg.seed,
        federation=Federation(
            class_counts=tuple(torch.bincount(data.train.y.cpu(), minlength=data.num_classes).tolist()),
            client_samples=tuple(int(c) for c in data.train.counts),
            participation_max=cfg.join[1],
        ),
    )
    with torch.random.fork_rng(devices=[]):  # the CPU generator alone: it is restored after, and no device draws
        torch.random.default_generator.manual_seed(cfg.seed)
        backbone = with_conv_form(
            build_backbone(cfg.backbone, data.input_shape, data.num_classes, data.vocab), cfg.conv_form
        ).to(torch.device(cfg.device), getattr(torch, cfg.dtype))
        try:
            return method_cls(Net(backbone), training, method_cls.Hparams(**cfg.hparams))
        except Unsupported as e:
            raise UserError(str(e)) from None


def _decoding_to(dtype: torch.dtype, decode: Decode) -> Decode:
    """Model inputs in the run's float type (token ids stay integers). A decoding that already gives them (a rebuilt
    run's data) is kept as it is: wrapped twice, it would be another function to a compiled program, which then
    compiles again."""
    if getattr(decode, "float_type", None) == dtype:
        return decode

    def decoded(x: torch.Tensor) -> torch.Tensor:
        out = decode(x)
        return out.to(dtype) if out.is_floating_point() else out

    decoded.float_type = dtype  # type: ignore[attr-defined]
    return decoded


def rebuilt(sim: Simulation, cfg: RunConfig) -> Simulation:
    """`sim`'s state under other settings: a new simulation of cfg on the same data, holding what sim holds (an
    exploit of population-based training does the same from a checkpoint)."""
    new = build_simulation(cfg, data=sim.data)
    new.load_state_dict(sim.state_dict())
    return new


def run(
    cfg: RunConfig,
    out: str | Path,
    resume: bool = False,
    on_round: Callable[[dict], None] | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
    schedule: pd.DataFrame | None = None,
) -> Simulation:
    """Run cfg.rounds rounds of a resolved configuration (resume: from the checkpoint in `out`), writing results there.
    When `stop_requested()` turns true the run stops at the end of its round with a checkpoint, so --resume
    continues it; an exception mid-round keeps the rows, and the last checkpoint stays the one before.

    Args:
        cfg: the run's settings (`tuner run` resolves them from what was typed).
        out: the run's folder: config.yaml, metrics.parquet (a row a round) and checkpoint.pt.
        resume: continue the run in `out` from its checkpoint up to cfg.rounds.
        on_round: called with each round's row as it is written.
        stop_requested: polled after each round.
        schedule: settings round by round (tuner.settings.schedule.load_schedule's table), replayed from round 1;
            the run keeps a copy, which a resume replays on.

    Returns:
        the Simulation, at the round it stopped.

    Raises:
        UserError: `out` holds a run and `resume` is false; a resume finds no readable checkpoint, or asks for no
            more rounds than were run; another command holds `out`; or the settings are refused.
    """
    run_dir = RunDir(out)
    created = not run_dir.path.exists()
    ensure_writable(run_dir.path, "the run folder")  # before hours of training, not after
    if not resume and run_dir.config.exists():
        raise UserError(f"{run_dir.path} holds a run already; pass --resume to continue it, or choose another --out.")
    try:
        with folder_lock(run_dir.path, "The run folder", "choose another --out"):
            return _run(cfg, run_dir, resume, on_round, stop_requested, schedule)
    finally:  # a run refused before its first file (missing data, a bad setting) leaves no empty folder behind
        if created and run_dir.path.is_dir() and not any(run_dir.path.iterdir()):
            run_dir.path.rmdir()


def _run(
    cfg: RunConfig,
    run_dir: RunDir,
    resume: bool,
    on_round: Callable[[dict], None] | None,
    stop_requested: Callable[[], bool],
    schedule: pd.DataFrame | None,
) -> Simulation:
    kept, given = run_dir.path / SCHEDULE_FILE, schedule
    if given is None and resume and kept.exists():
        schedule = load_schedule(kept, cfg)
    current = None
    if schedule is not None:  # config.yaml says what round 1 ran
        current = settings_at(schedule, 1)
        cfg = apply_settings(cfg, current, "the schedule's round 1")
    plan, sim = planned_simulation(cfg)
    if resume:
        run_dir.load(sim)
        if plan.rounds <= sim.round:  # nothing to run; its config.yaml must not shrink below the rounds it holds
            raise UserError(
                f"{run_dir.path} has run {sim.round} rounds already; --rounds is the new total: give more "
                f"than {sim.round} to continue it."
            )
    run_dir.write_config(plan)
    run_dir.record_environment(sim.data.train.y.device, sim.round + 1)
    if given is not None:  # the run keeps a copy, which a resume replays on
        write_atomic(kept, lambda p: given.reset_index().to_parquet(p, index=False))
    engine = plan.engine
    try:
        while sim.round < plan.rounds and not stop_requested():
            if schedule is not None and (wanted := settings_at(schedule, sim.round + 1)) != current:
                now = replace(plan.settings(), engine=engine)
                where = f"the schedule's round {sim.round + 1}"
                sim, current = rebuilt(sim, apply_settings(now, wanted, where)), wanted
            row = sim.step()
            if engine != sim.settings.engine:  # compiling failed: config.yaml says what runs, and a resume runs it
                engine = sim.settings.engine
                run_dir.write_config(replace(plan.settings(), engine=engine))
            if on_round:
                on_round(row)
            if sim.round % plan.checkpoint_every == 0:
                run_dir.write_metrics(sim.history)
                run_dir.save(sim)
    finally:  # a diverging or interrupted run keeps every row it produced
        run_dir.write_metrics(sim.history)
    run_dir.save(sim)  # the last round's, or the round a stop was asked at
    return sim
