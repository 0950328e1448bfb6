"""Several runs of one method and setting run as one pack (tuner/engine/pack.py), each written into its own folder
(tuner/run_folder.py) as it is written alone: its config.yaml, a row a round, its checkpoint and environment, so
each resumes alone or in a pack, and the report reads it as any other run."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path

from tuner.data.federated import FederatedData
from tuner.engine.pack import Pack
from tuner.errors import DivergedError, UserError
from tuner.federated_run import build_method, engine_settings, planned_data
from tuner.files import ensure_writable, folder_lock
from tuner.run_folder import RunDir
from tuner.settings.config import RunConfig, RunPlan

# what runs of a pack may differ in: their seeds and the numbers a program reads (tuner/engine/pack.py)
PACKED_APART = ("seed", "lr", "momentum", "weight_decay", "hparams")


def planned_pack(cfgs: list[RunConfig], data: FederatedData | None = None) -> tuple[list[RunPlan], Pack]:
    """The runs' plans and one Pack of them, on data loaded once (or `data`, loaded already for cfgs[0]).

    Raises:
        UserError: a setting a run refuses, or runs that differ in more than PACKED_APART; ValueError: runs that are
            not one program (Pack's clause: a number 0 in one run and not another, a method that cannot be packed).
    """
    plan, data = planned_data(cfgs[0], data)
    plans = [plan] + [planned_data(c, data)[0] for c in cfgs[1:]]
    same = lambda p: {k: v for k, v in asdict(p).items() if k not in PACKED_APART}  # noqa: E731
    differ = sorted(k for k in same(plan) if any(same(p)[k] != same(plan)[k] for p in plans))
    if differ:
        raise UserError(f"Runs packed together differ only in {', '.join(PACKED_APART)}; these differ in {differ}.")
    return plans, Pack([build_method(p, data) for p in plans], data, engine_settings(plan))


class OneRun:
    """One run of a pack, as its folder saves and loads it (run_folder.Saved)."""

    def __init__(self, pack: Pack, run: int):
        self.pack, self.run = pack, run

    def state_dict(self) -> dict:
        return self.pack.state_dict(self.run)

    def load_state_dict(self, state: dict) -> None:
        self.pack.load_state_dict(self.run, state)


def run_pack(
    cfgs: list[RunConfig],
    outs: list[Path],
    resume: bool = False,
    on_round: Callable[[int, dict], None] | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> Pack:
    """Run the runs `cfgs` as one pack up to their rounds, run r written into outs[r] as tuner.federated_run.run
    writes it alone (resume: every run from its checkpoint there, all at one round). A stop stops every run at the
    end of a round with its checkpoint; an exception keeps every run's rows. on_round(r, row): run r's row.

    Raises:
        UserError: a folder holds a run and `resume` is false, or none to resume; another command holds one; the
            runs differ in more than their seeds and numbers, or a setting is refused. ValueError: runs that are not
            one program (Pack's clause).
    """
    dirs = [RunDir(out) for out in outs]
    created = [d.path for d in dirs if not d.path.exists()]
    try:
        return _run_pack(cfgs, dirs, resume, on_round, stop_requested)
    finally:  # a pack refused before its first file leaves no empty folder behind
        for path in created:
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()


def _run_pack(
    cfgs: list[RunConfig],
    dirs: list[RunDir],
    resume: bool,
    on_round: Callable[[int, dict], None] | None,
    stop_requested: Callable[[], bool],
) -> Pack:
    for d in dirs:
        ensure_writable(d.path, "the run folder")
        if not resume and d.config.exists():
            raise UserError(f"{d.path} holds a run already; pass --resume to continue it, or choose another --out.")
    with ExitStack() as held:
        for d in dirs:
            held.enter_context(folder_lock(d.path, "The run folder", "choose another --out"))
        plans, pack = _started(cfgs, dirs, resume)
        rounds, engine = plans[0].rounds, plans[0].engine
        try:
            while pack.round < rounds and not stop_requested():
                rows = pack.step()
                for row, cfg in zip(rows, cfgs, strict=True):
                    if "diverged" in row:  # as alone: the run stops with its rows; so do its siblings here
                        raise DivergedError(f"Seed {cfg.seed}: {row['diverged']}")
                for r, row in enumerate(rows):
                    if on_round:
                        on_round(r, row)
                if engine != pack.settings.engine:  # compiling failed: each config.yaml says what runs
                    engine = pack.settings.engine
                    _write_configs(plans, dirs, engine)
                if pack.round % plans[0].checkpoint_every == 0:
                    _save(pack, dirs)
        finally:  # a diverging or interrupted pack keeps every run's rows
            for r, d in enumerate(dirs):
                d.write_metrics(pack.histories[r])
        _save(pack, dirs)
    return pack


def _started(cfgs: list[RunConfig], dirs: list[RunDir], resume: bool) -> tuple[list[RunPlan], Pack]:
    """The pack at round 0 or where its runs' checkpoints left it, each folder's config and environment written."""
    plans, pack = planned_pack(cfgs)
    if resume:
        for r, d in enumerate(dirs):
            d.load(OneRun(pack, r))
    if plans[0].rounds <= pack.round:
        raise UserError(f"The runs have run {pack.round} rounds already; --rounds is the new total: give more.")
    _write_configs(plans, dirs, plans[0].engine)
    for d in dirs:
        d.record_environment(pack.data.train.y.device, pack.round + 1)
    return plans, pack


def _write_configs(plans: list[RunPlan], dirs: list[RunDir], engine: str) -> None:
    for plan, d in zip(plans, dirs, strict=True):
        d.write_config(plan if engine == plan.engine else replace(plan.settings(), engine=engine))


def _save(pack: Pack, dirs: list[RunDir]) -> None:
    """Every run's rows and checkpoint."""
    for r, d in enumerate(dirs):
        d.write_metrics(pack.histories[r])
        d.save(OneRun(pack, r))
