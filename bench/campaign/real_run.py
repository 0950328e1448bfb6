"""Stage 6: the papers' Fashion-MNIST columns at their length (or GPFL's at 200 rounds), `--seeds` runs a method,
resumed across commands and sessions: the runs already committed for a column (under `--committed`/COLUMN, by
default results/gpu) and those this folder finished are never run again; the rest are planned by measured cost
(seconds a round from the column's runs so far, on this device), cheapest first, and a run starts only where its
cost fits the time left (a run not yet measured starts too: its rounds measure it for the next command). As many
run at once as the knee, a run that ends giving its place to the next at once; a run stopped by the budget keeps its
rows and checkpoint, and resumes at the next command in the same folder. What each run wrote that `tuner report`
reads (config.yaml, metrics.parquet, environment.json: the device, torch and commit it ran on) is packed as it ends
into OUT/runs.tar.xz.NN, pieces under 16 MiB, so that a machine whose files come back a few at a time brings the
column back whole: unpacked under results/gpu/ and committed, the next command goes on from them."""

from __future__ import annotations

import io
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.campaign.processes import finished, raise_if_failed, run_figures, stop, tuner_run, wait_any
from tuner.engine.compile import CUDA_CHECKED
from tuner.experiments.reproduce import cells
from tuner.run_folder import ENVIRONMENT_FILE, read_environment
from tuner.settings import papers

# The papers' Fashion-MNIST columns: name -> (table, partition, clients, checkpoint_every, rounds: None for the
# paper's)
COLUMNS = {
    "fedpac-20": ("fedpac-table1", "pac:20", 20, 5, None),
    "gpfl-dir": ("gpfl-table1", "dir:0.1", 20, 10, None),
    "gpfl-pat": ("gpfl-table1", "pat:2", 20, 10, None),
    "fedpac-100": ("fedpac-table1", "pac:20", 100, 5, None),
    "gpfl-dir-200": ("gpfl-table1", "dir:0.1", 20, 10, 200),  # GPFL Table 1's column at 200 rounds
}
PIECE = 15 * 2**20  # bytes of an archive's piece: under the 16 MiB a file may have to come back
REPORTED = ("config.yaml", "metrics.parquet", ENVIRONMENT_FILE)  # what `tuner report` reads of a run


@dataclass
class Planned:
    """One run of a column: a method and a seed, in its folder OUT/runs/COLUMN/METHOD-seedN."""

    column: str
    method: str
    seed: int
    args: list[str]
    rounds: int
    cost_s: float | None = None  # its estimated seconds from the column's runs so far; None: not yet measured

    @property
    def name(self) -> str:
        return f"{self.column}/{self.method}-seed{self.seed}"


def real_run(campaign, deadline: float) -> dict:
    """The columns' (--columns) runs not yet done, by measured cost within the budget, `knee` at once."""
    runs = campaign.out / "runs"
    committed = Path(campaign.args.committed)
    todo = planned_runs(campaign)
    out: dict = {}
    pending = []
    for run in todo:
        for folder in (committed / run.name, runs / run.name):
            if finished(folder, run.rounds):
                out[run.name] = run_figures(folder, True, 0.0) | {"where": str(folder.parent.parent)}
                break
        else:
            pending.append(run)
    costs = seconds_a_round(committed, runs, campaign.environment_name)
    for run in pending:
        run.cost_s = estimated_seconds(costs.get(run.method), run.rounds, runs / run.name)
    # the measured cheapest first, so that a call finishes as many as it can; the unmeasured after them
    pending.sort(key=lambda r: (r.cost_s is None, r.cost_s or 0.0))
    running: dict = {}  # process -> (run, started)
    try:
        while (pending or running) and time.monotonic() < deadline:
            while pending and len(running) < campaign.knee:  # a place that frees up takes the next run at once
                run = pending.pop(0)
                if run.cost_s is not None and run.cost_s > deadline - time.monotonic():
                    left = f"not started: needs ~{run.cost_s:.0f} s"
                    out[run.name] = run_figures(runs / run.name, False, 0.0) | {"left": left}
                    continue
                proc = tuner_run([*run.args, "--out", str(runs / run.name)], campaign)
                if proc is None:  # finished by an earlier command
                    out[run.name] = run_figures(runs / run.name, True, 0.0)
                else:
                    running[proc] = (run, time.monotonic())
            for proc in wait_any(list(running), deadline):
                run, t1 = running.pop(proc)
                raise_if_failed(proc)
                folder = runs / run.name
                out[run.name] = run_figures(folder, finished(folder, run.rounds), time.monotonic() - t1)
                pack(runs, campaign.out / "runs.tar.xz")  # as each run ends, so a stop later loses none of it
    finally:  # past the deadline (or a run that failed): the others stopped, their rows kept for the next command
        stop(list(running))
        for run, t1 in running.values():
            folder = runs / run.name
            out[run.name] = run_figures(folder, finished(folder, run.rounds), time.monotonic() - t1)
        pack(runs, campaign.out / "runs.tar.xz")
    complete = sum(bool(v["finished"]) for v in out.values())
    line = f"{complete} of {len(todo)} runs at their length ({campaign.args.columns}, {campaign.args.seeds} seeds)"
    left = [k for k, v in out.items() if not v["finished"]] + [r.name for r in pending]
    line += f"; not finished: {', '.join(left)}" if left else ""
    return {"runs": out, "line": line, "archive": [p.name for p in sorted(campaign.out.glob("runs.tar.xz.*"))]}


def planned_runs(campaign) -> list[Planned]:
    """Every run of the columns named: each method of the column's cells, with each of --seeds seeds."""
    todo = []
    checked = checked_on_cuda(campaign.results.get("correctness", {}).get("checks", {}))
    for column in campaign.args.columns.split(","):
        if column not in COLUMNS:
            raise SystemExit(f"Unknown column {column!r}; choose from {', '.join(COLUMNS)}.")
        table, partition, clients, checkpoint_every, length = COLUMNS[column]
        paper = papers.TABLES[table].paper
        rounds = 2 if campaign.args.smoke else length or papers.PAPERS[paper].rounds
        for cell in column_cells(campaign, table, partition, clients):
            # on CUDA a method compiles once it is checked there on its backbone, in this folder or committed
            compiled = campaign.device.startswith("cuda") and (cell["method"], cell["backbone"]) in checked
            for seed in range(campaign.args.seeds):
                args = run_arguments(cell, rounds, checkpoint_every, "compiled" if compiled else "auto")
                todo.append(Planned(column, cell["method"], seed, [*args, "--set", f"seed={seed}"], rounds))
    return todo


def column_cells(campaign, table: str, partition: str, clients: int) -> list[dict]:
    """The column's cells; in miniature (smoke) two of its table's methods on digits, four clients."""
    if not campaign.args.smoke:
        return [
            cell
            for cell in cells(table, ["fmnist"], data_dir=campaign.data)[0]
            if cell["partition"] == partition and cell["clients"] == clients
        ]
    paper = papers.TABLES[table].paper
    published = (
        papers.load_tables().query("paper == @paper and table == @papers.TABLES[@table].name")["method"].unique()[:2]
    )
    protocol = papers.PAPERS[paper].protocol
    return [
        dict(
            method=papers.method_of(paper, label),
            dataset="digits",
            partition="dir:0.3",
            clients=4,
            join_ratio="1",
            backbone="mlp",
            protocol=protocol,
        )
        for label in published
    ]


def seconds_a_round(committed: Path, runs: Path, device: str) -> dict[str, tuple[float, float]]:
    """Each method's (first round, median later round) seconds in the runs of its columns so far, committed and in
    this folder, that ran on `device` (the first round holds compiling)."""
    costs: dict[str, list[tuple[float, float]]] = {}
    for metrics in [*committed.glob("*/*/metrics.parquet"), *runs.glob("*/*/metrics.parquet")]:
        folder = metrics.parent
        try:
            ran_on = {e["device"] for e in read_environment(folder)}
            rows = pd.read_parquet(metrics, columns=["round", "time_s"]).sort_values("round")
        except (OSError, ValueError, KeyError):
            continue
        if ran_on == {device} and len(rows) >= 2:
            method = folder.name.rsplit("-seed", 1)[0]
            costs.setdefault(method, []).append((rows["time_s"].iloc[0], rows["time_s"].iloc[1:].median()))
    return {m: (max(f for f, _ in c), sum(r for _, r in c) / len(c)) for m, c in costs.items()}


def estimated_seconds(cost: tuple[float, float] | None, rounds: int, folder: Path) -> float | None:
    """A run's seconds still to go: its first round (compiling) and the rest at the method's measured pace, less
    the rounds its folder already holds (a resumed run compiles again)."""
    if cost is None:
        return None
    first, per_round = cost
    done = (
        int(pd.read_parquet(folder / "metrics.parquet")["round"].max()) if (folder / "metrics.parquet").exists() else 0
    )
    return first + max(0, rounds - done - 1) * per_round


def run_arguments(cell: dict, rounds: int, checkpoint_every: int, engine: str) -> list[str]:
    """`tuner run`'s arguments for a cell of a column."""
    return [
        cell["method"],
        "--dataset",
        cell["dataset"],
        "--partition",
        cell["partition"],
        "--clients",
        str(cell["clients"]),
        "--rounds",
        str(rounds),
        "--set",
        f"protocol={cell['protocol']}",
        "--set",
        f"join_ratio={cell['join_ratio']}",
        "--set",
        f"backbone={cell['backbone']}",
        "--set",
        f"checkpoint_every={checkpoint_every}",
        "--set",
        f"engine={engine}",
    ]


def checked_on_cuda(checks: dict) -> set[tuple[str, str]]:
    """(method, backbone) pairs checked to compile on CUDA and equal the CPU reference: tuner/engine/compile.py's, and
    those
    whose compiled check passed in this folder's correctness stage."""
    passed = {
        (c["method"], c["backbone"])
        for name, c in checks.items()
        if "compiled" in name and c["status"] == "passed" and "method" in c
    }
    return set(CUDA_CHECKED) | passed


def pack(runs: Path, archive: Path) -> list[Path]:
    """Every run's config.yaml and metrics.parquet under `runs`, as ARCHIVE.00, .01, ... of PIECE bytes at most
    (`cat ARCHIVE.* | tar xJ` joins them); the pieces of an earlier packing are replaced."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for path in sorted(p for name in REPORTED for p in runs.rglob(name)):
            tar.add(path, arcname=str(path.relative_to(runs.parent)))
    data = buffer.getvalue()
    for old in archive.parent.glob(archive.name + ".*"):
        old.unlink()
    pieces = []
    for n, start in enumerate(range(0, len(data), PIECE)):
        piece = archive.with_name(f"{archive.name}.{n:02d}")
        piece.write_bytes(data[start : start + PIECE])
        pieces.append(piece)
    return pieces
