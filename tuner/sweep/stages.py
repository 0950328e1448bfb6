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
import yaml
from ray import tune
from ray.tune import Result
from ray.tune.search import SearchAlgorithm, Searcher

from tuner.errors import UserError, first_sentence
from tuner.files import write_text_atomic
from tuner.selection import SCORE, best_of, selection, started, trial_score
from tuner.sweep.cluster import Resources
from tuner.sweep.console import quiet
from tuner.sweep.recovery import StoppableOptunaSearch
from tuner.sweep.runner import Stage, holding, run_stage, seed_grid
from tuner.sweep.schedulers import first_population, scheduler_of, tune_domain
from tuner.sweep.space import Space
from tuner.sweep.stopping import stoppers

SUMMARY_FILE = "summary.yaml"


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
    with holding(sweep_dir, "sweep", "choose another --name", "search", resume, res) as folder:
        restoring = resume and tune.Tuner.can_restore(str(folder / "search"))
        grid = run_stage(folder, search_stage(space, folder, study_db, restoring), res, restoring)
        summary, best = searched(space, folder, grid)
        if seeds:
            reruns = run_stage(folder, seeds_stage(space, best.config or {}, seeds, vary_partition), res, resume)
            summary["seeds"] = [r.metrics.get("selected_acc") for r in reruns if r.metrics and r.error is None]
        write_text_atomic(folder / SUMMARY_FILE, yaml.safe_dump(_plain(summary), sort_keys=False))
        return summary


def search_stage(space: Space, folder: Path, study_db: Path | None, restoring: bool) -> Stage:
    """The space's search: Optuna's sampler under ASHA and the space's stopping rules, or a population trained by
    PBT or PB2, whose trials draw their first values from Tune's domains and take states from each other (a
    donor's checkpoint at every perturbation, kept until its recipients have read it)."""
    kind, cfg = scheduler_of(space), space.base_config()
    base = {"method": space.method, **space.settings}
    population = space.population if kind.hands_states else None
    if population:
        base = {**base, "checkpoint_every": population.interval}
    # a restored sweep brings its own searcher; a new one would enqueue the default point again
    searcher: SearchAlgorithm | Searcher | None = None
    distributions: dict[str, optuna.distributions.BaseDistribution] = dict(space.search)
    if not restoring and kind.hands_states:
        searcher = first_population(space, cfg.seed)
    elif not restoring:
        searcher = StoppableOptunaSearch(
            space=distributions,
            metric=SCORE,
            mode="max",
            sampler=space.make_sampler(cfg.seed),
            storage=study_storage(study_db) if study_db else None,
            study_name=folder.name,
            points_to_evaluate=space.first_points(),
        )
    return Stage(
        name="search",
        base=base,
        rounds=cfg.rounds,
        select=space.select,
        param_space={n: tune_domain(d) for n, d in space.search.items()} if kind.hands_states else {},
        searcher=searcher,
        scheduler=kind.build(space, cfg.rounds),
        stopper=stoppers(space.stop.rules, folder / "search"),
        samples=space.samples,
        report_every=space.report_every,
        budget=space.stop.rules.get("max_total_rounds"),
        keep_checkpoints=4 if kind.hands_states else 2,
        record={  # the report's axes
            "method": space.method,
            "space": space.source,
            "sampler": space.sampler,
            "scheduler": kind.name,
            "log_scale": [name for name, dist in space.search.items() if getattr(dist, "log", False)],
        },
    )


def seeds_stage(space: Space, best: dict, seeds: int, vary_partition: bool) -> Stage:
    """The best configuration rerun with the `seeds` seeds after the search's."""
    cfg = space.base_config()
    return Stage(
        name="seeds",
        base={"method": space.method, **space.settings},
        rounds=cfg.rounds,
        select=space.select,
        param_space={**best, **seed_grid(list(range(cfg.seed + 1, cfg.seed + 1 + seeds)), vary_partition)},
        stopper=stoppers(space.stop.rules, search=False),
        expected=seeds,
        report_every=space.report_every,
        record={"method": space.method, "best_of": "search"},
    )


def searched(space: Space, folder: Path, grid: list[Result]) -> tuple[dict, Result]:
    """The search's summary and its best trial by the selection rule. A trial that refused a setting the search
    gave ends the sweep in one sentence, the summary of the search's best so far written first: no seeds are run
    on a space that needs fixing."""
    pop = space.population
    figures = {r.path: population_figures(r, space.select) if pop else r.metrics for r in grid if r.metrics}
    best = best_of(
        (r for r in grid if r.metrics), lambda r: trial_score(figures[r.path], space.select), lambda r: started(r.path)
    )
    refused = [r.metrics["failed"] for r in grid if r.metrics and r.metrics.get("failed_kind") == "refused"]
    refusal = (
        UserError(
            f"{len(refused)} trial{'s' if len(refused) > 1 else ''} of {folder} refused a setting the search gave "
            f"({refused[0]}); fix the space and sweep again (--name for a new sweep)."
        )
        if refused
        else None
    )
    if best is None:
        raise refusal or UserError(
            f"No trial of {folder} reported a result; see the error.txt files under {folder / 'search'}."
        )
    summary: dict[str, Any] = {
        "best_config": dict(best.config or {}),
        "best": {
            k: figures[best.path].get(k)
            for k in ("best_acc", "selected_acc", "best_round", "best_val_acc", "best_val_round")
        },
    }
    spent, budget = sum((r.metrics or {}).get("round", 0) for r in grid), space.stop.rules.get("max_total_rounds")
    if budget and spent >= budget:  # trials stopped short by the budget: said, not left to look like early stopping
        summary["ended_by"] = f"the round budget: {spent} rounds over all trials reached max_total_rounds {budget}"
    if refusal:
        write_text_atomic(folder / SUMMARY_FILE, yaml.safe_dump(_plain(summary), sort_keys=False))
        raise refusal
    return summary, best


def population_figures(result: Result, select: str) -> dict:
    """A population-based trial's figures from the rounds its state went through (its last report may come from
    before its last exploit: Tune keeps what a trial reported before an exploit and may drop what follows it)."""
    from tuner.sweep.trial_files import lineage_rows

    rows, _ = lineage_rows(Path(result.path), pd.DataFrame())
    return (
        {**(result.metrics or {}), **selection(rows.to_dict("records"), select), "round": int(rows["round"].max())}
        if len(rows)
        else result.metrics or {}
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


def _plain(obj: Any) -> Any:
    """YAML-safe copy (numpy scalars to Python)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj.item() if hasattr(obj, "item") else obj
