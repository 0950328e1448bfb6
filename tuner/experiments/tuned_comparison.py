"""`tuner reproduce TABLE --tune`: every method of the table's cells tuned at the same budget, the comparison the
papers did not make (they tune their own method and run the baselines at their defaults).

Each cell's method gets the same search: its space file's `search` alone (the file's fixed settings give way to the
cell's) less the settings held for its method (tuner.plugins.family_settings: FedAS-noPA keeps align off, FedAS
keeps it on), one sampler with one seed, the same trials, rounds, ASHA grace and patience, selection by validation
accuracy. Its best configuration is rerun with fresh seeds, and the method's paper defaults run with the same
seeds, so that each gain is paired over seeds. Under STORAGE/TABLE-tuned:

    defaults/          every cell at its defaults, seeds 1..S (the searches run seed 0)
    search/            every cell's search, one Tune experiment: an Optuna study and an ASHA a cell
                       (tuner/sweep/cells.py), the cells' trials sharing the slots
    seeds/             every cell's best configuration, seeds 1..S
    spaces/METHOD.yaml what each method's search was
    comparison.yaml    what was asked, each cell's best, the commits each stage ran at, the wall time and the trial
                       slots (the share spent training): tuner/experiments/comparison_record.py

Each stage resumes (`--resume`) and stops cleanly on Ctrl-C; the best configurations are written as tuned settings
files (tuner/settings/tuned_files.py) once their seeds are in.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.errors import UserError
from tuner.experiments.comparison_record import Record
from tuner.experiments.reproduce import cells, paper_rounds
from tuner.files import read_mapping, write_text_atomic
from tuner.report.fair import COMPARISON_FILE
from tuner.report.runs import NOT_CONFIGURATION
from tuner.settings.config import absolute_settings, resolve_layers
from tuner.settings.tuned_files import DATA_SETTINGS, file_hash, write_tuned
from tuner.sweep.cells import cell_key
from tuner.sweep.cluster import Resources
from tuner.sweep.runner import Stage, holding, run_stage

if TYPE_CHECKING:
    from tuner.sweep.space import Space

DEFAULTS_STAGE = "defaults"
VAL_FRAC = 0.1  # the validation split that selects, where the settings name none
SEARCH_DRAWS = ("seed", "val_seed")  # what sets a method's searches apart from each other (--searches)


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


def fair_space(method: str, source: Path, folder: Path, cell: dict, asked: dict) -> Space:
    """The cell's search: `source`'s distributions alone, under the comparison's sampler, trials, stopping and
    selection, written to folder/METHOD.yaml (what ran, whatever the source file becomes)."""
    from tuner.plugins import family_settings, method_class
    from tuner.report.budget_flags import LOCAL_WORK
    from tuner.sweep.space_file import load_space

    search = read_mapping(source, "Space file").get("search")
    if not search:
        raise UserError(f"{source} has no `search:` mapping; a tuned comparison searches what it names.")
    kept = family_settings(method_class(method))  # each row stays the variant it names
    equal_work = [k for k in LOCAL_WORK if k in search]  # every method's trial takes the cell's local steps
    search = {k: v for k, v in search.items() if k not in kept and k not in equal_work}
    if not search:
        raise UserError(
            f"{source} searches only {', '.join([*kept, *equal_work])}, which stay fixed in a tuned comparison (a "
            f"variant's defining settings, and the local work, equal for every method); search another setting too "
            "(its lr)."
        )
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
    if kept:
        header += f"# not searched, each row its own method: {', '.join(f'{k}={v}' for k, v in kept.items())}\n"
    if equal_work:
        header += f"# not searched, the cell's for every method (equal local steps a trial): {', '.join(equal_work)}\n"
    write_text_atomic(folder / f"{method}.yaml", header + yaml.safe_dump(derived, sort_keys=False))
    return load_space(folder / f"{method}.yaml", method, settings={**asked["settings"], **cell})


def reproduce_tuned(
    table: str,
    storage: Path,
    res: Resources,
    *,
    trials: int,
    seeds: int,
    rounds: int | None,
    datasets: list[str] | None = None,
    methods: list[str] | None = None,
    space_dir: Path,
    sampler: str = "tpe",
    grace: int | None = None,
    patience: int | None = None,
    settings: dict | None = None,
    tuned_dir: Path,
    resume: bool = False,
    searches: int = 1,
) -> tuple[Path, list[str]]:
    """Tune every runnable cell of `table` at one budget, `searches` independent searches a cell (each its own
    sampler and run seed; each one's best rerun on the seeds); returns the comparison's folder and what was left
    out."""
    settings = absolute_settings(settings or {})
    todo, skipped = cells(table, datasets, methods, settings.get("data_dir"), settings)
    if not todo:
        raise UserError(f"No cell of {table} can run here ({'; '.join(skipped) or 'nothing matches the filters'}).")
    rounds = paper_rounds(table) if rounds is None else rounds
    grace = max(1, rounds // 4) if grace is None else grace
    if grace > rounds:
        raise UserError(f"--grace ({grace}) exceeds the runs' {rounds} rounds.")
    common = {"rounds": rounds, "val_frac": VAL_FRAC, **settings}
    base = int(common.get("seed", 0))
    first = base + searches  # the searches run the settings' seed and the next ones; the reruns those after
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
        **({"searches": searches} if searches > 1 else {}),  # a comparison of one search reads as it always did
    }
    sources = {c["method"]: space_file(c["method"], space_dir) for c in todo}  # all found before anything runs
    searched = search_cells(todo, base, searches)
    folder = Path(storage) / f"{table}-tuned"
    with holding(folder, "comparison", "choose another --storage", COMPARISON_FILE, resume, res) as top:
        record = Record.resumed(top / COMPARISON_FILE, asked, res)
        try:  # a stop keeps the time spent so far
            if DEFAULTS_STAGE not in record.done:
                with record.stage(DEFAULTS_STAGE):
                    run_stage(top, defaults_stage(asked, todo), res, tune_can_restore(top / DEFAULTS_STAGE))
            spaces = {
                cell_key(c): fair_space(c["method"], sources[c["method"]], top / "spaces", c, asked) for c in searched
            }
            if "search" not in record.done:
                with record.stage("search"):
                    grid = run_stage(top, search_stage(asked, searched, spaces), res, tune_can_restore(top / "search"))
                    record.found.update(best_by_cell(grid, spaces, top / "search"))
            found = {cell_key(c): searches_found(c, searched, record.found) for c in todo}
            tuned_cells = [c for c in todo if found[cell_key(c)]]
            if "seeds" not in record.done and tuned_cells:
                # each search's best, a configuration found twice rerun once
                reruns = {
                    cell_key(r): r for c in tuned_cells for _, b in found[cell_key(c)] for r in [{**c, **b["config"]}]
                }
                with record.stage("seeds"):
                    stage = seeds_stage(asked, list(reruns.values()))
                    grid = run_stage(top, stage, res, tune_can_restore(top / "seeds"))
                    for c in tuned_cells:
                        search, best = max(
                            found[cell_key(c)], key=lambda f: f[1]["val_acc"] or 0
                        )  # the first of equals
                        source, at = sources[c["method"]], record.commits_of("search")
                        write_tuned_cell(c, search, best, grid, asked, source, top, tuned_dir, at)
        finally:
            record.note()
    return top, skipped


def tune_can_restore(path: Path) -> bool:
    from ray import tune

    return tune.Tuner.can_restore(str(path))


def _stage(asked: dict, name: str, **kwargs: Any) -> Stage:
    """A stage of the comparison: its settings, selection by validation, patience, the table and what was asked."""
    from tuner.sweep.stopping import stoppers

    return Stage(
        name=name,
        base=asked["settings"],
        rounds=asked["rounds"],
        stopper=stoppers({"patience": asked["patience"]} if asked["patience"] else {}, search=False),
        record={"table": asked["table"], "comparison": asked},
        **kwargs,
    )


def defaults_stage(asked: dict, todo: list[dict]) -> Stage:
    """Every cell at its method's paper defaults, on the comparison's seeds."""
    from ray import tune

    from tuner.sweep.runner import seed_grid

    seeds = len(asked["seeds"])
    return _stage(
        asked,
        DEFAULTS_STAGE,
        param_space={"cell": tune.grid_search(todo), **seed_grid(asked["seeds"], False)},
        expected=len(todo) * seeds,
        sharing=seeds,  # a cell's runs share its method's compiled programs, not another's
    )


def search_stage(asked: dict, todo: list[dict], spaces: dict) -> Stage:
    """Every cell's search in one experiment: an Optuna study (one sampler, one seed, for every method) and an
    ASHA a cell, the cells' trials sharing the slots."""
    from tuner.selection import SCORE
    from tuner.sweep.cells import CellSchedulers, CellSearches
    from tuner.sweep.recovery import StoppableOptunaSearch
    from tuner.sweep.schedulers import asha

    searches = {
        key: StoppableOptunaSearch(
            space=sp.search,
            metric=SCORE,
            mode="max",
            sampler=sp.make_sampler(sp.base_config().seed),
            points_to_evaluate=sp.first_points(),
        )
        for key, sp in spaces.items()
    }
    trials, grace, rounds = asked["trials"], asked["grace"], asked["rounds"]
    return _stage(
        asked,
        "search",
        searcher=CellSearches(searches, {cell_key(c): c for c in todo}, trials, SCORE, "max"),
        scheduler=CellSchedulers(lambda: asha(grace, rounds)),
        samples=len(todo) * trials,
        sharing=trials,
    )


def best_by_cell(grid: Iterable[Any], spaces: dict, search: Path) -> dict[str, dict]:
    """Each cell's best trial by validation (the earlier trial of equals), or why it has none."""
    from tuner.selection import best_of, started, trial_score

    searched = [r for r in grid if r.metrics]
    found: dict[str, dict[str, Any]] = {}
    for key in spaces:
        mine = [r for r in searched if cell_key(r.config["cell"]) == key]
        best = best_of(mine, lambda r: trial_score(r.metrics, "val"), lambda r: started(r.path))
        if best is None:  # every trial failed: the cell has no tuned configuration, the others go on
            found[key] = {"failed": f"no search trial reported a result (error.txt files in {search})"}
            continue
        found[key] = {
            "config": {k: v for k, v in best.config.items() if k != "cell"},
            "val_acc": best.metrics.get("best_val_acc"),
            "rounds_trained": int(best.metrics.get("round", 0)),  # the chosen trial's
            "search_rounds_trained": int(sum(r.metrics.get("round", 0) for r in mine)),
        }
    return found


def search_cells(todo: list[dict], base: int, searches: int) -> list[dict]:
    """Each cell's searches: the cell itself where there is one; else search r with its own sampler and run seed
    (base + r) and, past the first, its own draw of the validation samples (val_seed r)."""
    if searches == 1:
        return todo
    return [{**c, "seed": base + r, **({"val_seed": r} if r else {})} for c in todo for r in range(searches)]


def searches_found(cell: dict, searched: list[dict], found: dict[str, dict]) -> list[tuple[dict, dict]]:
    """The cell's searches (its search cells: the cell, with its draws where there are several) that found a best
    configuration, each with what it found, in the order they ran."""
    mine = [s for s in searched if {k: v for k, v in s.items() if k not in SEARCH_DRAWS} == cell]
    return [(s, found[cell_key(s)]) for s in mine if "config" in found.get(cell_key(s), {})]


def seeds_stage(asked: dict, tuned: list[dict]) -> Stage:
    """Every tuned cell's best configuration on the comparison's seeds."""
    from ray import tune

    from tuner.sweep.runner import seed_grid

    seeds = len(asked["seeds"])
    return _stage(
        asked,
        "seeds",
        param_space={"tuned": tune.grid_search(tuned), **seed_grid(asked["seeds"], False)},
        expected=len(tuned) * seeds,
        sharing=seeds,
    )


def write_tuned_cell(
    cell: dict,
    search: dict,
    best: dict,
    grid: Iterable[Any],
    asked: dict,
    source: Path,
    top: Path,
    tuned_dir: Path,
    commit: str,
) -> None:
    """The cell's tuned settings file (the best of its searches by validation: `search`, its search cell, found
    `best`), with where they came from (`commit`: the search's) and what its seeds scored."""
    from tuner.sweep.space import tpe_startup

    common = asked["settings"]
    cfg = resolve_layers(cell["method"], [("the comparison's settings", {**common, **search})])
    tuned = {
        k: v
        for k, v in {**common, **cell, **best["config"]}.items()
        if k not in (*NOT_CONFIGURATION, "method")  # a run of the tuned settings picks its seed
    }
    accs = [
        r.metrics.get("selected_acc")
        for r in grid
        if r.metrics and r.error is None and r.config["tuned"] == {**cell, **best["config"]}
    ]
    provenance = {
        "table": asked["table"],
        "space": shown_path(source),
        "space_sha256": file_hash(source),
        "sampler": asked["sampler"],
        "sampler_seed": cfg.seed,
        **({"sampler_random_start": tpe_startup(asked["trials"])} if asked["sampler"] == "tpe" else {}),
        "trials": asked["trials"],
        "searches": asked.get("searches", 1),
        "rounds": asked["rounds"],
        "grace": asked["grace"],
        "patience": asked["patience"],
        "rounds_trained": best["rounds_trained"],
        "search_rounds_trained": best["search_rounds_trained"],
        "selected_by": "val",
        "val_acc": best["val_acc"],
        "seeds": asked["seeds"],
        "seeds_test_acc": accs,
        "comparison": top.name,  # its folder: never a path of the machine that ran it
        "commit": commit,
    }
    write_tuned(tuned_dir, cfg.method, {**{k: getattr(cfg, k) for k in DATA_SETTINGS}, **tuned}, provenance)


def shown_path(path: Path) -> str:
    """A path as the provenance shows it: from the current directory where it is under it."""
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)
