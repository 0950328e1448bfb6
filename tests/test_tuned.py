"""Every method tuned at one budget (`tuner reproduce --tune`): the cells' searches in one experiment, the fair table,
tuned settings files and `tuner run --tuned`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app
from tuner.errors import UserError
from tuner.report.intervals import difference, holm
from tuner.sweep.space import tpe_startup

SELECTED = "selected_acc"


class RecordingSearch:
    """A cell's search that hands out numbered points and records what it was told."""

    def __init__(self, name: str):
        self.name, self.results, self.completed, self.n = name, [], [], 0

    def suggest(self, trial_id):
        self.n += 1
        return {"lr": f"{self.name}{self.n}"}

    def on_trial_result(self, trial_id, result):
        self.results.append(trial_id)

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append(trial_id)


def test_the_cells_searches_take_turns_each_to_its_trials_and_hear_only_their_own_results(tmp_path):
    from ray.tune.search import Searcher

    from tuner.sweep.cells import CellSearches, cell_key

    cells = {cell_key({"method": m}): {"method": m} for m in ("fedavg", "local")}
    searches = {k: RecordingSearch(c["method"]) for k, c in cells.items()}
    s = CellSearches(searches, cells, trials=2, metric="score", mode="max")
    suggested = [s.suggest(f"t{i}") for i in range(5)]
    assert suggested[:4] == [
        {"lr": "fedavg1", "cell": {"method": "fedavg"}},
        {"lr": "local1", "cell": {"method": "local"}},
        {"lr": "fedavg2", "cell": {"method": "fedavg"}},
        {"lr": "local2", "cell": {"method": "local"}},
    ]
    assert suggested[4] == Searcher.FINISHED
    s.on_trial_result("t1", {"score": 1})
    s.on_trial_complete("t2", {"score": 1})
    fedavg, local = searches.values()
    assert (fedavg.results, fedavg.completed, local.results, local.completed) == ([], ["t2"], ["t1"], [])
    s.save(str(tmp_path / "searcher.pkl"))  # a resumed stage goes on where it stopped
    again = CellSearches({}, {}, trials=0, metric="score", mode="max")
    again.restore(str(tmp_path / "searcher.pkl"))
    assert again.suggested == {k: 2 for k in cells} and again.suggest("t9") == Searcher.FINISHED


def asha_verdicts(scheduler) -> list[str]:
    """Four trials of a strong cell, then one of a weak cell, each reporting round 1 (ASHA's first rung)."""
    scheduler.set_search_properties("score", "max")
    verdicts = []
    for i, (cell, score) in enumerate([("strong", 0.9)] * 4 + [("weak", 0.2)]):
        trial = SimpleNamespace(trial_id=f"t{i}", config={"cell": {"method": cell}})
        scheduler.on_trial_add(None, trial)
        verdicts.append(scheduler.on_trial_result(None, trial, {"round": 1, "score": score}))
    return verdicts


def test_asha_compares_a_trial_only_with_its_own_cells():
    from tuner.sweep.cells import CellSchedulers
    from tuner.sweep.schedulers import asha

    one_for_all = asha_verdicts(asha(1, 8))
    assert one_for_all[-1] == "STOP"  # the weak cell's trial judged against the strong cell's: what must not happen
    assert asha_verdicts(CellSchedulers(lambda: asha(1, 8)))[-1] == "CONTINUE"


def test_cells_without_a_grace_run_every_trial_to_its_end():
    """asha(0, rounds) builds no ASHA: each cell then runs its trials to the end (it used to fail on None)."""
    from tuner.sweep.cells import CellSchedulers
    from tuner.sweep.schedulers import asha

    assert asha(0, 8) is None
    assert set(asha_verdicts(CellSchedulers(lambda: asha(0, 8)))) == {"CONTINUE"}


def comparison_rows(tmp_path: Path) -> pd.DataFrame:
    """Summary rows of a made-up comparison of three methods over seeds 1..3."""
    root = tmp_path / "roster-tuned"
    (root / "defaults").mkdir(parents=True)
    (root / "comparison.yaml").write_text(
        yaml.safe_dump({"asked": {"table": "gpfl-table1"}, "wall_s": 100, "slots": 2})
    )
    accs = {  # method: (defaults, tuned) by seed
        "gpfl": ([0.80, 0.82, 0.81], [0.86, 0.87, 0.85]),
        "fedavg": ([0.70, 0.60, 0.65], [0.72, 0.58, 0.69]),
        "local": ([0.84, 0.83, 0.85], [0.85, 0.84, 0.86]),
    }
    # GPFL's search: its tuned lr at the top of its range, its reruns chose their last round
    (root / "spaces").mkdir()
    (root / "spaces" / "gpfl.yaml").write_text("search: {lr: {loguniform: [0.001, 0.05]}, mu: {grid: [0, 1]}}\n")
    rows = []
    for method, (defaults, tuned) in accs.items():
        for stage, values in (("defaults", defaults), ("seeds", tuned)):
            last = stage == "seeds" and method == "gpfl"
            rows += [
                dict(stage=stage, method=method, title=method.upper(), seed=i + 1, selected_acc=v, rounds_run=5)
                | {"rounds_planned": 5, "val_round": 5 if last else 3, "lr": 0.048 if last else 0.005}
                for i, v in enumerate(values)
            ]
        rows += [dict(stage="search", method=method, title=method.upper(), seed=0, selected_acc=0.5, rounds_run=3)] * 2
    frame = pd.DataFrame(rows).assign(
        experiment=lambda d: [str(root / s) for s in d["stage"]],
        dataset="fmnist",
        partition="dir:0.1",
        clients=20,
        join_ratio="1",
        backbone="mlp",
        time_s=10.0,
        failed="",
    )
    refused = "FedBN keeps batch-norm layers local and this backbone has none."
    fedbn = frame[frame["method"] == "local"].assign(
        method="fedbn", title="FedBN", selected_acc=math.nan, time_s=math.nan, failed=refused
    )
    return pd.concat([frame, fedbn], ignore_index=True)


def test_the_fair_table_pairs_each_gain_over_seeds_and_says_what_it_cannot_tell(tmp_path):
    from tuner.report.fair import fair_markdown, fair_tables

    methods, columns = fair_tables(comparison_rows(tmp_path))
    by = methods.set_index("method")
    gain = difference([0.86, 0.87, 0.85], [0.80, 0.82, 0.81], paired=True)
    assert by.at["gpfl", "gain"] == pytest.approx(100 * gain.mean)
    assert (by.at["gpfl", "gain_low"], by.at["gpfl", "gain_high"]) == pytest.approx((100 * gain.low, 100 * gain.high))
    assert by.at["gpfl", "distinguishable"] and not by.at["fedavg", "distinguishable"]
    assert (by.at["local", "rank_defaults"], by.at["local", "rank_tuned"]) == (1, 2)
    assert (by.at["gpfl", "search_trials"], by.at["gpfl", "search_rounds"]) == (2, 6)
    col = columns.iloc[0]
    assert col["own_method"] == "gpfl" and not col["own_first_defaults"] and col["own_first_tuned"]
    assert col["kendall_tau"] == pytest.approx(1 / 3)
    # against every other method, Holm over them (a family of 2)
    vs = {m: difference([0.86, 0.87, 0.85], list(by.at[m, "tuned_accs"][0]), paired=True) for m in ("fedavg", "local")}
    assert by.at["local", "own_minus"] == pytest.approx(100 * vs["local"].mean)
    assert list(methods.set_index("method").loc[["fedavg", "local"], "own_p_holm"]) == pytest.approx(
        holm([vs["fedavg"].p, vs["local"].p])
    )
    assert col["training_share"] == pytest.approx(3 * 8 * 10 / 200)  # 24 runs of 10 s in 100 s × 2 slots
    assert (by.at["gpfl", "at_edge"], by.at["gpfl", "last_round"], by.at["gpfl", "reruns"]) == ("lr top", 3, 3)
    assert (by.at["fedavg", "at_edge"], by.at["fedavg", "last_round"]) == ("", 0)  # no space file: nothing to flag
    text = fair_markdown(methods, columns)
    assert "| lr top; last round 3/3 |" in text
    assert "1 of the 3 methods have a tuned value at its range's edge (within 5 % of it, on its scale)" in text
    assert "3 of the 9 tuned reruns chose their last round" in text and "Unequal compute" not in text
    assert "GPFL first at defaults: no; tuned: yes. Tuned, against each of the other 2 tuned" in text
    assert "not distinguishable" in text
    assert "### fmnist-dir0.1-20c-mlp (gpfl-table1; 5 rounds; 3 seeds paired)" in text  # its backbone and rounds
    assert "Not run at this setting: FedBN: FedBN keeps batch-norm layers local" in text and "| FedBN" not in text


def test_kendalls_tau_counts_once_two_rows_with_the_same_runs(tmp_path):
    """A variant whose runs are its base's (the same accuracies seed by seed at defaults and tuned) is one
    configuration under two names: τ is over the distinct ones, and the line names the repeat."""
    from tuner.report.fair import fair_markdown, fair_tables

    rows = comparison_rows(tmp_path)
    repeat = rows[rows["method"] == "fedavg"].assign(method="fedavg-copy", title="FEDAVG-COPY")
    methods, columns = fair_tables(pd.concat([rows, repeat], ignore_index=True))
    col = columns.iloc[0]
    assert (col["kendall_tau"], col["kendall_rows"]) == (pytest.approx(1 / 3), 3)
    assert col["kendall_repeats"] == "FEDAVG-COPY as FEDAVG"
    assert "(over 3 methods; the same accuracies seed by seed at defaults and tuned, counted once: FEDAVG-COPY as " in (
        fair_markdown(methods, columns)
    )
    assert "(over 3 methods, no two with the same accuracies seed by seed)" in fair_markdown(*fair_tables(rows))


def test_a_setting_is_named_by_its_data_and_a_tuned_file_is_refused_for_another(tmp_path):
    from tuner.settings.tuned_files import read_tuned, setting_name, write_tuned

    setting = dict(dataset="digits", partition="dir:0.1", clients=20, join_ratio="1", backbone="mlp")
    assert setting_name(setting) == "digits-dir0.1-20c-mlp"
    path = write_tuned(tmp_path, "fedavg", {**setting, "lr": 0.02}, {"trials": 3})
    assert path == tmp_path / "digits-dir0.1-20c-mlp" / "fedavg.yaml"
    assert read_tuned("fedavg", "digits-dir0.1-20c-mlp", {}, tmp_path)[1]["lr"] == 0.02
    with pytest.raises(UserError, match="tuned with dataset=digits, not fmnist; drop the dataset you typed"):
        read_tuned("fedavg", "digits-dir0.1-20c-mlp", {"dataset": "fmnist"}, tmp_path)
    with pytest.raises(UserError, match="No tuned settings for gpfl .* none are tuned for it yet"):
        read_tuned("gpfl", "digits-dir0.1-20c-mlp", {}, tmp_path)
    with pytest.raises(UserError, match="it has tuned settings for digits-dir0.1-20c-mlp"):
        read_tuned("fedavg", "fmnist-dir0.1-20c-cnn4", {}, tmp_path)


def test_what_set_names_holds_for_every_cell_of_a_table():
    from tuner.experiments.reproduce import cells

    todo, _ = cells("gpfl-table1", ["fmnist"], ["gpfl", "fedavg"], None, {"partition": "dir:0.1", "backbone": "mlp"})
    assert todo == [  # the table's dir:0.1 and pat:2 cells are one once the partition is set
        {"method": "fedavg", "dataset": "fmnist", "clients": 20, "join_ratio": "1", "protocol": "pfllib"},
        {"method": "gpfl", "dataset": "fmnist", "clients": 20, "join_ratio": "1", "protocol": "pfllib"},
    ]


def test_a_stage_of_many_methods_weighs_compiling_against_one_methods_rounds(monkeypatch, tmp_path):
    """243 runs of 81 methods on 2 slots: a worker runs ~40 rounds of any one method (its seeds), not 2440; compiling
    for 2440 made every method compile on the CPU (the digits comparison's first minutes: 26 to 113 s a method)."""
    import tuner.sweep.runner as runner
    from tuner.sweep.cluster import Resources
    from tuner.sweep.runner import Stage

    class Built(Exception):
        pass

    captured = {}

    def trainable(fn, **kwargs):
        captured.update(kwargs)
        raise Built

    monkeypatch.setattr(runner, "start_ray", lambda res: None)
    monkeypatch.setattr(runner, "check_fits", lambda request: None)
    monkeypatch.setattr(runner, "trial_resources", lambda res: {"cpu": 1.0, "gpu": 0.0})
    monkeypatch.setattr(runner.ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(runner.tune, "with_parameters", trainable)
    for sharing, rounds in ((3, 40), (None, 20 * 122)):
        with pytest.raises(Built):
            runner.run_stage(tmp_path, Stage("defaults", {}, 20, expected=243, sharing=sharing), Resources(), False)
        assert captured["worker_rounds"] == rounds


def test_a_tuned_variant_searches_none_of_its_familys_defining_settings_and_a_file_that_moved_one_is_refused(
    tmp_path,
):
    """FedAS's space searches align and fisher, the switches FedAS-noPA and FedAS-noCS turn off: in a tuned
    comparison neither FedAS nor its variants search them (each row stays the method it names), while FedEM searches
    the m its variants fix; a tuned file that moved a held setting is refused in one sentence."""
    from tuner.experiments.tuned_comparison import fair_space
    from tuner.settings.tuned_files import read_tuned

    root = Path(__file__).resolve().parents[1]
    asked = {"sampler": "tpe", "trials": 2, "grace": 1, "patience": None, "settings": {"rounds": 2}}
    for method, align in (("fedas", True), ("fedas-nopa", False)):
        space = fair_space(method, root / "search_spaces/fedas.yaml", tmp_path, {"method": method}, asked)
        assert set(space.search) == {"lr", "align_lr"}
        assert (
            f"# not searched, each row its own method: align={align}, fisher=True"
            in (tmp_path / f"{method}.yaml").read_text()
        )
    fedem = fair_space("fedem", root / "search_spaces/fedem.yaml", tmp_path, {"method": "fedem"}, asked)
    fedem_m5 = fair_space("fedem-m5", root / "search_spaces/fedem.yaml", tmp_path, {"method": "fedem-m5"}, asked)
    assert "m" in fedem.search and "m" not in fedem_m5.search
    setting = tmp_path / "tuned"
    setting.mkdir()
    (setting / "fedas-nopa.yaml").write_text(yaml.safe_dump({"method": "fedas-nopa", "settings": {"align": True}}))
    with pytest.raises(UserError, match=r"sets align=True, but fedas-nopa is the method with align=False"):
        read_tuned("fedas-nopa", str(setting), {})


def test_a_tuned_comparison_searches_no_methods_local_work_so_every_trial_takes_the_cells_local_steps(tmp_path):
    """FedAvg's space file searches local epochs and batch size (a sweep of FedAvg alone may); in a tuned
    comparison they stay the cell's for FedAvg as for every other method, and the derived file says so."""
    from tuner.experiments.tuned_comparison import fair_space

    asked = {"sampler": "tpe", "trials": 2, "grace": 1, "patience": None, "settings": {"rounds": 2}}
    source = ROOT / "search_spaces/fedavg.yaml"
    assert {"local_epochs", "batch_size"} <= set(yaml.safe_load(source.read_text())["search"])
    space = fair_space("fedavg", source, tmp_path, {"method": "fedavg"}, asked)
    assert set(space.search) == {"lr"}
    assert "equal local steps a trial): local_epochs, batch_size" in (tmp_path / "fedavg.yaml").read_text()


def test_a_search_whose_paper_default_lies_outside_its_range_starts_without_it(tmp_path):
    """Per-FedAvg's paper setting has no β in its range: Ray's Optuna search refuses a partial first point (the
    digits comparison's search stage stopped on FedAvg-FT's so), so none is tried first; FedPAC's whole one is, and
    FedPAC-CC's too, its λ = 0 held, not searched."""
    from tuner.experiments.tuned_comparison import fair_space
    from tuner.selection import SCORE
    from tuner.sweep.recovery import StoppableOptunaSearch

    root = Path(__file__).resolve().parents[1] / "search_spaces"
    asked = {"sampler": "tpe", "trials": 2, "grace": 1, "patience": None, "settings": {"rounds": 2}}
    for method, source, whole in (("per-fedavg", "per-fedavg", 0), ("fedpac-cc", "fedpac", 2), ("fedpac", "fedpac", 3)):
        space = fair_space(method, root / f"{source}.yaml", tmp_path, {"method": method}, asked)
        points = space.first_points()
        assert points == ([space.defaults()] if whole else None) and (not whole or len(points[0]) == whole)
        StoppableOptunaSearch(space=space.search, metric=SCORE, mode="max", points_to_evaluate=points)


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


def test_holm_and_benjamini_hochberg_adjust_a_family_and_leave_untested_rows_out():
    from scipy import stats

    from tuner.report.intervals import benjamini_hochberg, difference, holm

    ps = [0.01, 0.04, 0.03, 0.005, math.nan]
    assert holm(ps)[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(holm(ps)[4])
    assert benjamini_hochberg(ps)[:4] == pytest.approx([0.02, 0.04, 0.04, 0.02]) and math.isnan(
        benjamini_hochberg(ps)[4]
    )
    a, b = [0.9, 0.92, 0.91], [0.8, 0.85, 0.83]
    assert difference(a, b, paired=True).p == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-12)
    assert difference(a, a, paired=True).p == 1.0


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


def test_run_tuned_says_when_the_space_it_was_searched_from_has_changed(tmp_path, monkeypatch):
    """`tuner run --tuned` reads the provenance: a space file whose hash differs from the recorded one is named in a
    note (the run goes on); an unchanged one says nothing."""
    from tuner.settings.tuned_files import file_hash

    monkeypatch.chdir(tmp_path)
    space = tmp_path / "space.yaml"
    space.write_text("search: {lr: {loguniform: [0.001, 0.1]}}\n")
    folder = tmp_path / "mine"
    folder.mkdir()
    settings = {"dataset": "digits", "partition": "iid", "clients": 4, "rounds": 1, "lr": 0.05}
    provenance = {"space": "space.yaml", "space_sha256": file_hash(space)}
    (folder / "fedavg.yaml").write_text(
        yaml.safe_dump({"method": "fedavg", "settings": settings, "provenance": provenance})
    )
    same = CliRunner().invoke(app, ["run", "fedavg", "--tuned", str(folder), "--out", str(tmp_path / "a")])
    assert same.exit_code == 0 and "has changed since" not in same.output, same.output
    space.write_text("search: {lr: {loguniform: [0.001, 0.5]}}\n")
    changed = CliRunner().invoke(app, ["run", "fedavg", "--tuned", str(folder), "--out", str(tmp_path / "b")])
    assert changed.exit_code == 0, changed.output
    said = " ".join(changed.output.split())
    assert f"Note: space.yaml has changed since {folder / 'fedavg.yaml'} was tuned from it" in said


def test_a_tuned_value_is_at_its_ranges_edge_within_5_percent_on_its_scale():
    from tuner.report.budget_flags import at_edge, at_edge_of_searches

    search = {
        "lr": {"loguniform": [0.001, 0.1]},  # 0.0012 is 4 % up the log scale, 0.05 is 85 %
        "epochs": {"int": [1, 21]},
        "mu": {"uniform": [0.0, 1.0]},
        "batch_size": {"categorical": [10, 64]},
    }
    assert at_edge(search, {"lr": 0.0012, "epochs": 21, "mu": 0.5, "batch_size": 64}) == ["lr bottom", "epochs top"]
    assert at_edge(search, {"lr": 0.05, "epochs": 3, "mu": 0.96}) == ["mu top"]
    # several searches: every best looked at, a flag only some share counted
    both = at_edge_of_searches(search, [{"lr": 0.0012, "mu": 0.99}, {"lr": 0.05, "mu": 0.97}])
    assert both == ["lr bottom (1/2 searches)", "mu top"]


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


def test_several_searches_a_method_put_the_searches_chance_in_the_gains_interval(tmp_path):
    """Two searches of FedAvg found lr 0.01 and 0.02; each was rerun on seeds 2-4 beside the defaults. The gain is
    every rerun against its seed's defaults, its interval the t of searches and seeds as crossed random effects."""
    from tuner.report.fair import fair_markdown, fair_tables
    from tuner.report.intervals import searches_and_seeds

    root = tmp_path / "roster-tuned"
    (root / "defaults").mkdir(parents=True)
    cell = {"clients": 20, "dataset": "digits", "join_ratio": "1", "method": "fedavg", "protocol": "pfllib"}
    best = {json.dumps({**cell, "seed": s}, sort_keys=True): {"config": {"lr": lr}} for s, lr in ((0, 0.01), (1, 0.02))}
    record = {"asked": {"table": "roster", "searches": 2}, "best": best, "wall_s": 10, "slots": 1}
    (root / "comparison.yaml").write_text(yaml.safe_dump(record))
    defaults, tuned = [0.60, 0.62, 0.61], {0.01: [0.70, 0.71, 0.69], 0.02: [0.64, 0.66, 0.65]}
    rows = [dict(stage="defaults", seed=2 + i, lr=0.005, selected_acc=a) for i, a in enumerate(defaults)]
    rows += [
        dict(stage="seeds", seed=2 + i, lr=lr, selected_acc=a) for lr, accs in tuned.items() for i, a in enumerate(accs)
    ]
    frame = pd.DataFrame(rows).assign(
        experiment=lambda d: [str(root / s) for s in d["stage"]],
        method="fedavg",
        title="FedAvg",
        dataset="digits",
        partition="dir:0.1",
        clients=20,
        join_ratio="1",
        backbone="mlp",
        rounds_run=5,
        rounds_planned=5,
        val_round=3,
        time_s=1.0,
        failed="",
    )
    methods, columns = fair_tables(frame)
    row = methods.iloc[0]
    gains = [[t - d for t, d in zip(tuned[lr], defaults, strict=True)] for lr in (0.01, 0.02)]
    expected = searches_and_seeds(gains)
    assert row["searches"] == 2 and row["seeds"] == 3
    assert (row["gain"], row["gain_low"], row["gain_high"], row["gain_p"]) == pytest.approx(
        (100 * expected.mean, 100 * expected.low, 100 * expected.high, expected.p)
    )
    assert row["gain_low"] - 1e-9 <= 100 * (0.65 - 0.61) < 100 * (0.70 - 0.61) <= row["gain_high"] + 1e-9  # both in
    assert row["tuned_mean"] == pytest.approx(100 * (sum(tuned[0.01]) + sum(tuned[0.02])) / 6)
    assert "2 searches a method, each one's best rerun on the seeds" in fair_markdown(methods, columns)


def test_searches_and_seeds_as_random_effects_cover_the_mean_and_with_one_search_are_the_paired_t():
    import numpy as np

    from tuner.report.intervals import searches_and_seeds

    assert searches_and_seeds([[0.7, 0.9, 0.8]], [[0.6, 0.7, 0.75]]) == difference(
        [0.7, 0.9, 0.8], [0.6, 0.7, 0.75], paired=True
    )
    alike = searches_and_seeds([[0.05, 0.05, 0.05], [0.05, 0.05, 0.05]])
    assert (alike.mean, alike.low, alike.high, alike.p) == pytest.approx((0.05, 0.05, 0.05, 0.0))
    apart = searches_and_seeds([[0.10, 0.10, 0.10], [-0.10, -0.10, -0.10]])  # the searches disagree: the seeds do not
    assert apart.mean == pytest.approx(0) and apart.low < -0.10 and apart.high > 0.10 and apart.p == pytest.approx(1)
    # two methods on the same seeds: a constant lead has no spread
    ahead = searches_and_seeds([[0.90, 0.80, 0.85]], [[0.80, 0.70, 0.75]])
    assert (ahead.mean, ahead.low, ahead.high, ahead.p) == pytest.approx((0.10, 0.10, 0.10, 0.0))
    # 3 searches × 3 seeds drawn from the model, the searches' spread, the seeds' or the rest the larger: the 95 %
    # interval covers the true 0 in at least 94 % of 2000 draws each, two binomial standard errors (0.5 %) under 95 %
    # (a bootstrap over the 3 and 3, the interval this replaced, covered 72 to 87 % of 400)
    rng = np.random.default_rng(1)
    for search_sd, seed_sd, rest_sd in ((1, 1, 1), (2, 0.5, 0.5), (0.3, 2, 0.5), (1, 0, 0), (0, 1, 0)):
        draws = (
            search_sd * rng.normal(size=(2000, 3, 1))
            + seed_sd * rng.normal(size=(2000, 1, 3))
            + rest_sd * rng.normal(size=(2000, 3, 3))
        )
        covered = [(d := searches_and_seeds(g.tolist())).low <= 0 <= d.high for g in draws]
        assert np.mean(covered) >= 0.94, (search_sd, seed_sd, rest_sd, np.mean(covered))
    page = " ".join((ROOT / "docs/tuned.md").read_text().split())
    assert (
        "under five mixes of the searches', the seeds' and the rest's spread, it covers the true gain in at least "
        "94 % of 2000 draws each" in page
    )


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
