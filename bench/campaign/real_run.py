"""Stage 6: the papers' Fashion-MNIST columns at their length, as many runs at once as the knee; a run stopped
by the budget resumes at the next command, a finished one is never started again."""

from __future__ import annotations

import time

from bench.campaign.processes import finished, run_figures, tuner_run, wait_all
from tuner import papers
from tuner.reproduce import cells

# The papers' Fashion-MNIST columns: name -> (table, partition, clients, checkpoint_every)
COLUMNS = {
    "fedpac-20": ("fedpac-table1", "pac:20", 20, 5),
    "gpfl-dir": ("gpfl-table1", "dir:0.1", 20, 10),
    "gpfl-pat": ("gpfl-table1", "pat:2", 20, 10),
    "fedpac-100": ("fedpac-table1", "pac:20", 100, 5),
}


def real_run(campaign, deadline: float) -> dict:
    """The papers' Fashion-MNIST columns (--columns) at their length, `knee` runs at once; an unfinished run
    resumes next command."""
    runs = campaign.out / "runs"
    todo = []  # (column, method, tuner run arguments, rounds)
    for column in campaign.args.columns.split(","):
        if column not in COLUMNS:
            raise SystemExit(f"Unknown column {column!r}; choose from {', '.join(COLUMNS)}.")
        table, partition, clients, checkpoint_every = COLUMNS[column]
        paper = papers.TABLES[table].paper
        rounds = 2 if campaign.args.smoke else papers.PAPERS[paper].rounds
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
            args = [
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
            ]
            todo.append((column, cell["method"], args, rounds))
    out: dict = {}
    pending = [t for t in todo if not finished(runs / t[0] / t[1], t[3])]
    for column, method, _, _ in todo:
        if (column, method) not in {(t[0], t[1]) for t in pending}:
            out[f"{column}/{method}"] = run_figures(runs / column / method, True, 0.0)
    while pending and time.monotonic() < deadline:
        batch, pending = pending[: campaign.knee], pending[campaign.knee :]
        t1 = time.monotonic()
        dirs = [runs / column / method for column, method, _, _ in batch]
        done = wait_all(
            [tuner_run([*args, "--out", str(d)], campaign) for (_, _, args, _), d in zip(batch, dirs, strict=True)],
            deadline,
        )
        for (column, method, _, rounds), d in zip(batch, dirs, strict=True):
            out[f"{column}/{method}"] = run_figures(d, done or finished(d, rounds), time.monotonic() - t1)
    complete = sum(v["finished"] for v in out.values())
    line = f"{complete} of {len(todo)} runs at their paper's length ({', '.join(campaign.args.columns.split(','))})"
    line += (
        "; " + ", ".join(f"{k} {v['rounds']} r" for k, v in out.items() if not v["finished"])
        if complete < len(todo)
        else ""
    )
    return {"runs": out, "line": line}
