"""The fair table of a tuned comparison (tuner/experiments/tuned_comparison.py), from the report's summary rows.

Per method and data setting: test accuracy at the round validation chose, at the paper defaults and tuned (mean ±
sample std over the same fresh seeds), the gain with its 95 % interval paired over those seeds, its p with Holm's
adjusted p and the Benjamini–Hochberg q over the setting's methods, the rank at defaults and tuned, and the budget
its search spent (trials, rounds trained). Per setting: Kendall's τ between the two rankings, whether the paper's own
method is first at defaults and tuned, and its tuned difference to every other method tuned (paired over seeds, Holm
over those others: never a runner-up picked after seeing the results). An interval that covers 0 is written "not
distinguishable". Per comparison: the share of its trial slots' wall time spent training (the rest is starting
trials, importing, Tune's bookkeeping).
"""

from __future__ import annotations

import math
import re
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from scipy import stats

from tuner.report.budget_flags import EDGE, LOCAL_WORK, at_edge_of_searches, chose_last_round
from tuner.report.intervals import benjamini_hochberg, holm, searches_and_seeds
from tuner.report.searches import gain_over_searches, reruns_of, search_configs
from tuner.settings import papers
from tuner.settings.tuned_files import DATA_SETTINGS, setting_name

LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    **{c: "\\" + c for c in "&%$#_{}"},
}
COMPARISON_FILE = "comparison.yaml"  # tuner/experiments/tuned_comparison.py's record, at the comparison's root


def comparison_root(experiment: str) -> Path | None:
    """The tuned comparison an experiment folder belongs to (its defaults stage, or a cell's search or seeds)."""
    for folder in Path(experiment).parents if experiment else []:
        if (folder / COMPARISON_FILE).exists():
            return folder
    return None


def fair_tables(summaries: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per method and setting, per setting) over every tuned comparison among the summaries; empty without one."""
    roots = summaries["experiment"].map(lambda e: comparison_root(e) if e else None)
    methods, columns = [], []
    for root in sorted({r for r in roots if r is not None}):
        record = yaml.safe_load((root / COMPARISON_FILE).read_text()) or {}
        ours = summaries[roots == root].assign(setting=lambda d: [setting_name(r) for r in d.to_dict("records")])
        table = record.get("asked", {}).get("table", "")
        for setting, runs in ours.groupby("setting", sort=True):
            rows = [_method_row(m, group, root, record) for m, group in runs.groupby("method", sort=True)]
            frame = pd.DataFrame(rows).assign(comparison=root.name, table=table, setting=setting)
            frame["rank_defaults"] = frame["defaults_mean"].rank(ascending=False, method="min")
            frame["rank_tuned"] = frame["tuned_mean"].rank(ascending=False, method="min")
            # the table's family: every method's gain at this setting, corrected together
            frame["gain_p_holm"] = holm(frame["gain_p"].tolist())
            frame["gain_q_bh"] = benjamini_hochberg(frame["gain_p"].tolist())
            frame["established"] = frame["gain_p_holm"] < 0.05
            own = _own_method(table)
            frame = _against_own(frame, own)
            methods.append(frame)
            columns.append(_column_row(frame, runs, record, table, setting, root, own))
    if not methods:
        return pd.DataFrame(), pd.DataFrame()
    return pd.concat(methods, ignore_index=True), pd.DataFrame(columns)


def _method_row(method: str, runs: pd.DataFrame, root: Path, record: dict) -> dict:
    """The method's row: defaults and tuned paired over seeds; tuned by several searches, every search's reruns
    against the defaults, searches and seeds each a random effect (tuner/report/searches.py)."""
    defaults_by = runs[runs["stage"] == "defaults"].dropna(subset=["selected_acc"]).set_index("seed")["selected_acc"]
    reruns = runs[runs["stage"] == "seeds"]
    configs = search_configs(record, method, runs["dataset"].iloc[0])
    by_search = (
        [reruns_of(c, reruns) for c in configs]
        if len(configs) > 1
        else [reruns.dropna(subset=["selected_acc"]).set_index("seed")["selected_acc"]]
    )
    seeds, gain = gain_over_searches(defaults_by, by_search)
    tuned = [t.loc[seeds].tolist() for t in by_search]
    defaults = defaults_by.loc[seeds].tolist()
    search = runs[runs["stage"] == "search"]
    failures = runs.loc[runs["failed"].astype(bool), "failed"] if "failed" in runs else pd.Series(dtype=str)
    return {
        "method": method,
        # a method the setting refuses (every run failed): why, in its own sentence
        "refused": failures.iloc[0] if len(failures) == len(runs) else "",
        "title": runs["title"].iloc[0],
        "seeds": len(seeds),
        "defaults_mean": 100 * _mean(defaults),
        "defaults_std": 100 * _std(defaults),
        "searches": max(1, len(configs)),
        "tuned_mean": 100 * _mean([a for search in tuned for a in search]),
        "tuned_std": 100 * _std([a for search in tuned for a in search]),
        "gain": 100 * gain.mean,
        "gain_low": 100 * gain.low,
        "gain_high": 100 * gain.high,
        "distinguishable": gain.distinguishable,
        "gain_p": gain.p,
        "search_trials": len(search),
        "search_rounds": int(search["rounds_run"].sum()),
        "train_s": float(runs["time_s"].sum()),
        "defaults_accs": defaults,  # a seed each
        "tuned_accs": tuned,  # a row a search, a column a seed: what the paper's method is set against
        **_budget_flags(method, reruns, root, configs),
    }


def _budget_flags(method: str, reruns: pd.DataFrame, root: Path, configs: list[dict]) -> dict:
    """Where the budget may have cut the method's search short (tuner/report/budget_flags.py): its tuned values at
    their range's edge, in each search's best (one search: its reruns' configuration), and how many of its tuned
    reruns chose their last round."""
    space = root / "spaces" / f"{method}.yaml"
    search = (yaml.safe_load(space.read_text()) or {}).get("search", {}) if space.exists() else {}
    if not configs and len(reruns):
        configs = [{k: reruns.iloc[0].get(k, reruns.iloc[0].get(f"hp_{k}")) for k in search}]
    return {
        # a search over local epochs or batch size varies each trial's local steps; the others' trials train alike
        "searched_local_work": ", ".join(k for k in LOCAL_WORK if k in search),
        "at_edge": ", ".join(at_edge_of_searches(search, configs)),
        "last_round": chose_last_round(reruns),
        "reruns": len(reruns),
    }


def _own_method(table: str) -> str | None:
    """The method the table's paper proposes (None: a table of no paper's own)."""
    paper = papers.TABLES[table].paper if table in papers.TABLES else None
    return papers.PAPERS[paper].proposes[0] if paper and papers.PAPERS[paper].proposes else None


def _against_own(frame: pd.DataFrame, own: str | None) -> pd.DataFrame:
    """Each other method's tuned accuracy against the paper's own method tuned: own − it, paired over seeds (tuned
    by several searches: each side's searches and the shared seeds random effects), with its 95 %
    interval and p, and Holm's adjusted p over every other method (the family the paper's claim is)."""
    frame = frame.assign(own_minus=math.nan, own_minus_low=math.nan, own_minus_high=math.nan, own_p=math.nan)
    mine = frame.loc[frame["method"] == own, "tuned_accs"]
    if len(mine) == 1:
        for i, row in frame.iterrows():
            a, b = [list(r) for r in mine.iloc[0]], [list(r) for r in row["tuned_accs"]]
            if row["method"] != own and len(a[0]) == len(b[0]) > 1:  # the same seeds
                d = searches_and_seeds(a, b)  # one search a side: the paired t over seeds
                frame.loc[i, ["own_minus", "own_minus_low", "own_minus_high", "own_p"]] = [
                    100 * d.mean,
                    100 * d.low,
                    100 * d.high,
                    d.p,
                ]
    frame["own_p_holm"] = holm(frame["own_p"].tolist())
    return frame


def _column_row(
    frame: pd.DataFrame, runs: pd.DataFrame, record: dict, table: str, setting: str, root: Path, own: str | None
) -> dict:
    ranked = frame.dropna(subset=["defaults_mean", "tuned_mean"])
    # two rows with the same accuracies seed by seed at defaults and tuned are one configuration under two names
    # (a variant at its base's settings): counted once, so its ties do not enter τ twice
    runs_of = [
        (tuple(d), tuple(map(tuple, t))) for d, t in zip(ranked["defaults_accs"], ranked["tuned_accs"], strict=True)
    ]
    first: dict[tuple, str] = {}  # each configuration's first title
    for key, title in zip(runs_of, ranked["title"], strict=True):
        first.setdefault(key, title)
    distinct = ranked[[first[key] == title for key, title in zip(runs_of, ranked["title"], strict=True)]]
    tau = (
        stats.kendalltau(distinct["defaults_mean"], distinct["tuned_mean"]).statistic if len(distinct) > 2 else math.nan
    )
    out = {
        "comparison": root.name,  # its folder: never a path of the machine that ran it
        "table": table,
        "setting": setting,
        **{k: runs[k].iloc[0] for k in DATA_SETTINGS},
        "rounds": int(runs.loc[runs["stage"] == "defaults", "rounds_planned"].max()),
        "methods": len(ranked),
        "kendall_tau": float(tau),
        "kendall_rows": len(distinct),
        "kendall_repeats": ", ".join(
            f"{title} as {first[key]}"
            for key, title in zip(runs_of, ranked["title"], strict=True)
            if first[key] != title
        ),
        "own_method": own or "",
        "own_first_defaults": None,
        "own_first_tuned": None,
        # the other methods the paper's own method tuned is ahead of, behind, and not told from (Holm over them)
        "own_ahead": "",
        "own_behind": "",
        "own_undecided": "",
        "training_share": _training_share(runs, record),
        "wall_s": float(record.get("wall_s", math.nan)),
    }
    if own in set(ranked["method"]) and len(ranked) > 1:
        first = ranked.set_index("method")
        out["own_first_defaults"] = bool(first.at[own, "rank_defaults"] == 1)
        out["own_first_tuned"] = bool(first.at[own, "rank_tuned"] == 1)
        tested = ranked.dropna(subset=["own_p_holm"]).sort_values("tuned_mean", ascending=False)
        held = tested["own_p_holm"] < 0.05
        out["own_ahead"] = ", ".join(tested.loc[held & (tested["own_minus"] > 0), "method"])
        out["own_behind"] = ", ".join(tested.loc[held & (tested["own_minus"] < 0), "method"])
        out["own_undecided"] = ", ".join(tested.loc[~held, "method"])
    return out


def _tau_line(col: Any) -> str:
    if math.isnan(col.kendall_tau):
        return "Too few methods for Kendall's τ."
    repeats = (
        f"; the same accuracies seed by seed at defaults and tuned, counted once: {col.kendall_repeats}"
        if col.kendall_repeats
        else ", no two with the same accuracies seed by seed"
    )
    tau = f"{col.kendall_tau:.2f} (over {col.kendall_rows} methods{repeats})"
    return f"Kendall's τ between the rankings at defaults and tuned: {tau}"


def _training_share(runs: pd.DataFrame, record: dict) -> float:
    """Seconds the comparison's trials trained over the seconds its trial slots were held (wall time × slots)."""
    held = float(record.get("wall_s", 0)) * int(record.get("slots", 1))
    return float(runs["time_s"].sum() / held) if held > 0 else math.nan


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _std(values: list[float]) -> float:
    """The sample std (n − 1), as every page labels it."""
    return float(pd.Series(values).std(ddof=1)) if len(values) > 1 else math.nan


def fair_markdown(methods: pd.DataFrame, columns: pd.DataFrame) -> str:
    """A table per setting, and under it what tuning moved and how sure that is."""
    parts = []
    for col in columns.itertuples():
        t = methods[(methods["comparison"] == col.comparison) & (methods["setting"] == col.setting)]
        refused = t[t["refused"] != ""]
        t = t[t["refused"] == ""].sort_values(["rank_tuned", "method"])
        body = pd.DataFrame(
            {
                "method": t["title"],
                "defaults": [_spread(m, s) for m, s in zip(t["defaults_mean"], t["defaults_std"], strict=True)],
                "tuned": [_spread(m, s) for m, s in zip(t["tuned_mean"], t["tuned_std"], strict=True)],
                "gain (95 % interval)": [_interval(r.gain, r.gain_low, r.gain_high) for r in t.itertuples()],
                "p / Holm / BH q": [_corrected(r.gain_p, r.gain_p_holm, r.gain_q_bh) for r in t.itertuples()],
                "rank defaults → tuned": [
                    f"{_rank(a)} → {_rank(b)}" for a, b in zip(t["rank_defaults"], t["rank_tuned"], strict=True)
                ],
                "search trials / rounds": [
                    f"{a} / {b}" for a, b in zip(t["search_trials"], t["search_rounds"], strict=True)
                ],
                "budget flags": [_flags(r) for r in t.itertuples()],
            }
        )
        seeds = sorted(set(t["seeds"]))
        lines = [_tau_line(col)]
        if col.own_first_tuned is not None:
            lines.append(_own_line(t, col))
        lines += _budget_lines(t)
        lines += [f"Not run at this setting: {r.title}: {r.refused}" for r in refused.itertuples()]
        if not math.isnan(col.training_share):
            lines.append(f"Trial slots spent training: {100 * col.training_share:.0f} % of {col.wall_s:.0f} s.")
        searches = int(t["searches"].max()) if len(t) else 1
        design = (
            f"; {searches} searches a method, each one's best rerun on the seeds: the gain's interval and p a t "
            "over searches and seeds as crossed random effects, the tuned ± over every rerun"
            if searches > 1
            else ""
        )
        parts.append(
            f"### {col.setting} ({col.table}; {col.rounds} rounds; {' or '.join(map(str, seeds))} seeds paired"
            f"{design})\n\n" + body.to_markdown(index=False) + "\n\n" + "\n".join(f"- {line}" for line in lines) + "\n"
        )
    note = (
        "Test accuracy (%) at the round the validation split chose, mean ± sample std (n − 1) over the same seeds at "
        "the paper defaults and tuned; a gain whose interval covers 0 is not distinguishable from none. p is the "
        "two-sided t test's (paired over seeds, or as each heading says); over the setting's methods, Holm's "
        "step-down correction (a gain established "
        "where it is below 0.05) and the Benjamini–Hochberg q (the false discovery rate).\n\n"
    )
    return note + "\n".join(parts)


def _flags(row) -> str:
    """A method's budget flags as its table cell: the settings at their range's edge, the reruns that chose their
    last round."""
    flags = [row.at_edge] if row.at_edge else []
    flags += [f"last round {row.last_round}/{row.reruns}"] if row.last_round else []
    return "; ".join(flags)


def _budget_lines(t: pd.DataFrame) -> list[str]:
    """What the budget flags say, once a table, with the advice each calls for."""
    edged, reruns = t[t["at_edge"] != ""], int(t["reruns"].sum())
    lines = []
    if len(edged):
        lines.append(
            f"{len(edged)} of the {len(t)} methods have a tuned value at its range's edge (within "
            f"{100 * EDGE:.0f} % of it, on its scale): the best may lie beyond; widen those ranges."
        )
    varied = t[t["searched_local_work"] != ""]
    if len(varied):
        lines.append(
            f"Unequal compute a trial: {', '.join(varied['title'])} searched their local work "
            f"({', '.join(sorted(set(', '.join(varied['searched_local_work']).split(', '))))}), so their trials' "
            f"local steps vary; the other {len(t) - len(varied)} train the paper's at every trial."
        )
    if t["last_round"].sum():
        lines.append(
            f"{int(t['last_round'].sum())} of the {reruns} tuned reruns chose their last round: they were still "
            "improving; more rounds would show where they stop."
        )
    return lines


def _own_line(t: pd.DataFrame, col) -> str:
    """The paper's own method: first or not, and tuned against every other method tuned, Holm over them."""
    own = t[t["method"] == col.own_method].iloc[0]
    titles = t.set_index("method")["title"]
    named = lambda methods: ", ".join(titles[m] for m in methods.split(", ")) if methods else "none"  # noqa: E731
    tested = int(t["own_p_holm"].notna().sum())
    return (
        f"{own['title']} first at defaults: {'yes' if col.own_first_defaults else 'no'}; tuned: "
        f"{'yes' if col.own_first_tuned else 'no'}. Tuned, against each of the other {tested} tuned (paired t over "
        f"seeds, Holm over the {tested}): ahead of {named(col.own_ahead)}; behind {named(col.own_behind)}; not "
        f"distinguishable from {named(col.own_undecided)}."
    )


def fair_latex(methods: pd.DataFrame) -> str:
    """The table in LaTeX as a paper prints it (accuracies and gains to 2 decimals, p to 3, ranks whole); a method a
    setting refused is not a row of NaNs but named with its reason in the caption."""
    cols = ["setting", "title", "defaults_mean", "defaults_std", "tuned_mean", "tuned_std", "gain", "gain_low"]
    ran, refused = methods[methods["refused"] == ""], methods[methods["refused"] != ""]
    frame = ran[[*cols, "gain_high", "gain_p", "gain_p_holm", "rank_defaults", "rank_tuned"]]
    formats = {c: "{:.2f}".format for c in cols[2:] + ["gain_high"]}
    formats |= {c: "{:.3f}".format for c in ("gain_p", "gain_p_holm")} | {
        c: _rank for c in ("rank_defaults", "rank_tuned")
    }
    caption = "Every method tuned at the same budget (mean and sample std over seeds; Holm over each setting)."
    caption += "".join(f" Not run at {r.setting}: {r.title}: {r.refused.rstrip('.')}." for r in refused.itertuples())
    return frame.to_latex(index=False, caption=_latex_text(caption), escape=True, formatters=formats)


def _latex_text(text: str) -> str:
    """Text as LaTeX typesets it (the caption, which to_latex leaves as it is)."""
    return re.sub(r"[\\&%$#_{}~^]", lambda m: LATEX_ESCAPES[m.group()], text)


def _interval(mean: float, low: float, high: float) -> str:
    if math.isnan(mean):
        return "—"
    if math.isnan(low):
        return f"{mean:+.2f} (one seed: no interval)"
    verdict = "" if low > 0 or high < 0 else ", not distinguishable"
    return f"{mean:+.2f} ({low:+.2f} to {high:+.2f}{verdict})"


def _corrected(p: float, holm_p: float, q: float) -> str:
    return "—" if math.isnan(p) else f"{p:.3f} / {holm_p:.3f} / {q:.3f}"


def _spread(mean: float, std: float) -> str:
    return "—" if math.isnan(mean) else f"{mean:.2f} ± {std:.2f}"


def _rank(r: float) -> str:
    return "—" if math.isnan(r) else str(int(r))


def plot_fair(methods: pd.DataFrame, out: Path) -> list[Path]:
    """Per setting, each method that ran: its defaults and tuned accuracy with their spread over seeds."""
    import matplotlib.pyplot as plt

    from tuner.files import write_atomic

    files = []
    for setting, t in methods.groupby("setting"):
        t = t[t["refused"] == ""].sort_values("tuned_mean")  # a refused method is named under the tables instead
        fig, ax = plt.subplots(figsize=(7, 0.3 * len(t) + 1.5))
        y = range(len(t))
        ax.errorbar(t["defaults_mean"], y, xerr=t["defaults_std"], fmt="o", label="defaults", color="0.5")
        ax.errorbar(t["tuned_mean"], y, xerr=t["tuned_std"], fmt="o", label="tuned", color="C0")
        ax.set_yticks(list(y), t["title"])
        ax.set_xlabel("test accuracy (%) at the validation-chosen round")
        ax.set_title(f"{setting}\nevery method tuned at the same budget")
        ax.legend(loc="lower right")
        fig.tight_layout()
        path = out / f"fair-{setting}.png"
        write_atomic(path, partial(fig.savefig, dpi=110, format="png"))
        plt.close(fig)
        files.append(path)
    return files
