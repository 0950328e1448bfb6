"""Stage 6: the papers' Fashion-MNIST columns at their length (or GPFL's at 200 rounds, a column in one command),
as many runs at once as the knee, a run that ends giving its place to the next at once; a run stopped by the budget
resumes at the next command, a finished one is never started again. What the runs wrote that `tuner report` reads
(config.yaml, metrics.parquet) is packed as each ends into OUT/runs.tar.xz.NN, pieces under 16 MiB, so that a
machine whose files come back a few at a time brings the column back whole."""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

from bench.campaign.processes import finished, raise_if_failed, run_figures, stop, tuner_run, wait_any
from tuner import papers
from tuner.compile import CUDA_CHECKED
from tuner.reproduce import cells

# The papers' Fashion-MNIST columns: name -> (table, partition, clients, checkpoint_every, rounds: None for the
# paper's)
COLUMNS = {
    "fedpac-20": ("fedpac-table1", "pac:20", 20, 5, None),
    "gpfl-dir": ("gpfl-table1", "dir:0.1", 20, 10, None),
    "gpfl-pat": ("gpfl-table1", "pat:2", 20, 10, None),
    "fedpac-100": ("fedpac-table1", "pac:20", 100, 5, None),
    "gpfl-dir-200": ("gpfl-table1", "dir:0.1", 20, 10, 200),  # GPFL Table 1's column at 200 rounds: one command
}
PIECE = 15 * 2**20  # bytes of an archive's piece: under the 16 MiB a file may have to come back
REPORTED = ("config.yaml", "metrics.parquet")  # what `tuner report` reads of a run


def real_run(campaign, deadline: float) -> dict:
    """The papers' Fashion-MNIST columns (--columns) at their length, `knee` runs at once; an unfinished run
    resumes next command."""
    runs = campaign.out / "runs"
    todo = []  # (column, method, tuner run arguments, rounds)
    checked = checked_on_cuda(campaign.results.get("correctness", {}).get("checks", {}))
    for column in campaign.args.columns.split(","):
        if column not in COLUMNS:
            raise SystemExit(f"Unknown column {column!r}; choose from {', '.join(COLUMNS)}.")
        table, partition, clients, checkpoint_every, length = COLUMNS[column]
        paper = papers.TABLES[table].paper
        rounds = 2 if campaign.args.smoke else length or papers.PAPERS[paper].rounds
        # a miniature of the column: two of its table's methods, digits, four clients, two rounds
        if campaign.args.smoke:
            published = (
                papers.load_tables()
                .query("paper == @paper and table == @papers.TABLES[@table].name")["method"]
                .unique()[:2]
            )
            column_cells = [
                dict(
                    method=papers.method_of(paper, label),
                    dataset="digits",
                    partition="dir:0.3",
                    clients=4,
                    join_ratio="1",
                    backbone="mlp",
                    protocol=papers.PAPERS[paper].protocol,
                )
                for label in published
            ]
        else:
            column_cells = [
                cell
                for cell in cells(table, ["fmnist"], data_dir=campaign.data)[0]
                if cell["partition"] == partition and cell["clients"] == clients
            ]
        for cell in column_cells:
            # on CUDA a method compiles once it is checked there on its backbone, in this folder or committed
            compiled = campaign.device.startswith("cuda") and (cell["method"], cell["backbone"]) in checked
            args = run_arguments(cell, rounds, checkpoint_every, "compiled" if compiled else "auto")
            todo.append((column, cell["method"], args, rounds))
    out: dict = {}
    pending = [t for t in todo if not finished(runs / t[0] / t[1], t[3])]
    for column, method, _, _ in todo:
        if (column, method) not in {(t[0], t[1]) for t in pending}:
            out[f"{column}/{method}"] = run_figures(runs / column / method, True, 0.0)
    running: dict = {}  # process -> (column, method, folder, rounds, started)
    try:
        while (pending or running) and time.monotonic() < deadline:
            while pending and len(running) < campaign.knee:  # a place that frees up takes the next run at once
                column, method, args, rounds = pending.pop(0)
                folder = runs / column / method
                proc = tuner_run([*args, "--out", str(folder)], campaign)
                if proc is None:  # finished by an earlier command
                    out[f"{column}/{method}"] = run_figures(folder, True, 0.0)
                else:
                    running[proc] = (column, method, folder, rounds, time.monotonic())
            for proc in wait_any(list(running), deadline):
                column, method, folder, rounds, t1 = running.pop(proc)
                raise_if_failed(proc)
                out[f"{column}/{method}"] = run_figures(folder, finished(folder, rounds), time.monotonic() - t1)
                pack(runs, campaign.out / "runs.tar.xz")  # as each run ends, so a stop later loses none of it
    finally:  # past the deadline (or a run that failed): the others stopped, their rows kept for the next command
        stop(list(running))
        for column, method, folder, rounds, t1 in running.values():
            out[f"{column}/{method}"] = run_figures(folder, finished(folder, rounds), time.monotonic() - t1)
        pack(runs, campaign.out / "runs.tar.xz")
    complete = sum(v["finished"] for v in out.values())
    line = f"{complete} of {len(todo)} runs at their paper's length ({', '.join(campaign.args.columns.split(','))})"
    line += (
        "; " + ", ".join(f"{k} {v['rounds']} r" for k, v in out.items() if not v["finished"])
        if complete < len(todo)
        else ""
    )
    return {"runs": out, "line": line, "archive": [p.name for p in sorted(campaign.out.glob("runs.tar.xz.*"))]}


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
    """(method, backbone) pairs checked to compile on CUDA and equal the CPU reference: tuner/compile.py's, and those
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
