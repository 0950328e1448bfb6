"""The whole report of what was run, written into one folder: rounds.parquet, runs.parquet, the papers'
tables (Parquet, Markdown, LaTeX) with their agreement, each sweep's best configuration, and figures."""

from __future__ import annotations

import os
import shutil
from functools import partial
from pathlib import Path

import pandas as pd

from tuner.errors import UserError
from tuner.files import write_atomic, write_text_atomic
from tuner.report.best import best_configs, best_markdown, best_schedules, perturbed, schedule_markdown
from tuner.report.fair import fair_latex, fair_markdown, fair_tables, plot_fair
from tuner.report.plots import plot_curves, plot_schedule, plot_sweeps
from tuner.report.runs import SELECTION, find_runs, summarize
from tuner.report.tables import agreement, paper_cell, paper_tables, render
from tuner.settings import papers


def report(paths: list[Path], out: Path, select: str | None = None) -> dict:
    """`select` None: each run by its own rule (its sweep's `select`; best test round for runs and reproductions)."""
    if select not in (None, "test", "val"):
        raise UserError(f"--select must be test or val, not {select!r}.")
    runs, unreadable = find_runs(paths)
    out.mkdir(parents=True, exist_ok=True)
    stage = out / f".report-{os.getpid()}"  # the whole report is made here first: a stop midway leaves out as it was
    stage.mkdir(exist_ok=True)
    try:
        per_round = pd.concat(
            [r["rows"].assign(run=r["run"], method=r["config"].method) for r in runs], ignore_index=True
        )
        per_round = per_round.drop(columns=[c for c in per_round if c.startswith("config/")])
        summaries = pd.DataFrame([summarize(r, select) for r in runs])
        summaries["cell"] = [paper_cell(r["config"]) for r in runs]
        tables = paper_tables(summaries, papers.load_tables())
        write_atomic(stage / "rounds.parquet", lambda p: per_round.to_parquet(p, index=False))
        write_atomic(stage / "runs.parquet", lambda p: summaries.drop(columns="cell").to_parquet(p, index=False))
        written = [stage / "rounds.parquet", stage / "runs.parquet"]
        rules = sorted(set(summaries["selected_by"]))
        note = (
            "Selected by "
            + " and ".join(SELECTION[r] for r in rules)
            + " (each table says which figure it shows: the best or the final round).\n\n"
        )
        if not tables.empty:
            write_atomic(stage / "tables.parquet", lambda p: tables.to_parquet(p, index=False))
            write_atomic(stage / "agreement.parquet", lambda p: agreement(tables).to_parquet(p, index=False))
            write_text_atomic(stage / "tables.md", note + render(tables, "markdown"))
            write_text_atomic(stage / "tables.tex", render(tables, "latex"))
            written += [
                stage / "tables.parquet",
                stage / "agreement.parquet",
                stage / "tables.md",
                stage / "tables.tex",
            ]
        best = best_configs(runs, summaries)
        if not best.empty:
            schedules = best_schedules(runs, summaries, best)
            write_atomic(stage / "best.parquet", lambda p: best.to_parquet(p, index=False))
            text = note + "Best configuration of each sweep (accuracies in %).\n\n" + best_markdown(best) + "\n"
            for s in schedules:  # replayed by `tuner run --config X.yaml --schedule X.csv`
                stem = stage / s["file"].removesuffix(".csv")
                write_atomic(stem.with_suffix(".csv"), partial(s["schedule"].drop(columns="trial").to_csv, index=False))
                write_text_atomic(stem.with_suffix(".yaml"), s["config"].to_yaml())
                text += schedule_markdown(s["sweep"], s["schedule"], s["file"], s["config"].method)
                written += [stem.with_suffix(".csv"), stem.with_suffix(".yaml")]
                # a schedule no exploit reached is flat lines: said in best.md, not drawn
                written += [plot_schedule(s, stem.with_suffix(".png"))] if perturbed(s["schedule"]) else []
            write_text_atomic(stage / "best.md", text)
            written += [stage / "best.parquet", stage / "best.md"]
        fair_methods, fair_columns = fair_tables(summaries)
        if not fair_methods.empty:  # a tuned comparison's: every method at defaults and tuned, paired over seeds
            write_atomic(stage / "fair.parquet", lambda p: fair_methods.to_parquet(p, index=False))
            write_atomic(stage / "fair_columns.parquet", lambda p: fair_columns.to_parquet(p, index=False))
            write_text_atomic(stage / "fair.md", fair_markdown(fair_methods, fair_columns))
            write_text_atomic(stage / "fair.tex", fair_latex(fair_methods))
            written += [stage / f for f in ("fair.parquet", "fair_columns.parquet", "fair.md", "fair.tex")]
            written += plot_fair(fair_methods, stage)
        written += plot_curves(runs, summaries, stage) + plot_sweeps(runs, summaries, stage)
        for made in written:
            os.replace(made, out / made.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    written = [out / made.name for made in written]
    missing = int(summaries["selected_acc"].isna().sum())
    return {
        "runs": len(runs),
        "failed": int((summaries["failed"] != "").sum()),
        "unselectable": missing,
        "unreadable": unreadable,
        "tables": tables,
        "fair": (fair_methods, fair_columns),
        "best": best,
        "summaries": summaries,
        "files": written,
        "note": note.strip(),
    }
