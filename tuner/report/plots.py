"""Figures: each method's accuracy curve (its best run) per setting, and each sweep's searched values
against the selected accuracy of its trials."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pandas as pd

from tuner.data.user_data import is_user_data
from tuner.files import write_atomic
from tuner.report.best import setting_value
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    ok = summaries[summaries["selected_acc"].notna()]
    short = dataset_names(ok["dataset"])
    for (dataset, partition, clients), group in ok.groupby(["dataset", "partition", "clients"]):
        dataset = short[dataset]
        fig, ax = plt.subplots(figsize=(6, 4))
        for title, by_method in group.groupby("title"):
            best = by_method.loc[best_run(by_method)]
            rows = runs[best.name]["rows"]
            rows = rows[rows["acc"].notna()]
            ax.plot(rows["round"], 100 * rows["acc"], label=f"{title} ({100 * best['selected_acc']:.2f})")
        ax.set(xlabel="round", ylabel="test accuracy (%)", title=f"{dataset} {partition}, {clients} clients")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        path = out / f"curves-{dataset}-{partition.replace(':', '')}-{clients}.png"
        fig.tight_layout()
        write_atomic(path, lambda p: fig.savefig(p, dpi=120, format="png"))
        plt.close(fig)
        files.append(path)
    return files


def plot_sweeps(runs: list[dict], summaries: pd.DataFrame, out: Path) -> list[Path]:
    """For each sweep, every searched setting against the selected accuracy of its trials."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    search = summaries[summaries["stage"] == "search"]
    for experiment, trials in search.groupby("experiment"):
        names = runs[trials.index[0]]["searched"]
        values = {n: [setting_value(runs[i]["config"], n) for i in trials.index] for n in names}
        fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.5), squeeze=False)
        for ax, name in zip(axes[0], names):
            xs = values[name]
            numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
            ax.scatter(xs if numeric else [str(x) for x in xs], 100 * trials["selected_acc"], alpha=0.7)
            if numeric and min(xs) > 0 and max(xs) / min(xs) > 20:
                ax.set_xscale("log")
            ax.set(xlabel=name, ylabel="selected test accuracy (%)")
            ax.grid(alpha=0.3)
        name = Path(experiment).parent.name
        fig.suptitle(f"sweep {name}")
        fig.tight_layout()
        path = out / f"sweep-{name}.png"
        write_atomic(path, lambda p: fig.savefig(p, dpi=120, format="png"))
        plt.close(fig)
        files.append(path)
    return files

