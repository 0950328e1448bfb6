"""The report's tables as the console prints them: each paper table beside its published numbers, each sweep's
best configuration."""

from __future__ import annotations

import math

from rich.markup import escape
from rich.table import Table

from tuner.cli.common import console


def chosen_by(select: str, val_acc: float | None, val_round: float | None) -> str:
    """The figure that chose a trial: its best validation accuracy, or (the papers' convention) its best test
    accuracy."""
    if select == "test":
        return "best test accuracy (the papers' convention)"
    return f"best val {100 * val_acc:.2f}% (round {int(val_round)})"


def print_best(best) -> None:
    """Each sweep's best configuration, as in best.md."""
    if best.empty:
        return
    table = Table(title="Best configuration of each sweep")
    for col in (
        "sweep",
        "method",
        "trials (failed, early)",
        "best configuration",
        "chosen by",
        "selected test acc",
        "seed reruns",
    ):
        table.add_column(col)
    missing = lambda v: v is None or (isinstance(v, float) and math.isnan(v))  # noqa: E731
    for r in best.to_dict("records"):
        acc = (
            "-" if missing(r.get("selected_acc")) else f"{100 * r['selected_acc']:.2f}% (round {int(r['best_round'])})"
        )
        seeds = (
            "-"
            if missing(r.get("seeds"))
            else f"{100 * r['seeds_mean']:.2f} ± {100 * r['seeds_std']:.2f}% (n={int(r['seeds'])})"
        )
        chosen = "-" if missing(r.get("selected_acc")) else chosen_by(r["selected_by"], r["val_acc"], r["val_round"])
        table.add_row(
            r["sweep"],
            r["method"],
            f"{r['trials']} ({r['failed']}, {r['stopped_early']})",
            escape(str(r.get("config", "-"))),
            chosen,
            acc,
            seeds,
        )
    console.print(table)


def print_tables(tables) -> None:
    """Each paper table, only the columns and methods we ran, beside the published numbers."""
    from tuner.report.tables import agreement, agreement_line, wide_table

    if tables.empty:
        return
    for (paper_name, table_name), t in tables.groupby(["paper", "table"], sort=False):
        if not (t["seeds"] > 0).any():  # a setting of this table, run only by methods it has no row for
            continue
        frame = wide_table(t, compact=True)
        table = Table(title=escape(f"{paper_name} {table_name}: ours [seeds × rounds] beside the paper"))
        table.add_column("method")
        for column, part in frame.columns:
            table.add_column(f"{column}\n{part}", justify="right")
        for method, row in frame.iterrows():
            table.add_row(method, *map(escape, row.tolist()))
        console.print(table)
        for a in agreement(t).itertuples():
            console.print(f"  agreement, {agreement_line(a)}", highlight=False, soft_wrap=True)
