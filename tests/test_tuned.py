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

SELECTED = "selected_acc"
ROOT = Path(__file__).resolve().parents[1]


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


def test_the_latex_table_prints_as_a_paper_does_and_names_a_refused_method_in_its_caption():
    from tuner.report.fair import fair_latex

    row = dict(setting="digits-dir0.1-20c-mlp", defaults_std=1.234, tuned_std=0.5, gain_low=1.0, gain_high=3.0)
    ran = dict(row, title="FedAvg", refused="", defaults_mean=80.12345, tuned_mean=82.0, gain=1.87655, gain_p=0.01234)
    ran |= dict(gain_p_holm=0.0246, rank_defaults=2.0, rank_tuned=1.0)
    refused = dict(row, title="FedBN", refused="no batch_norm here.", rank_defaults=math.nan, rank_tuned=math.nan)
    tex = fair_latex(pd.DataFrame([ran, refused]))
    assert "FedAvg & 80.12 & 1.23 & 82.00 & 0.50 & 1.88 & 1.00 & 3.00 & 0.012 & 0.025 & 2 & 1" in tex
    assert "FedBN &" not in tex and "Not run at digits-dir0.1-20c-mlp: FedBN: no batch\\_norm here.}" in tex


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
