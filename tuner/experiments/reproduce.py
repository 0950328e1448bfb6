"""`tuner reproduce TABLE`: every cell of a paper's table that this machine's data allows, as one Tune experiment.

A cell is (method, dataset, partition, clients, join ratio, backbone) under the paper's protocol
(rounds, batch size, local epochs, learning rate); each cell runs with several seeds so that
`tuner report` prints mean ± std beside the published number.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import UserError
from tuner.settings import papers
from tuner.settings.config import absolute_settings

if TYPE_CHECKING:  # a bare GPU node reads the cells without Ray or Optuna installed
    from tuner.sweep.cluster import Resources

ROSTER = "roster"  # every method and variant at one data setting: no published numbers, a comparison of our own


def cells(
    table: str,
    datasets: list[str] | None = None,
    methods: list[str] | None = None,
    data_dir: str | None = None,
    settings: dict | None = None,
) -> tuple[list[dict], list[str]]:
    """The runnable cells of `table`, and a sentence for each cell or method left out. A method of one's
    own among `methods` (a file, module or installed name) runs in every data setting of the table. The `roster`
    is every method and variant (or `methods`) at the one data setting `settings` name."""
    from algorithms import METHODS
    from tuner.plugins import canonical, method_class

    if table not in papers.TABLES and table != ROSTER:
        raise UserError(f"Unknown table '{table}'; choose {ROSTER} or one of {', '.join(papers.TABLES)}.")
    own = [canonical(m) for m in methods or [] if m not in METHODS]
    for m in own:
        method_class(m)  # checked before anything runs
    if table == ROSTER:
        dataset = str((settings or {}).get("dataset", "fmnist"))
        available = _available(dataset, data_dir)
        if available is not True:
            return [], [f"{dataset}: {available}"]
        return [{"method": m} for m in (methods and [canonical(m) for m in methods] or METHODS)], []
    paper_name, table_name = papers.TABLES[table].paper, papers.TABLES[table].name
    published = papers.load_tables()
    rows = published[(published["paper"] == paper_name) & (published["table"] == table_name)]
    skipped: list[str] = []
    local: dict[str, bool | str] = {}  # each dataset: here, or why not
    out = []
    for r in rows.itertuples(index=False):
        dataset = papers.DATASET_NAMES[r.dataset]
        if datasets and dataset not in datasets:
            continue
        method = papers.method_of(paper_name, r.method)
        if method is None:
            skipped.append(f"{r.method}: not implemented")
        wanted = own + ([method] if method is not None and (not methods or method in methods) else [])
        if not wanted:
            continue
        if dataset not in local:
            local[dataset] = _available(dataset, data_dir)
            if local[dataset] is not True:
                skipped.append(f"{r.dataset}: {local[dataset]}")
        if local[dataset] is not True:
            continue
        setting = {
            "dataset": dataset,
            "partition": papers.partition_of(r),
            "clients": int(r.num_clients),
            "join_ratio": str(r.join_ratio),
            "backbone": r.backbone,
            "protocol": papers.PAPERS[paper_name].protocol,
        }
        # what --set names holds for every cell: `--set backbone=mlp` runs the table with the MLP
        setting = {k: v for k, v in setting.items() if k not in (settings or {})}
        out += [cell for cell in ({"method": m, **setting} for m in wanted) if cell not in out]
    return out, sorted(set(skipped))


def paper_rounds(table: str) -> int:
    """The rounds of `table`'s paper; the roster has none of its own."""
    if table not in papers.TABLES:
        raise UserError(f"The {table} has no paper's length; give --rounds.")
    return papers.PAPERS[papers.TABLES[table].paper].rounds


def _available(dataset: str, data_dir: str | None) -> bool | str:
    from tuner.data.datasets import load_dataset

    try:
        load_dataset(dataset, data_dir, download=False)
    except UserError as e:
        return f"no local data ({e})"
    return True


def reproduce(
    table: str,
    storage: Path,
    res: Resources,
    *,
    seeds: int,
    rounds: int | None,
    datasets: list[str] | None = None,
    methods: list[str] | None = None,
    patience: int | None = None,
    settings: dict | None = None,
    vary_partition: bool = False,
    resume: bool = False,
) -> tuple[Path, list[str]]:
    """Run every runnable cell of `table` with `seeds` seeds; returns the experiment's directory and what was
    left out."""
    from ray import tune

    from tuner.sweep.runner import Stage, holding, run_stage, seed_grid
    from tuner.sweep.stopping import stoppers

    settings = absolute_settings(settings or {})
    todo, skipped = cells(table, datasets, methods, settings.get("data_dir"), settings)
    if not todo:
        raise UserError(f"No cell of {table} can run here ({'; '.join(skipped) or 'nothing matches the filters'}).")
    rounds = paper_rounds(table) if rounds is None else rounds
    stage = Stage(
        name="reproduce",
        base={"rounds": rounds, **settings},
        rounds=rounds,
        select="test",
        param_space={"cell": tune.grid_search(todo), **seed_grid(list(range(seeds)), vary_partition)},
        stopper=stoppers({"patience": patience} if patience else {}, search=False),
        expected=len(todo) * seeds,
        sharing=seeds,  # a cell's seeds run its programs; another cell's method compiles its own
        record={"table": table, "paper": papers.TABLES[table].paper if table in papers.TABLES else None},
    )
    with holding(storage / table, "reproduction", "choose another --storage", "reproduce", resume, res) as folder:
        run_stage(folder, stage, res, resume)
    return folder, skipped
