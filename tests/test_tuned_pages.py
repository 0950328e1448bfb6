"""docs/tuned.md held to the committed tuned comparisons (results/tuned-comparisons/) and tuned settings
(results/tuned/): each table and sentence is what the files say, and each file what `tuner report` computes today."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app
from tuner.sweep.space import tpe_startup

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("comparison", sorted(p.name for p in (ROOT / "results/tuned-comparisons").iterdir()))
def test_the_tuned_page_quotes_each_committed_comparison_as_its_report_wrote_it(comparison):
    """docs/tuned.md's tables and lines are the committed fair.md's, and that fair.md is what `tuner report` writes
    today from the committed runs' rows."""
    from tuner.report.fair import fair_markdown

    folder = ROOT / "results/tuned-comparisons" / comparison
    methods, columns = pd.read_parquet(folder / "fair.parquet"), pd.read_parquet(folder / "fair_columns.parquet")
    fair = (folder / "fair.md").read_text()
    assert fair_markdown(methods, columns) == fair
    page = (ROOT / "docs/tuned.md").read_text()
    for line in fair.splitlines():
        if line.startswith(("|", "- ")):
            assert line in page, line


def test_every_shipped_tuned_setting_says_where_it_came_from_and_one_runs(tmp_path, monkeypatch):
    from tuner.plugins import family_settings, method_class
    from tuner.settings.config import resolve_layers
    from tuner.settings.tuned_files import setting_name

    shipped = sorted((ROOT / "results/tuned").glob("*/*.yaml"))
    assert shipped
    for path in shipped:
        data = yaml.safe_load(path.read_text())
        assert path.stem == data["method"] and path.parent.name == setting_name(data["settings"])
        provenance = data["provenance"]
        for key in ("table", "space", "space_sha256", "sampler", "trials", "rounds_trained", "val_acc", "commit"):
            assert provenance[key] not in (None, ""), (path, key)
        assert (
            provenance["rounds_trained"] <= provenance["search_rounds_trained"] and provenance["sampler_random_start"]
        )
        assert "/" not in provenance["comparison"]  # its folder's name, not a path of the machine that ran it
        resolve_layers(data["method"], [(str(path), data["settings"])])  # a setting this checkout still takes
        own = family_settings(method_class(data["method"]))  # a variant's file is still that variant's
        assert all(data["settings"].get(k, v) == v for k, v in own.items()), (path, own)
    monkeypatch.chdir(ROOT)  # `--tuned NAME` reads results/tuned/ under the current directory
    setting = shipped[0].parent.name
    out = tmp_path / "run"
    ran = CliRunner().invoke(app, ["run", shipped[0].stem, "--tuned", setting, "--rounds", "1", "--out", str(out)])
    assert ran.exit_code == 0, ran.output


def test_the_tuned_pages_sentences_on_digits_are_the_committed_figures():
    import numpy as np

    from tuner.federated_run import build_simulation
    from tuner.settings.config import resolve_layers

    folder = ROOT / "results/tuned-comparisons/digits-roster"
    m, c = pd.read_parquet(folder / "fair.parquet"), pd.read_parquet(folder / "fair_columns.parquet").iloc[0]
    asked = yaml.safe_load((folder / "comparison.yaml").read_text())["asked"]
    ran = m[m["refused"] == ""]
    page = " ".join((ROOT / "docs/tuned.md").read_text().split())
    command = f"--trials {asked['trials']} --searches {asked['searches']} --seeds {len(asked['seeds'])} --rounds 30"
    assert command in page and asked["rounds"] == 30 and asked["seeds"] == [3, 4, 5]
    assert f"TPE drawing {tpe_startup(asked['trials'])} at random first" in page
    gained = ran[ran["distinguishable"] & (ran["gain"] > 0)]
    assert f"{len(gained)} of the {len(ran)} that ran gain beyond their interval" in page
    assert f"by {gained['gain'].median():.1f} points at their median" in page
    assert f"Kendall's τ {c['kendall_tau']:.2f} between defaults and tuned" in page
    assert f"{100 * c['training_share']:.0f} % of the trial slots' time spent training" in page
    assert f"{c['wall_s'] / 60:.0f} minutes for {len(m)} methods and variants" in page
    assert not (ran["distinguishable"] & (ran["gain"] < 0)).any() and "No method lost beyond its interval" in page
    # the searches' spread: each search's reruns' mean, the largest minus the smallest
    by = ran.set_index("method")
    spread = by["tuned_accs"].map(lambda t: 100 * (max(np.mean(r) for r in t) - min(np.mean(r) for r in t)))
    gen = by.loc["fedgen"]
    searches = ", ".join(f"{100 * np.mean(r):.1f}" for r in gen["tuned_accs"]).rsplit(", ", 1)
    assert spread.idxmax() == "fedgen" and (
        f"lie {spread.median():.1f} points apart at the median and up to {spread.max():.1f} (FedGen: "
        f"{' and '.join(searches)} % against {100 * np.mean(gen['defaults_accs']):.1f} % at defaults)" in page
    )
    assert (
        f"FedGen's {gen['gain']:+.1f} points (interval −{-gen['gain_low']:.1f} to +{gen['gain_high']:.1f}), FedALA's "
        f"{by.at['fedala', 'gain']:+.1f} and pFedMe's {by.at['pfedme', 'gain']:+.1f} are not distinguishable" in page
    )
    assert not by.loc[["fedgen", "fedala", "pfedme"], "distinguishable"].any()
    moved = sorted(ran.loc[~ran["distinguishable"] & (ran["gain"] != 0), "title"], key=str.lower)
    assert f"Moved within intervals that cover 0: {', '.join(moved[:-1])} and {moved[-1]}." in page
    assert list(ran.loc[ran["gain"] == 0, "title"]) == ["FedDyn"] and "FedDyn gained exactly nothing" in page
    best = yaml.safe_load((folder / "comparison.yaml").read_text())["best"]
    dyn = [v["config"] for k, v in best.items() if json.loads(k)["method"] == "feddyn"]
    assert dyn == [{"alpha": resolve_layers("feddyn", []).hparams["alpha"]}] * 3 == [{"alpha": 0.01}] * 3
    gpfl = by.loc["gpfl"]
    assert (
        f"GPFL gains {gpfl['gain']:+.2f} points tuned (interval +{gpfl['gain_low']:.2f} to +{gpfl['gain_high']:.2f}, "
        f"p {gpfl['gain_p']:.3f} alone, {gpfl['gain_p_holm']:.3f} after Holm)"
        in page
        and not gpfl["established"]
    )
    assert (int(gpfl["rank_tuned"]), int(by.at["gpfl-nocov", "rank_tuned"])) == (41, 5)
    assert by.at["fedcp-nocpn-nogfm-nogh", "defaults_accs"].tolist() == by.at["fedper", "defaults_accs"].tolist()
    assert by.at["fedrep", "defaults_accs"].tolist() == by.at["gpfl-nocov", "defaults_accs"].tolist()
    runs = pd.read_parquet(folder / "runs.parquet")
    gumbel = runs[(runs["method"] == "fedcp-gumbel") & runs["stage"].isin(["defaults", "seeds"])]
    stopped = gumbel[gumbel["failed"].str.contains("diverged in round 24")]
    assert set(stopped["seed"]) == {3} and len(stopped) == (gumbel["seed"] == 3).sum() == 4
    assert "Every FedCP-Gumbel run on seed 3 (its defaults and each search's best) stopped in round 24" in page
    edged = ran[ran["at_edge"] != ""]
    lr_any = ran["at_edge"].str.contains(r"(?:^|, )lr top").sum()
    lr_all = ran["at_edge"].str.contains(r"(?:^|, )lr top(?:$|,)").sum()
    assert f"{lr_any} of the {len(ran)} ran a learning rate at the top of its range in at least one search " in page
    assert f"({lr_all} in all three)" in page and f"{len(edged)} of {len(ran)} have some tuned value at an edge" in page
    last, reruns = int(ran["last_round"].sum()), int(ran["reruns"].sum())
    assert last < reruns / 4 and f"{last} of the {reruns} tuned reruns chose their last round, under a quarter" in page
    sim = build_simulation(resolve_layers("fedavg", [("test", {"dataset": "digits", "rounds": 1, "val_frac": 0.1})]))
    assert f"{sum(sim.data.val.counts)} samples in all" in page and f"{sum(sim.data.test.counts)} test samples" in page


def test_the_tuned_pages_sentence_on_variants_is_the_committed_comparisons_best_configurations():
    from tuner.plugins import family_settings, method_class

    best = yaml.safe_load((ROOT / "results/tuned-comparisons/digits-roster/comparison.yaml").read_text())["best"]
    found = [(json.loads(k)["method"], v["config"]) for k, v in best.items() if "config" in v]  # refused: none
    families = [(m, c) for m, c in found if (method_class(m).family or m) in ("fedas", "hypcluster", "fedem")]
    assert len(families) == 33 and len({m for m, _ in families}) == 11
    # a comparison searches none of a family's held settings: no best sets one
    assert not any(set(c) & set(family_settings(method_class(m))) for m, c in found)
    page = " ".join((ROOT / "docs/tuned.md").read_text().split())
    assert (
        f"none of the {len(families)} best configurations of FedAS, HypCluster and FedEM with their variants (three "
        "searches each of 11) sets one of its family's held settings" in page
    )


def test_the_tuned_pages_sentences_on_fashion_mnist_are_the_committed_figures():
    from tuner.federated_run import build_simulation
    from tuner.settings.config import resolve_layers

    folder = ROOT / "results/tuned-comparisons/fmnist-gpfl-table1"
    m = pd.read_parquet(folder / "fair.parquet").set_index("method")
    c = pd.read_parquet(folder / "fair_columns.parquet").iloc[0]
    runs = pd.read_parquet(folder / "runs.parquet")
    page = " ".join((ROOT / "docs/tuned.md").read_text().split())
    assert f"{c['wall_s'] / 60:.0f} minutes for {len(m)} methods" in page
    assert f"{100 * c['training_share']:.0f} % of the trial slots' time spent training" in page
    gained = m[m["distinguishable"] & (m["gain"] > 0)]
    low, high = gained["gain"].idxmin(), gained["gain"].idxmax()
    assert (m["gain"] > 0).all() and (
        f"{len(gained)} of the {len(m)} beyond their interval, from {m.at[low, 'gain']:+.2f} points "
        f"({m.at[low, 'title']}) to {m.at[high, 'gain']:+.2f} ({m.at[high, 'title']})" in page
    )
    gpfl = m.loc["gpfl"]
    assert not gpfl["distinguishable"] and m["defaults_std"].idxmax() == "gpfl"
    assert f"GPFL's {gpfl['gain']:+.2f} points (interval −{-gpfl['gain_low']:.2f} to +{gpfl['gain_high']:.2f})" in page
    at_defaults = runs[(runs["method"] == "gpfl") & (runs["stage"] == "defaults")]["selected_acc"]
    assert f"({100 * at_defaults.min():.1f} to {100 * at_defaults.max():.1f} %)" in page
    lr = runs[runs["stage"].isin(["defaults", "seeds"])].pivot_table("lr", "method", "stage")
    searched = lr[lr["seeds"] != lr["defaults"]]  # pFedMe-official's search leaves lr alone
    ratio = searched["seeds"] / searched["defaults"]
    assert set(lr["defaults"]) == {0.005} and len(searched) == len(m) - 1
    assert f"chose {ratio.min():.1f} to {ratio.max():.1f} times the paper's 0.005" in page
    reran = runs[runs["stage"].isin(["defaults", "seeds"])]
    last = int((reran["val_round"] == reran["rounds_planned"]).sum())
    assert f"{last} of the {len(reran)} runs at defaults and tuned were chosen at their last round" in page
    assert f"(Kendall's τ {c['kendall_tau']:.2f})" in page
    ranks = m[["rank_defaults", "rank_tuned"]].astype(int)
    assert (tuple(ranks.loc["fedrep"]), tuple(ranks.loc["fedproto"]), tuple(ranks.loc["gpfl"])) == (
        (5, 1),
        (1, 2),
        (8, 8),
    )
    ahead, behind = c["own_ahead"].split(", "), c["own_behind"]
    undecided = c["own_undecided"].split(", ")
    assert ahead == ["fedavg", "fedprox"] and behind == "" and len(undecided) == 8 and undecided[0] == "fedrep"
    assert (m["own_p_holm"].notna().sum(), m["tuned_mean"].idxmax()) == (10, "fedrep")
    rep = m.loc["fedrep"]
    assert (
        f"FedRep's lead is {-rep['own_minus']:.2f} points (interval −{-rep['own_minus_low']:.2f} to "
        f"−{-rep['own_minus_high']:.2f}, p {rep['own_p']:.3f}), but Holm over the 10 adjusts that p to "
        f"{rep['own_p_holm']:.3f}" in page
    )
    above = set(m[m["tuned_mean"] > m.at["gpfl", "tuned_mean"]].index)
    assert len(above) == 7 and set(undecided) == above | {"per-fedavg"}  # "the seven above it, nor Per-FedAvg"
    both = {"fedavg", "fedprox"}  # "gain the most and stay last"
    assert set(m.sort_values("gain").index[-2:]) == set(m.sort_values("tuned_mean").index[:2]) == both
    per_round = runs[runs["stage"] == "defaults"].assign(s=lambda d: d["time_s"] / d["rounds_run"])
    assert f"MLP round already took {per_round.groupby('method')['s'].mean()['pfedme-official']:.0f} s" in page
    cnn4 = json.loads((ROOT / "results/bench/step-blocks-table1.json").read_text())["figures"]["table1"]["K=1"][
        "s/round"
    ]
    assert f"a cnn4 round of GPFL takes {cnn4:.1f} s on this CPU" in page
    sim = build_simulation(resolve_layers("fedavg", [("test", {"dataset": "fmnist", "rounds": 1, "val_frac": 0.1})]))
    val, test = sim.data.val.counts, sum(sim.data.test.counts)
    assert f"validation split is {sum(val)} samples ({min(val)} to {max(val)} a client), the test split {test}" in page


def recomputed_fair(folder: Path, tmp_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The fair tables `tuner report` computes today from a committed comparison's runs.parquet, its
    comparison.yaml at the root its runs' experiments name (moved under tmp_path)."""
    import os
    import shutil

    from tuner.report.fair import COMPARISON_FILE, fair_tables

    runs = pd.read_parquet(folder / "runs.parquet")
    root = Path(os.path.commonpath(list(runs["experiment"])))
    here = tmp_path / root.name
    here.mkdir(parents=True)
    shutil.copy(folder / COMPARISON_FILE, here / COMPARISON_FILE)
    shutil.copytree(folder / "spaces", here / "spaces")
    runs["experiment"] = [str(here / Path(e).relative_to(root)) for e in runs["experiment"]]
    return fair_tables(runs)


@pytest.mark.parametrize("comparison", sorted(p.name for p in (ROOT / "results/tuned-comparisons").iterdir()))
def test_each_committed_fair_table_is_what_the_report_computes_today_from_its_runs(comparison, tmp_path):
    from tuner.report.fair import fair_latex

    folder = ROOT / "results/tuned-comparisons" / comparison
    methods, columns = recomputed_fair(folder, tmp_path)
    pd.testing.assert_frame_equal(methods, pd.read_parquet(folder / "fair.parquet"))
    pd.testing.assert_frame_equal(columns, pd.read_parquet(folder / "fair_columns.parquet"))
    assert fair_latex(methods) == (folder / "fair.tex").read_text()


def test_the_tuned_pages_corrections_are_the_committed_tables():
    """docs/tuned.md's corrected counts are the committed fair tables' Holm and BH columns, which `tuner report`
    computes over each setting's methods (the quote test holds the tables to what it writes)."""
    page = " ".join((ROOT / "docs/tuned.md").read_text().split())
    digits = pd.read_parquet(ROOT / "results/tuned-comparisons/digits-roster/fair.parquet")
    ran = digits[digits["refused"] == ""]
    held = ran[ran["established"] & (ran["gain"] > 0)]
    assert not (ran["established"] & (ran["gain"] < 0)).any() and len(ran) == 73
    assert (
        f"Holm's step-down correction (below 0.05) leaves {len(held)} gains established "
        f"({', '.join(sorted(held['title'], key=str.lower))})" in page
    )
    bh = ran[(ran["gain_q_bh"] < 0.05) & (ran["gain"] > 0)]
    assert not ((ran["gain_q_bh"] < 0.05) & (ran["gain"] < 0)).any()
    assert f"Benjamini–Hochberg at a 5 % false discovery rate keeps {len(bh)}." in page
    fmnist = pd.read_parquet(ROOT / "results/tuned-comparisons/fmnist-gpfl-table1/fair.parquet")
    beyond = fmnist[fmnist["distinguishable"] & (fmnist["gain"] > 0)]
    fallen = sorted(set(beyond["title"]) - set(fmnist.loc[fmnist["established"], "title"]))
    assert (
        f"corrected over the table's {len(fmnist)}, Holm's step-down correction leaves "
        f"{int(beyond['established'].sum())} of them established ({', '.join(fallen)}'s falls)" in page
    )


def test_the_tuned_page_calls_the_committed_searches_random_as_they_were():
    """The Fashion-MNIST comparison ran TPE with Optuna's 10 random trials first and fewer trials than that; the
    digits one set TPE's random start from its trials, as its tuned files record."""
    page = " ".join((ROOT / "docs/tuned.md").read_text().split())
    asked = {
        name: yaml.safe_load((ROOT / "results/tuned-comparisons" / name / "comparison.yaml").read_text())["asked"]
        for name in ("digits-roster", "fmnist-gpfl-table1")
    }
    fmnist = asked["fmnist-gpfl-table1"]
    assert fmnist["sampler"] == "tpe" and fmnist["trials"] < 10
    assert (
        f"Optuna's default draws the first 10 trials at random, more than the {fmnist['trials']} a method had" in page
    )
    start = tpe_startup(asked["digits-roster"]["trials"])
    tuned = [yaml.safe_load(p.read_text()) for p in (ROOT / "results/tuned/digits-dir0.1-20c-mlp").glob("*.yaml")]
    assert {t["provenance"]["sampler_random_start"] for t in tuned} == {start} == {2}


def test_the_ranges_the_digits_comparison_hit_are_widened_in_the_shipped_spaces():
    """Every tuned value the digits comparison flagged at its range's edge, in any of its searches, has room beyond it
    in the shipped space file it was searched from (its `spaces/` copy names it), but for a bound that is the
    setting's own."""
    import re

    folder = ROOT / "results/tuned-comparisons/digits-roster"
    flagged = pd.read_parquet(folder / "fair.parquet").query("at_edge != ''")
    own_bounds = {  # where the range ends, the setting does: nothing lies beyond
        ("fedcp", "lam bottom"),  # FedCP's λ ≥ 0
        ("fedphp", "lam bottom"),  # FedPHP's mixing weight in [0, 1]
        ("knn-per", "k bottom"),  # one neighbour
        ("knn-per", "lam top"),  # kNN-Per's mixing weight in [0, 1]
        ("fedfomo", "m bottom"),  # one model downloaded
    }
    widened = set()
    for row in flagged.itertuples():
        ran = (folder / "spaces" / f"{row.method}.yaml").read_text()
        source = re.search(r"search_spaces/([\w-]+)\.yaml", ran.splitlines()[0]).group(1)
        then = yaml.safe_load(ran)["search"]
        now = yaml.safe_load((ROOT / "search_spaces" / f"{source}.yaml").read_text())["search"]
        for flag in row.at_edge.split(", "):
            name, side = flag.split()[:2]  # "lr top (2/3 searches)"
            if (source, f"{name} {side}") in own_bounds:
                continue
            (low, high), (new_low, new_high) = next(iter(then[name].values())), next(iter(now[name].values()))
            assert new_high > high if side == "top" else new_low < low, (row.method, flag, now[name])
            widened.add(f"{source}.yaml")
    page = " ".join((ROOT / "docs/tuned.md").read_text().split())
    assert f"widened in the {len(widened)} shipped space files it was searched from" in page


def test_the_tuned_pages_sampler_comparison_is_the_committed_bench():
    bench = json.loads((ROOT / "results/bench/samplers-digits.json").read_text())
    f = bench["figures"]
    setting, val, test = f["setting"], f["tpe_minus_random best_val_acc"], f["tpe_minus_random selected_acc"]
    assert bench["command"].startswith("python bench/samplers.py --method ditto --seeds 0 1 2 3 4")
    page = " ".join((ROOT / "docs/tuned.md").read_text().split())
    assert f"{setting['trials']} trials each" in page and f"TPE drew {setting['tpe_random_start']} at random" in page
    assert (
        f"{100 * val['mean']:+.2f} points of the best validation accuracy (95 % interval −{-100 * val['low']:.2f} to "
        f"+{100 * val['high']:.2f}) and −{-100 * test['mean']:.2f} points of the test accuracy at the chosen round "
        f"(−{-100 * test['low']:.2f} to +{100 * test['high']:.2f})" in page
    )
    assert val["low"] < 0 < val["high"] and test["low"] < 0 < test["high"]  # "not distinguishable"
