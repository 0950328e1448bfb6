"""`tuner report`: runs and sweeps collected into tables, printed beside the papers' numbers."""

from __future__ import annotations

from pathlib import Path

import typer

from tuner.cli.common import absolute, app, console, err, user_errors
from tuner.cli.console_tables import print_best, print_tables


@app.command()
@user_errors
def report(
    results: list[Path] = typer.Argument(
        ..., callback=absolute, help="Run directories, sweeps, or folders holding them (searched recursively)."
    ),
    out: Path = typer.Option(
        Path("results/report"), callback=absolute, help="Directory for the Parquet tables, Markdown, LaTeX and plots."
    ),
    select: str | None = typer.Option(
        None,
        help="test (the best, as the papers) or val (test accuracy at the best validation round) \\[default: each "
        "run's own: its sweep's select, else test].",
    ),
):
    """Collect runs and sweeps into Parquet tables and rebuild the papers' tables beside their published numbers."""
    from tuner.report.write import report as build_report

    result = build_report(results, out, select)
    for line in result["unreadable"]:
        err.print(f"skipped {line}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"{result['runs']} runs ({result['failed']} failed); {result['note']}")
    if result["unselectable"]:
        err.print(
            f"{result['unselectable']} runs have no accuracy to select by "
            f"({'validation' if select == 'val' else 'no evaluated round'}) and are left out of the tables."
        )
    if result["tables"].empty:
        console.print(
            "None of these runs is in a setting of the papers' tables; the per-run summary is in runs.parquet."
        )
    for sweep in result["best"].to_dict("records") if not result["best"].empty else []:
        if sweep["running"]:
            err.print(
                f"note: sweep {sweep['path']} is {sweep['running']}; its figures are those so far.",
                markup=False,
                soft_wrap=True,
            )
    print_tables(result["tables"])
    print_best(result["best"])
    console.print("written: " + ", ".join(str(p) for p in result["files"]))
