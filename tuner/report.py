"""Everything that was run, as tables: per-round rows, per-run summaries, and the papers' tables rebuilt.

Runs are found under the given paths: `tuner run` directories (config.yaml + metrics.parquet) and
the Ray Tune experiments of `tuner sweep` / `tuner reproduce` (experiment.yaml + trial folders).
A paper's table cell is matched by dataset, partition, backbone, clients and join ratio; its value
is the mean ± std over seeds of the selected test accuracy: the seed reruns or reproduction
trials where they exist, else the best configuration tried (grouped by everything but the seed).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import yaml

from tuner import papers
from tuner.config import TRIAL_RETRIES, RunConfig, trial_config
from tuner.run import SCORE, RunDir, selection
from tuner.errors import UserError
from tuner.files import write_atomic, write_text_atomic
from tuner.data.user_data import is_user_data
from tuner.plugins import is_variant, method_title

SELECTION = {"test": "best test round", "val": "test at the best validation round"}
# Settings that do not make a configuration another one: seeds (mean ± std runs over them) and plumbing.
NOT_CONFIGURATION = ("seed", "partition_seed", "executor", "device", "cohort_chunk", "eval_batch", "checkpoint_every", "data_dir", "download")
FINAL_STAGES = ("seeds", "reproduce")  # runs made to be reported, not to be searched over


# --- collecting
UNREADABLE = (ValueError, OSError, KeyError, TypeError, yaml.YAMLError, UserError)  # damaged, truncated, or naming what is gone


def find_runs(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """Every run under `paths` (its stage, RunConfig and per-round rows), and one line for each file that
    could not be read (truncated by a kill, a full disk, a method file that is gone): skipped, not fatal."""
    runs, unreadable = [], []

    def read(what: Path, load):
        try:
            return load()
        except UNREADABLE as e:
            unreadable.append(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            return None

    for root in paths:
        if not root.exists():
            raise UserError(f"{root} does not exist; name a run directory, a sweep or a folder holding them.")
        for config in sorted(root.rglob("config.yaml")):
            run_dir = RunDir(config.parent)
            if run_dir.metrics.exists():
                run = read(run_dir.path, lambda: {"run": str(run_dir.path), "stage": "run", "experiment": "", "select": "test",
                                                  "config": run_dir.read_config(), "rows": pd.read_parquet(run_dir.metrics)})  # fmt: skip
                runs += [run] if run else []
        for experiment in sorted(root.rglob("experiment.yaml")):
            info = read(experiment, lambda: _experiment_info(experiment))
            for params in sorted(experiment.parent.glob("*/params.json")) if info else []:
                run = read(params.parent, lambda: _trial(params, experiment, info))
                runs += [run] if run else []
    if not runs:
        problem = f" ({len(unreadable)} unreadable: {unreadable[0]})" if unreadable else ""
        raise UserError(f"No readable runs under {', '.join(map(str, paths))}{problem}; point at `tuner run` or `tuner sweep` results.")
    return runs, unreadable


def _experiment_info(path: Path) -> dict:
    info = yaml.safe_load(path.read_text())
    if not isinstance(info, dict) or "stage" not in info or "settings" not in info:
        raise ValueError("not an experiment description written by tuner sweep")
    return info


def _trial(params: Path, experiment: Path, info: dict) -> dict | None:
    rows = _trial_rows(params.parent / "result.json")
    sampled = json.loads(params.read_text())
    config = trial_config(info["settings"], sampled)
    finished = not rows.empty and rows["round"].max() >= config.rounds
    failed = "" if finished else tune_failure(params.parent / "error.txt")
    if rows.empty and not failed:  # not started yet
        return None
    return {"run": str(params.parent), "stage": info["stage"], "experiment": str(experiment.parent), "rows": rows, "select": info.get("select", "test"),
            "config": config, "searched": list(sampled) if info["stage"] == "search" else [], "failed": failed}  # fmt: skip


def tune_failure(error_txt: Path) -> str:
    """Why Ray Tune gave up on a trial (its worker died more often than it is retried, or an error in its code):
    the first sentence of its last failure; "" while it was retried from its checkpoint, or never failed."""
    if not error_txt.exists():
        return ""
    failures = re.split(r"^Failure # \d+.*$", error_txt.read_text(), flags=re.M)[1:]
    if len(failures) <= TRIAL_RETRIES:
        return ""
    messages = [line for line in failures[-1].splitlines() if line.strip() and not line[0].isspace() and not line.startswith("Traceback")]
    last = messages[-1].split(". ")[0].rstrip(".") if messages else "no message"
    return f"{len(failures)} failures, the last: {last}."


def _trial_rows(result_json: Path) -> pd.DataFrame:
    if not result_json.exists():
        return pd.DataFrame()
    lines = [line for line in result_json.read_text().splitlines() if line.strip()]
    try:
        rows = [json.loads(line) for line in lines]
    except json.JSONDecodeError:  # a kill mid-write cuts the last line: the rows before it stand
        rows = [json.loads(line) for line in lines[:-1]]
    df = pd.DataFrame(rows)
    if df.empty or "round" not in df:
        return pd.DataFrame()
    return df.drop_duplicates("round", keep="last").sort_values("round").reset_index(drop=True)  # a resumed trial repeats rounds


def config_key(cfg: RunConfig) -> str:
    """Identifies a configuration across seeds."""
    d = {k: v for k, v in asdict(cfg).items() if k not in NOT_CONFIGURATION}
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


def summarize(run: dict, select: str | None) -> dict:
    """One run's figures; `select` None: the run's own rule (its sweep's, else the papers' best test round)."""
    cfg, rows = run["config"], run["rows"]
    select = select or run["select"]
    evals = rows[rows["acc"].notna()] if "acc" in rows else rows.iloc[0:0]
    out = {
        "run": run["run"], "stage": run["stage"], "experiment": run["experiment"], "method": cfg.method,
        "title": method_title(cfg.method), "dataset": cfg.dataset, "partition": cfg.partition, "clients": cfg.clients,
        "join_ratio": str(cfg.join_ratio), "backbone": cfg.backbone, "seed": cfg.seed, "lr": cfg.lr, "batch_size": cfg.batch_size,
        "local_epochs": cfg.local_epochs, "rounds_planned": cfg.rounds, "rounds_run": int(rows["round"].max()) if len(rows) else 0,
        "config_key": config_key(cfg), "failed": _failure(rows) or run.get("failed", ""), "selected_by": select, "time_s": float(rows["time_s"].sum()) if "time_s" in rows else math.nan,
        **{f"hp_{k}": v for k, v in cfg.hparams.items()},
    }  # fmt: skip
    chosen = selection(rows.to_dict("records"), select)
    out |= {"val_acc": chosen["best_val_acc"], "val_round": chosen["best_val_round"], SCORE: chosen[SCORE]}  # what chose, under val
    if math.isnan(chosen["selected_acc"]):
        return out | {"best_acc": math.nan, "best_round": math.nan, "selected_acc": math.nan}
    at = evals[evals["round"] == chosen["best_round"]].iloc[0]
    return out | {
        "best_acc": chosen["best_acc"], "best_round": int(chosen["best_round"]), "selected_acc": chosen["selected_acc"],
        "acc_std": float(at.get("acc_std", math.nan)), "acc_cv": float(at.get("acc_cv", math.nan)),
        "final_acc": float(evals["acc"].iloc[-1]), "final_round": int(evals["round"].iloc[-1]),
    }  # fmt: skip


def _failure(rows: pd.DataFrame) -> str:
    """The failure its last row reports; one before it was retried past (out of memory once, then the rounds went on)."""
    if "failed" not in rows or rows.empty or pd.isna(rows["failed"].iloc[-1]):
        return ""
    return str(rows["failed"].iloc[-1])


# --- the papers' tables
def paper_cell(cfg: RunConfig) -> dict | None:
    return papers.cell_of(cfg.dataset, cfg.partition, cfg.backbone, cfg.clients, cfg.join_ratio)


def column_label(col, multi_backbone: bool) -> str:
    label = f"{col.dataset} {col.setting}"
    if col.setting.startswith("practical") and col.beta_key >= 0:
        label += f" β={col.beta_key:g}"
    if col.num_clients != 20 and "_N" not in col.setting:
        label += f" N={col.num_clients} ρ={col.join_ratio}"
    return label + (f" ({col.backbone})" if multi_backbone else "")


COLUMN = ["setting", "dataset", "backbone", "num_clients", "join_ratio", "beta_key"]


def paper_tables(summaries: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """One row per (table, column, method): ours (mean ± std over seeds, n, rounds) beside the published number."""
    ours = summaries[summaries["selected_acc"].notna() & summaries["cell"].notna()]
    if ours.empty:
        return pd.DataFrame()
    cells = pd.DataFrame([{**c, "kind": c["setting"], "beta_key": -1.0 if math.isnan(c["beta"]) else c["beta"], "index": i}
                          for i, c in ours["cell"].items()]).drop(columns=["setting", "beta"])  # fmt: skip
    paper = paper.assign(beta_key=paper["beta"].fillna(-1.0))
    matched = paper[["paper", "table", "kind", *COLUMN]].drop_duplicates().merge(cells, on=["dataset", "kind", "backbone", "num_clients", "join_ratio", "beta_key"])
    if matched.empty:  # runs of settings no paper reports: no paper table, the rest of the report stands
        return pd.DataFrame()
    out = []
    for (paper_name, table), hits in matched.groupby(["paper", "table"], sort=False):
        rows = paper[(paper["paper"] == paper_name) & (paper["table"] == table)]
        reported = rows["reported"].iloc[0]
        backbones = rows.groupby(["dataset", "setting"])["backbone"].nunique()
        for col, published in rows.groupby(COLUMN, sort=False):
            col = pd.Series(dict(zip(COLUMN, col)))
            label = column_label(col, backbones[(col.dataset, col.setting)] > 1)
            mine = ours.loc[hits.loc[(hits[COLUMN] == col.values).all(axis=1), "index"]]
            by_title = dict(zip(published["method"], zip(published["mean"], published["std"])))
            mine = mine.assign(title=mine["title"].map(lambda t: papers.label_in(paper_name, t)))
            baselines = mine.loc[[not is_variant(m) for m in mine["method"]]]  # beside a main table, never stray ablations
            extras = sorted(set(baselines["title"]) - set(by_title)) if papers.is_main(paper_name, table) else []
            for title in list(by_title) + extras:
                paper_mean, paper_std = by_title.get(title, (math.nan, math.nan))
                runs = mine[mine["title"] == title]
                out.append({"paper": paper_name, "table": table, "column": label, "method": title, **_cell(runs, reported),
                            "reported": _reported_label(reported, runs), "paper_mean": paper_mean, "paper_std": paper_std})  # fmt: skip
    df = pd.DataFrame(out)
    df["difference"] = df["ours_mean"] - df["paper_mean"]
    return df


def _reported_label(reported: str, runs: pd.DataFrame) -> str:
    if reported == "final":
        return "final round"
    rules = sorted(set(runs["selected_by"])) if not runs.empty else ["test"]
    return " / ".join(SELECTION[r] for r in rules)


def _cell(runs: pd.DataFrame, reported: str) -> dict:
    """Mean ± std over seeds of the runs that stand for one method in one cell, by the table's metric."""
    if runs.empty:
        return {"ours_mean": math.nan, "ours_std": math.nan, "seeds": 0, "rounds": 0}
    value = "final_acc" if reported == "final" else "selected_acc"
    final = runs[runs["stage"].isin(FINAL_STAGES)]
    candidates = runs if final.empty else final  # else the best configuration tried, over its seeds
    final = candidates[candidates["config_key"] == candidates.groupby("config_key", sort=False)[SCORE].mean().idxmax()]
    acc = 100 * final[value].to_numpy()
    return {"ours_mean": float(acc.mean()), "ours_std": float(acc.std()), "seeds": len(acc), "rounds": int(final["rounds_run"].max())}


def wide_table(t: pd.DataFrame, compact: bool = False) -> pd.DataFrame:
    """Rows are methods, columns (setting, ours | paper | Δ); compact (for the console) keeps only what we ran."""
    if compact:
        t = t[t["column"].isin(t.loc[t["seeds"] > 0, "column"]) & t["method"].isin(t.loc[t["seeds"] > 0, "method"])]
    wide = {}
    for _, r in t.iterrows():
        row = wide.setdefault(r["method"], {})
        if math.isnan(r["ours_mean"]):
            ours = "—"
        elif compact:
            ours = f"{r['ours_mean']:.2f}" + (f"±{r['ours_std']:.2f}" if r["seeds"] > 1 else "") + f" [{r['seeds']}×{r['rounds']}r]"
        else:
            ours = f"{r['ours_mean']:.2f} ± {r['ours_std']:.2f} (n={r['seeds']}, {r['rounds']} r)"
        row[(r["column"], "ours")] = ours
        row[(r["column"], "paper")] = "—" if math.isnan(r["paper_mean"]) else f"{r['paper_mean']:.2f}"
        row[(r["column"], "Δ")] = "" if math.isnan(r["difference"]) else f"{r['difference']:+.2f}"
    frame = pd.DataFrame.from_dict(wide, orient="index")
    frame = frame.fillna({c: "" if c[1] == "Δ" else "—" for c in frame.columns})
    frame.columns = pd.MultiIndex.from_tuples(frame.columns)
    frame.index.name = "method"
    return frame


def agreement(tables: pd.DataFrame) -> pd.DataFrame:
    """Per paper column, how ours agree with the published figures over the methods that have both: Spearman's rank
    correlation, mean |Δ| and how many within a point, with the rounds the runs reached (the papers' length or not)."""
    both = tables[(tables["seeds"] > 0) & tables["paper_mean"].notna()]
    rows = []
    for (paper_name, table, column), t in both.groupby(["paper", "table", "column"], sort=False):
        rank = t["ours_mean"].rank().corr(t["paper_mean"].rank()) if len(t) > 2 else math.nan  # Spearman: Pearson of the ranks
        rows.append({"paper": paper_name, "table": table, "column": column, "methods": len(t), "spearman": rank,
                     "mean_abs_difference": float(t["difference"].abs().mean()), "within_1": int((t["difference"].abs() <= 1).sum()),
                     "rounds_min": int(t["rounds"].min()), "rounds_max": int(t["rounds"].max())})  # fmt: skip
    return pd.DataFrame(rows)


def agreement_line(a) -> str:
    rounds = f"{a.rounds_min}" if a.rounds_min == a.rounds_max else f"{a.rounds_min} to {a.rounds_max}"
    spearman = "" if math.isnan(a.spearman) else f"Spearman {a.spearman:.2f}, "
    return f"{a.column}: {a.methods} method{'s' if a.methods != 1 else ''}, {spearman}mean |Δ| {a.mean_abs_difference:.2f}, {a.within_1} within 1 point; runs of {rounds} rounds"


def render(tables: pd.DataFrame, fmt: str) -> str:
    """Markdown or LaTeX, one table per paper table, laid out as the paper's (Markdown: with each column's agreement)."""
    parts = []
    agreed = agreement(tables)
    for (paper_name, table), t in tables.groupby(["paper", "table"], sort=False):
        frame = wide_table(t)
        reported = "; ".join(sorted(set(t.loc[t["seeds"] > 0, "reported"]))) or "-"
        if fmt == "markdown":
            frame.columns = [f"{c} {k}" for c, k in frame.columns]
            lines = [f"- {agreement_line(a)}" for a in agreed.itertuples() if (a.paper, a.table) == (paper_name, table)]
            parts.append(f"### {paper_name} {table}\n\nOurs: {reported}.\n\n{frame.to_markdown()}\n" + ("\nAgreement with the paper:\n\n" + "\n".join(lines) + "\n" if lines else ""))
        else:
            latex = frame.to_latex(caption=f"{paper_name} {table} (ours: {reported})", multicolumn_format="c")
            for text, tex in (("_", r"\_"), ("Δ", r"$\Delta$"), ("±", r"$\pm$"), ("β", r"$\beta$"), ("ρ", r"$\rho$"), ("—", "--")):
                latex = latex.replace(text, tex)
            parts.append(latex)
    return "\n".join(parts)


# --- each sweep's best configuration
def best_configs(runs: list[dict], summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep: trials run, failed and stopped early, the best trial's searched values and
    figures, and the mean ± std of its seed reruns where the sweep made them."""
    out = []
    search = summaries[summaries["stage"] == "search"]
    for experiment, trials in search.groupby("experiment", sort=True):
        sweep_dir = Path(experiment).parent
        scored = trials[trials[SCORE].notna()]
        row = {"sweep": sweep_dir.name, "path": str(sweep_dir), "method": trials["title"].iloc[0], "trials": len(trials),
               "failed": int((trials["failed"] != "").sum()), "stopped_early": int(((trials["rounds_run"] < trials["rounds_planned"]) & (trials["failed"] == "")).sum())}  # fmt: skip
        if not scored.empty:
            best = scored.loc[scored[SCORE].idxmax()]  # by the sweep's rule, as its console and Optuna's study chose
            cfg = runs[best.name]["config"]
            row |= {"selected_by": best["selected_by"], "val_acc": best["val_acc"], "val_round": best["val_round"],
                    "selected_acc": best["selected_acc"], "best_round": best["best_round"], "rounds_run": best["rounds_run"],
                    "config": ", ".join(f"{n}={_short(_value(cfg, n))}" for n in runs[best.name]["searched"])}  # fmt: skip
        seeds = summaries[(summaries["stage"] == "seeds") & (summaries["experiment"] == str(sweep_dir / "seeds"))]["selected_acc"].dropna()
        if len(seeds):
            row |= {"seeds": len(seeds), "seeds_mean": float(seeds.mean()), "seeds_std": float(seeds.std(ddof=0))}
        out.append(row)
    return pd.DataFrame(out)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def best_markdown(best: pd.DataFrame) -> str:
    shown = best.drop(columns=["path"]).copy()
    for col in ("val_acc", "selected_acc", "seeds_mean", "seeds_std"):
        if col in shown:
            shown[col] = (100 * shown[col]).round(2)
    return shown.to_markdown(index=False)


# --- plots
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
            best = by_method.loc[by_method[SCORE].idxmax()]
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
        values = {n: [_value(runs[i]["config"], n) for i in trials.index] for n in names}
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


def _value(cfg: RunConfig, name: str):
    return cfg.hparams[name] if name in cfg.hparams else getattr(cfg, name)


# --- the whole report
def report(paths: list[Path], out: Path, select: str | None = None) -> dict:
    """`select` None: each run by its own rule (its sweep's `select`; best test round for runs and reproductions)."""
    if select not in (None, "test", "val"):
        raise UserError(f"--select must be test or val, not {select!r}.")
    runs, unreadable = find_runs(paths)
    out.mkdir(parents=True, exist_ok=True)
    per_round = pd.concat([r["rows"].assign(run=r["run"], method=r["config"].method) for r in runs], ignore_index=True)
    per_round = per_round.drop(columns=[c for c in per_round if c.startswith("config/")])
    summaries = pd.DataFrame([summarize(r, select) for r in runs])
    summaries["cell"] = [paper_cell(r["config"]) for r in runs]
    tables = paper_tables(summaries, papers.load_tables())
    write_atomic(out / "rounds.parquet", lambda p: per_round.to_parquet(p, index=False))
    write_atomic(out / "runs.parquet", lambda p: summaries.drop(columns="cell").to_parquet(p, index=False))
    written = [out / "rounds.parquet", out / "runs.parquet"]
    rules = sorted(set(summaries["selected_by"]))
    note = "Selected by " + " and ".join(SELECTION[r] for r in rules) + " (each table says which figure it shows: the best or the final round).\n\n"
    if not tables.empty:
        write_atomic(out / "tables.parquet", lambda p: tables.to_parquet(p, index=False))
        write_atomic(out / "agreement.parquet", lambda p: agreement(tables).to_parquet(p, index=False))
        write_text_atomic(out / "tables.md", note + render(tables, "markdown"))
        write_text_atomic(out / "tables.tex", render(tables, "latex"))
        written += [out / "tables.parquet", out / "agreement.parquet", out / "tables.md", out / "tables.tex"]
    best = best_configs(runs, summaries)
    if not best.empty:
        write_atomic(out / "best.parquet", lambda p: best.to_parquet(p, index=False))
        write_text_atomic(out / "best.md", note + "Best configuration of each sweep (accuracies in %).\n\n" + best_markdown(best) + "\n")
        written += [out / "best.parquet", out / "best.md"]
    written += plot_curves(runs, summaries, out) + plot_sweeps(runs, summaries, out)
    missing = int(summaries["selected_acc"].isna().sum())
    return {"runs": len(runs), "failed": int((summaries["failed"] != "").sum()), "unselectable": missing, "unreadable": unreadable,
            "tables": tables, "best": best, "summaries": summaries, "files": written, "note": note.strip()}  # fmt: skip

