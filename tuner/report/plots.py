"""Figures: each method's accuracy curve (its best run) per setting, and each sweep's searched values
against the selected accuracy of its trials."""

from __future__ import annotations

import hashlib
import re
from functools import partial
from pathlib import Path

import pandas as pd

from tuner.data.user_data import is_user_data
from tuner.files import write_atomic
from tuner.report.best import searches, setting_value
from tuner.report.runs import best_run


def dataset_names(datasets) -> dict[str, str]:
    """A short name for each dataset, for file names and titles: a built-in's own; a file's stem, with a
    hash of its path where two files of one stem (in different folders) are reported together."""
    paths = sorted(set(datasets))
    stem = {d: re.sub(r"[^A-Za-z0-9._-]+", "-", Path(d).stem) if is_user_data(d) else d for d in paths}
    shared = {s for s in stem.values() if list(stem.values()).count(s) > 1}
    return {d: f"{s}-{hashlib.sha1(d.encode()).hexdigest()[:6]}" if s in shared else s for d, s in stem.items()}


def plot_curves(runs: list[dict], summaries: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy per round of the best run of each method, one figure per setting."""
    import matplotlib.pyplot as plt

    files = []
    ok = summaries[summaries["selected_acc"].notna()]
    short = dataset_names(ok["dataset"])
    for (dataset, partition, clients), group in ok.groupby(["dataset", "partition", "clients"]):
        curves = []
        for title, by_method in group.groupby("title"):
            best = group.loc[best_run(by_method)]
            rows = runs[best.name]["rows"]
            rows = rows[rows["acc"].notna()]
            curves.append(
                (f"{title} ({100 * best['selected_acc']:.2f})", best["selected_acc"], rows["round"], 100 * rows["acc"])
            )
        fig = curves_figure(curves, f"{short[dataset]} {partition}, {clients} clients")
        path = out / f"curves-{short[dataset]}-{partition.replace(':', '')}-{clients}.png"
        # bbox_inches tight: the legend and title whole
        write_atomic(path, partial(fig.savefig, dpi=120, format="png", bbox_inches="tight"))
        plt.close(fig)
        files.append(path)
    return files


def curves_figure(curves: list[tuple], title: str):
    """(label, selected accuracy, rounds, accuracies) per method: the curves, and the legend, best method first,
    beside the axes (inside, it covered the curves at 20 methods), in columns of at most 16."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    columns = 1 + (len(curves) - 1) // 16
    fig, ax = plt.subplots(figsize=(6 + 2.6 * columns, 4.2))
    for i, (label, _, rounds, acc) in enumerate(sorted(curves, key=lambda c: -c[1])):
        # the 10 colours repeat; the styles tell apart
        ax.plot(rounds, acc, label=label, linestyle=("-", "--", ":")[i // 10 % 3])
    ax.set(xlabel="round", ylabel="test accuracy (%)", title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole
    ax.legend(
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0,
        ncol=columns,
        title="selected acc. (%)",
        title_fontsize=7,
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_sweeps(runs: list[dict], summaries: pd.DataFrame, out: Path) -> list[Path]:
    """For each sweep, every searched setting against the selected accuracy of its trials."""
    import matplotlib.pyplot as plt

    files = []
    for sweep_dir, label, trials in searches(summaries):
        chosen = best_run(trials)
        if chosen is None:  # a cell the setting refused: every trial failed before a round
            continue
        first = runs[trials.index[0]]
        values = {n: [setting_value(runs[i]["config"], n) for i in trials.index] for n in first["searched"]}
        log = [n for n, xs in values.items() if _log_scale(first, n, xs)]
        name = sweep_dir.name + (f"-{label}" if label else "")
        fig = sweep_figure(
            values, list(100 * trials["selected_acc"]), list(trials.index).index(chosen), log, f"sweep {name}"
        )
        path = out / f"sweep-{name}.png"
        write_atomic(path, partial(fig.savefig, dpi=120, format="png", bbox_inches="tight"))
        plt.close(fig)
        files.append(path)
    return files


def sweep_figure(values: dict[str, list], accs: list[float], chosen: int, log: list[str], title: str):
    """One panel a searched setting: its value in each trial against the trial's selected accuracy, on a log axis
    where it was searched on one, the chosen trial (index `chosen`) starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(values), figsize=(4 * len(values), 3.5), squeeze=False)
    for ax, (name, xs) in zip(axes[0], values.items(), strict=True):
        shown = xs if _numeric(xs) else [str(x) for x in xs]
        ax.scatter(shown, accs, alpha=0.7)
        ax.scatter([shown[chosen]], [accs[chosen]], marker="*", s=180, color="tab:red", label="chosen", zorder=3)
        if name in log:
            ax.set_xscale("log")
        ax.set(xlabel=name, ylabel="selected test accuracy (%)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _numeric(xs: list) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)


def _log_scale(run: dict, name: str, xs: list) -> bool:
    """As the space searched it (recorded by the sweep); a sweep written before that record: positive numbers
    spanning more than a factor of 20."""
    if not _numeric(xs):
        return False
    if run.get("log_scale") is not None:
        return name in run["log_scale"]
    return min(xs) > 0 and max(xs) / min(xs) > 20


def plot_schedule(best: dict, path: Path) -> Path:
    """A population-based sweep's best trial: each mutated setting over rounds, above its accuracy curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schedule, rows = best["schedule"], best["rows"]
    settings = [c for c in schedule.columns if c not in ("round", "trial")]
    fig, axes = plt.subplots(len(settings) + 1, 1, figsize=(6.5, 1.6 * len(settings) + 2.8), sharex=True)
    for ax, name in zip(axes, settings, strict=False):
        ax.step(schedule["round"], schedule[name], where="post")
        ax.set(ylabel=name, yscale="log" if name in (best["log_scale"] or []) else "linear")
        ax.grid(alpha=0.3)
    scored = rows[rows["acc"].notna()]
    axes[-1].plot(scored["round"], 100 * scored["acc"], label="test")
    if "val_acc" in scored and scored["val_acc"].notna().any():
        axes[-1].plot(scored["round"], 100 * scored["val_acc"], label="validation", linestyle="--")
    axes[-1].set(xlabel="round", ylabel="accuracy (%)")
    axes[-1].legend(fontsize=7)
    axes[-1].grid(alpha=0.3)
    axes[0].set_title(f"{best['sweep']}: the best trial's schedule")
    fig.tight_layout()
    write_atomic(path, lambda p: fig.savefig(p, dpi=120, format="png", bbox_inches="tight"))
    plt.close(fig)
    return path
