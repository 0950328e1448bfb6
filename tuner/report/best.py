"""Each sweep's best configuration: trials run, failed and stopped early, the best trial's searched values
and figures (the selection rule's choice), and the mean ± std of its seed reruns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from tuner.files import lock_holder
from tuner.report.runs import best_run
from tuner.selection import SCORE
from tuner.settings.config import RunConfig


def best_configs(runs: list[dict], summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep: trials run, failed and stopped early, the best trial's searched values and
    figures, and the mean ± std of its seed reruns where the sweep made them."""
    out = []
    for sweep_dir, label, trials in searches(summaries):
        scored = trials[trials[SCORE].notna()]
        unfinished = int(((trials["rounds_run"] < trials["rounds_planned"]) & (trials["failed"] == "")).sum())
        running = lock_holder(sweep_dir)  # while the sweep runs, an unfinished trial may be running, not stopped
        row = {
            "sweep": f"{sweep_dir.name}/{label}" if label else sweep_dir.name,
            "path": str(sweep_dir),
            "method": trials["title"].iloc[0],
            "trials": len(trials),
            "failed": int((trials["failed"] != "").sum()),
            "stopped_early": 0 if running else unfinished,
            "running": f"running ({running}): {unfinished} trials unfinished" if running else "",
        }
        if not scored.empty:
            best = scored.loc[best_run(scored)]  # by the selection rule, as the sweep's console chose
            cfg = runs[best.name]["config"]
            schedule = runs[best.name].get("schedule")
            if schedule is not None:  # a population-based sweep: its best is a schedule, replayed from these files
                row["schedule"] = f"schedule-{sweep_dir.name}.csv"
            row |= {
                "selected_by": best["selected_by"],
                "val_acc": best["val_acc"],
                "val_round": best["val_round"],
                "selected_acc": best["selected_acc"],
                "best_round": best["best_round"],
                "rounds_run": best["rounds_run"],
                "config": ", ".join(f"{n}={_short(setting_value(cfg, n))}" for n in runs[best.name]["searched"]),
            }
        reruns = summaries[(summaries["stage"] == "seeds") & (summaries["experiment"] == str(sweep_dir / "seeds"))]
        if label:  # this cell's reruns only
            reruns = reruns.merge(trials[CELL].drop_duplicates(), on=CELL)
        seeds = reruns["selected_acc"].dropna()
        if len(seeds):
            row |= {"seeds": len(seeds), "seeds_mean": float(seeds.mean()), "seeds_std": float(seeds.std(ddof=0))}
        out.append(row)
    return pd.DataFrame(out)


# a tuned comparison's search experiment holds a search a table cell: each is a sweep of its own in the report
CELL = ["method", "dataset", "partition", "clients", "backbone"]


def searches(summaries: pd.DataFrame) -> Iterator[tuple[Path, str | None, pd.DataFrame]]:
    """Each search the sweeps ran: its sweep's folder, its cell's label where its experiment searched several cells
    (a tuned comparison's), and its trials."""
    search = summaries[summaries["stage"] == "search"]
    for experiment, in_experiment in search.groupby("experiment", sort=True):
        cells = in_experiment.groupby(CELL, sort=True, dropna=False)
        for _, trials in cells:
            yield Path(str(experiment)).parent, cell_label(trials) if cells.ngroups > 1 else None, trials


def cell_label(trials: pd.DataFrame) -> str:
    """A table cell's search among a tuned comparison's: its method and data setting."""
    t = trials.iloc[0]
    return f"{t['method']}-{Path(str(t['dataset'])).stem}-{str(t['partition']).replace(':', '')}-{t['clients']}c"


def best_schedules(runs: list[dict], summaries: pd.DataFrame, best: pd.DataFrame) -> list[dict]:
    """Each population-based sweep's best trial: its schedule (round, trial, settings), its rows and its config."""
    out = []
    for row in best.to_dict("records") if "schedule" in best else []:
        if not isinstance(row.get("schedule"), str):
            continue
        trials = summaries[
            (summaries["stage"] == "search") & (summaries["experiment"] == str(Path(row["path"]) / "search"))
        ]
        run = runs[trials.loc[best_run(trials[trials[SCORE].notna()])].name]
        out.append(
            {
                "sweep": row["sweep"],
                "schedule": run["schedule"],
                "rows": run["rows"],
                "config": run["config"],
                "file": row["schedule"],
                "log_scale": run.get("log_scale"),
            }
        )
    return out


def schedule_markdown(sweep: str, schedule: pd.DataFrame, file: str, method: str) -> str:
    """The best trial's schedule as the spans of rounds its settings held, and the command that replays it."""
    settings = [c for c in schedule.columns if c not in ("round", "trial")]
    changed = (schedule[["trial", *settings]] != schedule[["trial", *settings]].shift()).any(axis=1).cumsum()
    spans = [
        {
            "rounds": f"{g['round'].iloc[0]}–{g['round'].iloc[-1]}",
            "trained by": g["trial"].iloc[0],
            **{n: _short(g[n].iloc[0]) for n in settings},
        }
        for _, g in schedule.groupby(changed)
    ]
    stem = file.removesuffix(".csv")
    if not perturbed(schedule):
        held = ", ".join(f"{k}={v}" for k, v in spans[0].items() if k not in ("rounds", "trained by"))
        return (
            f"\n\n## {sweep}: the best trial was never perturbed\n\nIts state went through rounds {spans[0]['rounds']} "
            f"trained by {spans[0]['trained by']} alone, with {held} throughout: no exploit reached it, so it has no "
            f"schedule to show.\n\nRerun it from round 1: `tuner run {method} --config {stem}.yaml --schedule {file}`\n"
        )
    return (
        f"\n\n## {sweep}: the best trial's schedule\n\nThe rounds its state went through, with the trial that "
        "trained them "
        "and the settings then (the rounds a donor trained came with its "
        f"state).\n\n{pd.DataFrame(spans).to_markdown(index=False)}\n\n"
        f"Replay it from round 1: `tuner run {method} --config {stem}.yaml --schedule {file}`\n"
    )


def perturbed(schedule: pd.DataFrame) -> bool:
    """Whether a population trial's schedule changed hands or settings at all (a trial no exploit reached did not)."""
    varying = [c for c in schedule.columns if c != "round"]
    return bool((schedule[varying].nunique() > 1).any())


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def best_markdown(best: pd.DataFrame) -> str:
    shown = best.drop(columns=["path"] + ([] if best["running"].any() else ["running"])).copy()
    for col in ("val_acc", "selected_acc", "seeds_mean", "seeds_std"):
        if col in shown:
            shown[col] = (100 * shown[col]).round(2)
    return shown.to_markdown(index=False)


def setting_value(cfg: RunConfig, name: str):
    """A searched name's value in a run: a hyperparameter of its method or a run setting."""
    return cfg.hparams[name] if name in cfg.hparams else getattr(cfg, name)
