"""The papers' tables rebuilt from what was run, published numbers beside ours, and their agreement.

A paper's table cell is matched by dataset, partition, backbone, clients and join ratio; its value is the
mean ± std over seeds of the selected test accuracy: the seed reruns or reproduction trials where they exist,
else the best configuration tried (grouped by everything but the seed).
"""

from __future__ import annotations

import math
from functools import partial

import pandas as pd

from tuner.plugins import is_variant
from tuner.report.runs import FINAL_STAGES, SELECTION
from tuner.selection import SCORE, best_of, started
from tuner.settings import papers
from tuner.settings.config import RunConfig


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
    cells = pd.DataFrame(
        [
            {**c, "kind": c["setting"], "beta_key": -1.0 if math.isnan(c["beta"]) else c["beta"], "index": i}
            for i, c in ours["cell"].items()
        ]
    ).drop(columns=["setting", "beta"])
    paper = paper.assign(beta_key=paper["beta"].fillna(-1.0))
    matched = (
        paper[["paper", "table", "kind", *COLUMN]]
        .drop_duplicates()
        .merge(cells, on=["dataset", "kind", "backbone", "num_clients", "join_ratio", "beta_key"])
    )
    if matched.empty:  # runs of settings no paper reports: no paper table, the rest of the report stands
        return pd.DataFrame()
    out = []
    for (paper_name, table), hits in matched.groupby(["paper", "table"], sort=False):
        rows = paper[(paper["paper"] == paper_name) & (paper["table"] == table)]
        reported = rows["reported"].iloc[0]
        backbones = rows.groupby(["dataset", "setting"])["backbone"].nunique()
        for col, published in rows.groupby(COLUMN, sort=False):
            col = pd.Series(dict(zip(COLUMN, col, strict=True)))
            label = column_label(col, backbones[(col.dataset, col.setting)] > 1)
            mine = ours.loc[hits.loc[(hits[COLUMN] == col.values).all(axis=1), "index"]]
            by_title = dict(
                zip(published["method"], zip(published["mean"], published["std"], strict=True), strict=True)
            )
            mine = mine.assign(title=mine["title"].map(partial(papers.label_in, paper_name)))
            # beside a main table, never stray ablations
            baselines = mine.loc[[not is_variant(m) for m in mine["method"]]]
            extras = sorted(set(baselines["title"]) - set(by_title)) if papers.is_main(paper_name, table) else []
            for title in list(by_title) + extras:
                paper_mean, paper_std = by_title.get(title, (math.nan, math.nan))
                runs = mine[mine["title"] == title]
                out.append(
                    {
                        "paper": paper_name,
                        "table": table,
                        "column": label,
                        "method": title,
                        **_cell(runs, reported),
                        "reported": _reported_label(reported, runs),
                        "paper_mean": paper_mean,
                        "paper_std": paper_std,
                    }
                )
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
    by_config = candidates.groupby("config_key", sort=False)["run"]  # a configuration's runs: its seeds
    chosen = best_of(
        by_config.groups,
        lambda k: candidates.loc[by_config.groups[k], SCORE].mean(),
        lambda k: min(map(started, by_config.get_group(k))),
    )
    final = candidates[candidates["config_key"] == chosen]
    acc = 100 * final[value].to_numpy()
    return {
        "ours_mean": float(acc.mean()),
        "ours_std": float(acc.std()),
        "seeds": len(acc),
        "rounds": int(final["rounds_run"].max()),
    }


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
            ours = (
                f"{r['ours_mean']:.2f}"
                + (f"±{r['ours_std']:.2f}" if r["seeds"] > 1 else "")
                + f" [{r['seeds']}×{r['rounds']}r]"
            )
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
        # Spearman: Pearson of the ranks
        rank = t["ours_mean"].rank().corr(t["paper_mean"].rank()) if len(t) > 2 else math.nan
        rows.append(
            {
                "paper": paper_name,
                "table": table,
                "column": column,
                "methods": len(t),
                "spearman": rank,
                "mean_abs_difference": float(t["difference"].abs().mean()),
                "within_1": int((t["difference"].abs() <= 1).sum()),
                "rounds_min": int(t["rounds"].min()),
                "rounds_max": int(t["rounds"].max()),
            }
        )
    return pd.DataFrame(rows)


def agreement_line(a) -> str:
    rounds = f"{a.rounds_min}" if a.rounds_min == a.rounds_max else f"{a.rounds_min} to {a.rounds_max}"
    spearman = "" if math.isnan(a.spearman) else f"Spearman {a.spearman:.2f}, "
    return (
        f"{a.column}: {a.methods} method{'s' if a.methods != 1 else ''}, {spearman}mean |Δ| "
        f"{a.mean_abs_difference:.2f}, {a.within_1} within 1 point; runs of {rounds} rounds"
    )


def render(tables: pd.DataFrame, fmt: str) -> str:
    """Markdown or LaTeX, one table per paper table, laid out as the paper's (Markdown: with each column's
    agreement)."""
    parts = []
    agreed = agreement(tables)
    for (paper_name, table), t in tables.groupby(["paper", "table"], sort=False):
        frame = wide_table(t)
        reported = "; ".join(sorted(set(t.loc[t["seeds"] > 0, "reported"]))) or "-"
        if fmt == "markdown":
            frame.columns = [f"{c} {k}" for c, k in frame.columns]
            lines = [f"- {agreement_line(a)}" for a in agreed.itertuples() if (a.paper, a.table) == (paper_name, table)]
            parts.append(
                f"### {paper_name} {table}\n\nOurs: {reported}.\n\n{frame.to_markdown()}\n"
                + ("\nAgreement with the paper:\n\n" + "\n".join(lines) + "\n" if lines else "")
            )
        else:
            # pandas escapes LaTeX's special characters in every cell and label (a method's title may hold & or %);
            # the caption is the catalogue's own words. The Unicode the labels use becomes math.
            latex = frame.to_latex(
                caption=f"{paper_name} {table} (ours: {reported})", multicolumn_format="c", escape=True
            )
            for text, tex in (("Δ", r"$\Delta$"), ("±", r"$\pm$"), ("β", r"$\beta$"), ("ρ", r"$\rho$"), ("—", "--")):
                latex = latex.replace(text, tex)
            parts.append(latex)
    return "\n".join(parts)
