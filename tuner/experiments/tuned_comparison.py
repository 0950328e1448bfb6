"""`tuner reproduce TABLE --tune`: every method of the table's cells tuned at the same budget, the comparison the
papers did not make (they tune their own method and run the baselines at their defaults).

Each cell's method gets the same search: its space file's `search` alone (the file's fixed settings give way to the
cell's), one sampler with one seed, the same trials, rounds, ASHA grace and patience, selection by validation
accuracy. Its best configuration is rerun with fresh seeds, and the method's paper defaults run with the same
seeds, so that each gain is paired over seeds. Under STORAGE/TABLE-tuned:

    defaults/          every cell at its defaults, seeds 1..S (the searches run seed 0)
    search/            every cell's search, one Tune experiment: an Optuna study and an ASHA a cell
                       (tuner/sweep/cells.py), the cells' trials sharing the slots
    seeds/             every cell's best configuration, seeds 1..S
    spaces/METHOD.yaml what each method's search was
    comparison.yaml    what was asked, each cell's best, the wall time and the trial slots (the share spent training)

Each stage resumes (`--resume`) and stops cleanly on Ctrl-C; the best configurations are written as tuned settings
files (tuner/settings/tuned_files.py) once their seeds are in.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tuner.errors import UserError
from tuner.experiments.reproduce import cells, paper_rounds
from tuner.files import folder_lock, read_mapping, user_path, write_text_atomic
from tuner.report.fair import COMPARISON_FILE
from tuner.report.runs import NOT_CONFIGURATION
from tuner.settings.config import absolute_settings, resolve_layers
from tuner.settings.tuned_files import DATA_SETTINGS, checkout_commit, file_hash, write_tuned

DEFAULTS_STAGE = "defaults"
VAL_FRAC = 0.1  # the validation split that selects, where the settings name none


def space_file(method: str, space_dir: Path) -> Path:
    """The method's space file in `space_dir`, else its family's (a variant searches its method's space)."""
    from tuner.plugins import method_class

    cls = method_class(method)
    for name in dict.fromkeys([cls.name, cls.family or cls.name]):
        path = space_dir / f"{name}.yaml"
        if path.exists():
            return path
    raise UserError(
        f"No space file for {cls.name} in {space_dir}; write {space_dir / (cls.name + '.yaml')} (a `search:` "
        "mapping, docs/sweeps.md) or pass --space-dir."
    )


def fair_space(method: str, source: Path, folder: Path, cell: dict, asked: dict):
    """The cell's search: `source`'s distributions alone, under the comparison's sampler, trials, stopping and
    selection, written to folder/METHOD.yaml (what ran, whatever the source file becomes)."""
    from tuner.sweep.space import load_space

    search = read_mapping(source, "Space file").get("search")
    if not search:
        raise UserError(f"{source} has no `search:` mapping; a tuned comparison searches what it names.")
    stop = {k: asked[k] for k in ("grace", "patience") if asked.get(k)}
    derived = {
        "method": method,
        "search": search,
        "sampler": asked["sampler"],
        "samples": asked["trials"],
        "select": "val",
        **({"stop": stop} if stop else {}),
    }
    folder.mkdir(parents=True, exist_ok=True)
    header = f"# the search of {source} (sha256 {file_hash(source)}) under the comparison's budget\n"
    write_text_atomic(folder / f"{method}.yaml", header + yaml.safe_dump(derived, sort_keys=False))
    return load_space(folder / f"{method}.yaml", method, settings={**asked["settings"], **cell})


def reproduce_tuned(
    table: str,
    storage: Path,
    res,
    *,
    trials: int,
    seeds: int,
    rounds: int | None,
    datasets=None,
    methods=None,
    space_dir: Path,
    sampler: str = "tpe",
    grace: int | None = None,
    patience: int | None = None,
    settings: dict | None = None,
    tuned_dir: Path,
    resume: bool = False,
) -> tuple[Path, list[str]]:
    """Tune every runnable cell of `table` at one budget; returns the comparison's folder and what was left out."""
    from ray import tune

    from tuner.selection import SCORE, best_of, started, trial_score
    from tuner.sweep.cells import CellSchedulers, CellSearches, cell_key
    from tuner.sweep.cluster import check_request, start_ray, trial_resources, trial_slots
    from tuner.sweep.recovery import StoppableOptunaSearch
    from tuner.sweep.schedulers import asha
    from tuner.sweep.stages import run_stage, seed_grid
    from tuner.sweep.stopping import stoppers

    settings = absolute_settings(settings or {})
    todo, skipped = cells(table, datasets, methods, settings.get("data_dir"), settings)
    if not todo:
        raise UserError(f"No cell of {table} can run here ({'; '.join(skipped) or 'nothing matches the filters'}).")
    rounds = paper_rounds(table) if rounds is None else rounds
    grace = max(1, rounds // 4) if grace is None else grace
    if grace > rounds:
        raise UserError(f"--grace ({grace}) exceeds the runs' {rounds} rounds.")
    common = {"rounds": rounds, "val_frac": VAL_FRAC, **settings}
    first = int(common.get("seed", 0)) + 1  # the searches run the settings' seed; the reruns the next ones
    asked = {
        "table": table,
        "trials": trials,
        "seeds": list(range(first, first + seeds)),
        "rounds": rounds,
        "sampler": sampler,
        "grace": grace,
        "patience": patience,
        "space_dir": str(space_dir),
        "settings": common,
    }
    sources = {c["method"]: space_file(c["method"], space_dir) for c in todo}  # all found before anything runs
    top = user_path(storage) / f"{table}-tuned"
    record = top / COMPARISON_FILE
    if not resume and record.exists():
        raise UserError(f"{top} already holds this comparison; pass --resume to continue it, or another --storage.")
    check_request(res)
    with folder_lock(top, "The comparison", "choose another --storage"):
        earlier = yaml.safe_load(record.read_text()) if record.exists() else {}
        if earlier and earlier.get("asked") != asked:
            raise UserError(
                f"{top} was started with other settings ({_first_change(earlier.get('asked') or {}, asked)}); "
                "resume it with the same options, or choose another --storage."
            )
        wall, t0 = float(earlier.get("wall_s", 0.0)), time.monotonic()
        start_ray(res)
        import ray

        slots = trial_slots(trial_resources(res), res.max_concurrent, ray.cluster_resources())

        found: dict[str, dict] = dict(earlier.get("best", {}))  # each cell's best, as its search found it

        def note(done: list[str]) -> None:  # written as each part ends: a stop keeps the time spent so far
            wall_s = wall + time.monotonic() - t0
            text = yaml.safe_dump(
                {"asked": asked, "wall_s": wall_s, "slots": slots, "done": done, "best": found}, sort_keys=False
            )
            write_text_atomic(record, text)

        done: list[str] = list(earlier.get("done", []))
        note(done)
        try:  # a stop keeps the time spent so far
            stage = dict(stopper=stoppers(patience, None), rounds=rounds, extra={"table": table, "comparison": asked})
            if DEFAULTS_STAGE not in done:
                run_stage(
                    top,
                    DEFAULTS_STAGE,
                    common,
                    "val",
                    1,
                    res,
                    param_space={"cell": tune.grid_search(todo), **seed_grid(asked["seeds"], False)},
                    samples=1,
                    expected=len(todo) * seeds,
                    sharing=seeds,  # a cell's runs share its method's compiled programs, not another's
                    resume=tune.Tuner.can_restore(str(top / DEFAULTS_STAGE)),
                    **stage,
                )
                done.append(DEFAULTS_STAGE)
                note(done)
            spaces = {
                cell_key(c): fair_space(c["method"], sources[c["method"]], top / "spaces", c, asked) for c in todo
            }
            if "search" not in done:
                searches = {
                    key: StoppableOptunaSearch(
                        space=sp.search,
                        metric=SCORE,
                        mode="max",
                        sampler=sp.make_sampler(sp.base_config().seed),  # one sampler, one seed, for every method
                        points_to_evaluate=sp.first_points(),
                    )
                    for key, sp in spaces.items()
                }
                grid = run_stage(
                    top,
                    "search",
                    common,
                    "val",
                    1,
                    res,
                    searcher=CellSearches(searches, {cell_key(c): c for c in todo}, trials, SCORE, "max"),
                    scheduler=CellSchedulers(lambda: asha(grace, rounds)),
                    samples=len(todo) * trials,
                    sharing=trials,
                    resume=tune.Tuner.can_restore(str(top / "search")),
                    **stage,
                )
                searched = [r for r in grid if r.metrics]
                for key in spaces:
                    mine = [r for r in searched if cell_key(r.config["cell"]) == key]
                    best = best_of(mine, lambda r: trial_score(r.metrics, "val"), lambda r: started(r.path))
                    if best is None:  # every trial failed: the cell has no tuned configuration, the others go on
                        found[key] = {
                            "failed": f"no search trial reported a result (error.txt files in {top / 'search'})"
                        }
                        continue
                    found[key] = {
                        "config": {k: v for k, v in best.config.items() if k != "cell"},
                        "val_acc": best.metrics.get("best_val_acc"),
                        "rounds_trained": int(sum(r.metrics.get("round", 0) for r in mine)),
                    }
                done.append("search")
                note(done)
            tuned_cells = [c for c in todo if "config" in found[cell_key(c)]]
            if "seeds" not in done and tuned_cells:
                grid = run_stage(
                    top,
                    "seeds",
                    common,
                    "val",
                    1,
                    res,
                    param_space={
                        "tuned": tune.grid_search([{**c, **found[cell_key(c)]["config"]} for c in tuned_cells]),
                        **seed_grid(asked["seeds"], False),
                    },
                    samples=1,
                    expected=len(tuned_cells) * seeds,
                    sharing=seeds,
                    resume=tune.Tuner.can_restore(str(top / "seeds")),
                    **stage,
                )
                for c in tuned_cells:
                    cfg = resolve_layers(c["method"], [("the comparison's settings", {**common, **c})])
                    best = found[cell_key(c)]
                    tuned = {
                        k: v
                        for k, v in {**common, **c, **best["config"]}.items()
                        if k not in (*NOT_CONFIGURATION, "method")  # a run of the tuned settings picks its seed
                    }
                    accs = [
                        r.metrics.get("selected_acc")
                        for r in grid
                        if r.metrics and r.error is None and r.config["tuned"]["method"] == c["method"]
                    ]
                    write_tuned(
                        tuned_dir,
                        cfg.method,
                        {**{k: getattr(cfg, k) for k in DATA_SETTINGS}, **tuned},
                        {
                            "table": table,
                            "space": shown_path(sources[c["method"]]),
                            "space_sha256": file_hash(sources[c["method"]]),
                            "sampler": sampler,
                            "sampler_seed": cfg.seed,
                            "trials": trials,
                            "rounds": rounds,
                            "grace": grace,
                            "patience": patience,
                            "rounds_trained": best["rounds_trained"],
                            "selected_by": "val",
                            "val_acc": best["val_acc"],
                            "seeds": asked["seeds"],
                            "seeds_test_acc": accs,
                            "comparison": str(top),
                            "commit": checkout_commit(),
                        },
                    )
                done.append("seeds")
                note(done)
        finally:
            note(done)
    return top, skipped


def shown_path(path: Path) -> str:
    """A path as the provenance shows it: from the current directory where it is under it."""
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _first_change(before: dict, now: dict) -> str:
    k = next((k for k in now if before.get(k) != now[k]), "settings")
    return f"{k}: {before.get(k)!r}, now {now[k]!r}"
