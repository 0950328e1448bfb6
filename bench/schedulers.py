"""Tuning while training against searching before it, at equal rounds a sweep: Optuna's TPE with ASHA against
PBT against PB2, each over the same space, several sweep seeds each (the seed draws the
first trials and seeds their runs). For each sweep: the best trial's validation accuracy and the test accuracy at
its round (the selection rule, `select: val`), the rounds all its trials trained, and the anytime curve (the
best validation accuracy any trial had reached, against the rounds spent so far).

    python bench/schedulers.py --methods fedavg gpfl --seeds 0 1 2 --out results/schedulers-digits
    python bench/schedulers.py --dataset fmnist --rounds 10 --samples 4 --set backbone=mlp --set executor=vectorized \
        --out results/schedulers-fmnist

Each sweep is a `tuner sweep` subprocess on local Ray (sweeps under OUT/sweeps/; a finished one is read, not run
again, and one stopped midway resumes, so a long comparison may be stopped and run again to go on). PBT and PB2 run
`samples`
trials of `rounds` rounds; ASHA runs twice the trials under `max_total_rounds` = samples × rounds, so every
sweep has the same rounds to spend (ASHA spends what its stopped trials leave on more trials). Writes
OUT/comparison.json (with the command, commit and machine), OUT/comparison.md, OUT/anytime.png and OUT/lineages/ (each
trial's rounds file and reports: who trained which round, under which settings)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from bench import provenance  # noqa: E402
from tuner.sweep.schedulers import SCHEDULERS  # noqa: E402
from tuner.sweep.trial_files import lineage_rows, trial_rows  # noqa: E402

SEARCH = {  # each method's float settings, the ranges of its shipped space
    "fedavg": {"lr": {"loguniform": [0.001, 0.2]}},
    "gpfl": {"lam": {"loguniform": [0.0001, 1]}, "mu": {"loguniform": [0.001, 1]}, "lr": {"loguniform": [0.005, 0.2]}},
}
SPENT_AT = (0.25, 0.5, 0.75, 1.0)  # the anytime curve's points, as fractions of the budget


def space(method: str, scheduler: str, args) -> dict:
    settings = {
        "dataset": args.dataset,
        "partition": args.partition,
        "clients": args.clients,
        "rounds": args.rounds,
        "executor": "sequential",
    }
    settings |= dict((key, yaml.safe_load(value)) for key, _, value in (s.partition("=") for s in args.set))
    out = {"settings": settings, "search": SEARCH[method], "select": "val", "samples": args.samples}
    if scheduler == "asha":
        return out | {
            "samples": 2 * args.samples,
            "stop": {"grace": args.rounds // 4, "max_total_rounds": args.samples * args.rounds},
        }
    return out | {"scheduler": {"kind": scheduler, "perturbation_interval": args.rounds // 5}}


def sweep(method: str, scheduler: str, seed: int, args) -> Path:
    name = f"{method}-{scheduler}-seed{seed}"
    storage = Path(args.out) / "sweeps"
    if (storage / name / "summary.yaml").exists():  # a finished sweep is not run again
        return storage / name
    storage.mkdir(parents=True, exist_ok=True)
    file = storage / f"{name}.yaml"
    file.write_text(yaml.safe_dump(space(method, scheduler, args), sort_keys=False))
    resume = ["--resume"] if (storage / name / "search").exists() else []  # a sweep stopped midway (Ctrl-C) goes on
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "sweep",
            method,
            "--space",
            str(file),
            "--storage",
            str(storage),
            "--name",
            name,
            "--set",
            f"seed={seed}",
            *resume,
        ],
        check=True,
        cwd=ROOT,
    )
    return storage / name


def anytime(sweep_dir: Path, scheduler: str, budget: int) -> tuple[int, list[float]]:
    """(rounds all trials trained, the best validation accuracy reached by each point of SPENT_AT × budget). ASHA's
    trials in the order their rounds were reported (`reported_at`, reported from 750699b on). A population as if in
    lockstep (PBT runs the trial furthest behind first and pauses those ahead, so its trials stay within about one
    interval of each other): at round r all have trained r rounds, and the best is the best of the rounds their final
    states went through by then (a trial's rounds before it took another's state are gone from its file: they
    ranked in the bottom quantile)."""
    trials = sorted((sweep_dir / "search").glob("federated_trial_*"))
    if scheduler == "asha":
        # in the order reported, to the microsecond (Ray's timestamp is whole seconds: a round takes less)
        rows = pd.concat([trial_rows(t / "result.json") for t in trials], ignore_index=True).sort_values("reported_at")
        spent, best = range(1, len(rows) + 1), rows["val_acc"].cummax().tolist()
        points = [
            max((b for s, b in zip(spent, best, strict=True) if s <= f * budget), default=float("nan"))
            for f in SPENT_AT
        ]
        return len(rows), points
    lineages = [lineage_rows(t, pd.DataFrame())[0] for t in trials]
    best_by = lambda r: max(rows.loc[rows["round"] <= r, "val_acc"].max() for rows in lineages)  # noqa: E731
    return sum(map(trained_rounds, trials)), [best_by(round(f * budget / len(trials))) for f in SPENT_AT]


def trained_rounds(trial: Path) -> int:
    """The rounds a trial trained: a report a round it ran (result.json keeps the rounds it ran before it took a
    donor's state, which its rounds file drops; a donor's rounds it took are not its own, nor a donor's last state
    handed over and reported). Not trials × the last round: a trial that took a state from ahead skipped the rounds
    between. Exact from the commit that keeps every row across a trial's restarts (tuner/sweep/recovery.py
    ResultRows); before it, Ray Tune's own writer dropped rows at each exploit and this undercounted."""
    result = trial / "result.json"
    rows = [json.loads(line) for line in result.read_text().splitlines() if line.strip()] if result.exists() else []
    return sum(1 for row in rows if not row.get("handed_over"))


def keep_lineages(sweep_dir: Path, out: Path) -> None:
    """Each trial's rounds file (the rounds its state went through, who trained them, the settings then) and its
    reports, under OUT/lineages/SWEEP/, so a committed comparison can be read again without its sweeps."""
    for trial in sorted((sweep_dir / "search").glob("federated_trial_*")):
        kept = out / "lineages" / sweep_dir.name / trial.name
        kept.mkdir(parents=True, exist_ok=True)
        rounds = max(trial.glob("checkpoint_*/rounds.parquet"), default=None)
        for source, name in ((rounds, "rounds.parquet"), (trial / "result.json", "result.json")):
            if source is not None and source.exists():
                (kept / name).write_bytes(source.read_bytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="+", default=list(SEARCH), choices=list(SEARCH))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--partition", default="dir:0.1")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--samples", type=int, default=8, help="PBT's and PB2's population (ASHA: twice as many trials)")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a run setting of every sweep (backbone=mlp)"
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    budget, out = args.samples * args.rounds, Path(args.out)
    results = []
    for method in args.methods:
        for scheduler in SCHEDULERS:
            for seed in args.seeds:
                sweep_dir = sweep(method, scheduler, seed, args)
                best = yaml.safe_load((sweep_dir / "summary.yaml").read_text())["best"]
                spent, points = anytime(sweep_dir, scheduler, budget)
                keep_lineages(sweep_dir, out)
                results.append(
                    {
                        "method": method,
                        "scheduler": scheduler,
                        "seed": seed,
                        "best_val_acc": best["best_val_acc"],
                        "selected_acc": best["selected_acc"],
                        "rounds_spent": spent,
                        "anytime": points,
                    }
                )
                print(json.dumps(results[-1]), flush=True)
    setting = {k: getattr(args, k) for k in ("dataset", "partition", "clients", "rounds", "samples")} | {
        "budget_rounds": budget,
        "spent_at": list(SPENT_AT),
    }
    setting |= {"settings": space(args.methods[0], "asha", args)["settings"]}
    provenance.write(out / "comparison.json", {"setting": setting, "sweeps": results})
    table = pd.DataFrame(results)
    summary = table.groupby(["method", "scheduler"], sort=False).agg(
        sweeps=("seed", "size"),
        best_val_mean=("best_val_acc", "mean"),
        best_val_std=("best_val_acc", "std"),
        test_mean=("selected_acc", "mean"),
        test_std=("selected_acc", "std"),
        rounds_spent=("rounds_spent", "mean"),
    )
    for col in ("best_val_mean", "best_val_std", "test_mean", "test_std"):
        summary[col] = (100 * summary[col]).round(2)
    (out / "comparison.md").write_text(summary.reset_index().to_markdown(index=False) + "\n")
    plot(table, budget, out / "anytime.png")


def plot(table: pd.DataFrame, budget: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(table["method"]))
    fig, axes = plt.subplots(1, len(methods), figsize=(5 * len(methods), 3.8), squeeze=False)
    for ax, method in zip(axes[0], methods, strict=True):
        for scheduler, group in table[table["method"] == method].groupby("scheduler", sort=False):
            curves = pd.DataFrame(group["anytime"].tolist()) * 100
            ax.errorbar([f * budget for f in SPENT_AT], curves.mean(), yerr=curves.std(), label=scheduler, capsize=3)
        ax.set(title=method, xlabel="rounds spent by the sweep", ylabel="best validation accuracy so far (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
