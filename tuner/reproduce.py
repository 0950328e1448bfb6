"""`tuner reproduce TABLE`: every cell of a paper's table that this machine's data allows, as one Tune experiment.

A cell is (method, dataset, partition, clients, join ratio, backbone) under the paper's protocol
(rounds, batch size, local epochs, learning rate); each cell runs with several seeds so that
`tuner report` prints mean ± std beside the published number.
"""

from __future__ import annotations

from pathlib import Path

from tuner.config import user_path
from tuner.errors import UserError
from tuner.report import DATASET_LABELS, METHOD_BY_TITLE, PATHOLOGICAL_CLASSES, load_paper_tables

TABLES = {
    "gpfl-table1": ("GPFL", "Table1"),
    "gpfl-table4": ("GPFL", "Table4-stability"),
    "gpfl-table6": ("GPFL", "Table6-ablation"),
    "fedcp-table1": ("FedCP", "Table1-ablation"),
    "fedcp-table2": ("FedCP", "Table2"),
    "fedcp-table4": ("FedCP", "Table4-scalability"),
    "fedcp-table7": ("FedCP", "Table7-stability"),
    "fedpac-table1": ("FedPAC", "Table1"),
    "fedpac-table2": ("FedPAC", "Table2-ablation"),
    "fedpac-replication": ("FedPAC-replication", "Table1"),
}
PAPER_ROUNDS = {"GPFL": 2000, "FedCP": 2000, "FedPAC": 200, "FedPAC-replication": 200}
DATASET_NAMES = {label: name for name, label in DATASET_LABELS.items()}
TITLES = METHOD_BY_TITLE | {"FedPAC-replicated": "fedpac"}


def protocol(paper: str) -> str:
    """The training protocol every method of a paper's tables runs under (values in tuner/defaults.py)."""
    return "fedpac" if paper.startswith("FedPAC") else "pfllib"


def cells(table: str, datasets: list[str] | None = None, methods: list[str] | None = None, data_dir: str | None = None) -> tuple[list[dict], list[str]]:
    """The runnable cells of `table`, and a sentence for each cell or method left out."""
    if table not in TABLES:
        raise UserError(f"Unknown table '{table}'; choose one of {', '.join(TABLES)}.")
    paper_name, table_name = TABLES[table]
    paper = load_paper_tables()
    rows = paper[(paper["paper"] == paper_name) & (paper["table"] == table_name)]
    skipped, available = [], {}
    out = []
    for r in rows.itertuples(index=False):
        dataset = DATASET_NAMES[r.dataset]
        if datasets and dataset not in datasets:
            continue
        if r.method not in TITLES:
            skipped.append(f"{r.method}: not implemented")
            continue
        method = TITLES[r.method]
        if methods and method not in methods:
            continue
        if dataset not in available:
            available[dataset] = _available(dataset, data_dir)
            if available[dataset] is not True:
                skipped.append(f"{r.dataset}: {available[dataset]}")
        if available[dataset] is not True:
            continue
        out.append({"method": method, "dataset": dataset, "partition": _partition(r), "clients": int(r.num_clients),
                    "join_ratio": str(r.join_ratio), "backbone": r.backbone, "protocol": protocol(paper_name)})  # fmt: skip
    return out, sorted(set(skipped))


def _partition(row) -> str:
    if row.kind == "pathological":
        return f"pat:{PATHOLOGICAL_CLASSES[row.dataset]}"
    if row.kind == "practical":
        return f"dir:{row.beta:g}"
    return f"pac:{row.setting.removeprefix('dominant_s')}"


def _available(dataset: str, data_dir: str | None) -> bool | str:
    from tuner.data.datasets import load_dataset

    try:
        load_dataset(dataset, data_dir, download=False)
    except UserError as e:
        return f"no local data ({e})"
    return True


def reproduce(table: str, storage: Path, res, *, seeds: int, rounds: int | None, datasets=None, methods=None,
              patience: int | None = None, settings: dict | None = None, vary_partition: bool = False, resume: bool = False) -> tuple[Path, list[str]]:  # fmt: skip
    """Run every runnable cell of `table` with `seeds` seeds; returns the experiment's directory and what was left out."""
    from ray import tune

    from tuner.sweep import run_stage, seed_grid, stoppers

    todo, skipped = cells(table, datasets, methods, (settings or {}).get("data_dir"))
    if not todo:
        raise UserError(f"No cell of {table} can run here ({'; '.join(skipped) or 'nothing matches the filters'}).")
    paper_name = TABLES[table][0]
    rounds = rounds or PAPER_ROUNDS[paper_name]
    sweep_dir = user_path(storage) / table  # absolute before Ray sees it
    if not resume and (sweep_dir / "reproduce").exists():
        raise UserError(f"{sweep_dir} already holds this reproduction; pass --resume to continue it, or another --storage.")
    base = {"rounds": rounds, **(settings or {})}
    run_stage(
        sweep_dir, "reproduce", base, "test", 1, res,
        param_space={"cell": tune.grid_search(todo), **seed_grid(list(range(seeds)), vary_partition)},
        stopper=stoppers(patience, None), samples=1, expected=len(todo) * seeds, rounds=rounds,
        metric="best_acc", resume=resume, extra={"table": table, "paper": paper_name},
    )  # fmt: skip
    return sweep_dir, skipped

