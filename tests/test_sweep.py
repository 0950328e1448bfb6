"""`tuner sweep` end to end on Ray: trials, checkpoints, seeds, the search's stopping rules, failed trials, paths."""

import json
import os
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from sweeps import TINY, fresh_accuracies, trials
from typer.testing import CliRunner

from tuner.cli import app
from tuner.selection import score, selection, trial_score
from tuner.sweep.schedulers import asha
from tuner.sweep.stopping import Patience, RoundBudget
from tuner.sweep.storage import PARTIAL


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_searches_checkpoints_and_reruns_the_best_with_seeds(tmp_path, ray_local):
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY)
    study_db = tmp_path / "study.db"
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            "fedavg",
            "--space",
            str(space),
            "--storage",
            str(tmp_path),
            "--seeds",
            "2",
            "--study-db",
            str(study_db),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "best configuration" in res.output and "2 fresh seeds" in res.output and "chosen by" in res.output
    search = trials(tmp_path / "fedavg-tiny" / "search")
    assert len(search) == 3
    assert {"lr": 0.005} in [t["params"] for t in search]  # the MLP's paper learning rate is tried
    for t in search:
        assert [r["round"] for r in t["rows"]] == [1, 2, 3]
        best = [r["best_acc"] for r in t["rows"]]
        assert best == sorted(best) and best[-1] == max(r["acc"] for r in t["rows"])
        assert list(t["dir"].glob("checkpoint_*/simulation.pt"))
    experiment = yaml.safe_load((tmp_path / "fedavg-tiny" / "search" / "experiment.yaml").read_text())
    # Trials reuse their worker process, and a trial run in a used worker equals a fresh run of its config.
    by_start = sorted(search, key=lambda t: t["rows"][0]["reported_at"] - t["rows"][0]["time_total_s"])
    reused = [t for i, t in enumerate(by_start) if t["rows"][0]["pid"] in {u["rows"][0]["pid"] for u in by_start[:i]}]
    assert reused, [t["rows"][0]["pid"] for t in by_start]
    assert [r["acc"] for r in reused[0]["rows"]] == fresh_accuracies(experiment["settings"], reused[0]["params"])
    assert experiment["stage"] == "search" and experiment["settings"]["method"] == "fedavg"
    summary = yaml.safe_load((tmp_path / "fedavg-tiny" / "summary.yaml").read_text())
    best_lr = summary["best_config"]["lr"]
    # One trial is best by validation (the earlier round of equals) for the console, Optuna's study and the report.
    by_rule = max(search, key=lambda t: (t["rows"][-1]["best_val_acc"], -t["rows"][-1]["best_val_round"]))
    assert by_rule["params"]["lr"] == best_lr and summary["best"]["best_val_acc"] == by_rule["rows"][-1]["best_val_acc"]
    study = optuna.load_study(study_name="fedavg-tiny", storage=f"sqlite:///{study_db}")
    assert study.best_trial.params["lr"] == best_lr
    assert (
        CliRunner().invoke(app, ["report", str(tmp_path / "fedavg-tiny"), "--out", str(tmp_path / "r")]).exit_code == 0
    )
    best = pd.read_parquet(tmp_path / "r" / "best.parquet").iloc[0]
    assert best["config"] == f"lr={best_lr:.4g}" and best["val_acc"] == summary["best"]["best_val_acc"]
    seeds = trials(tmp_path / "fedavg-tiny" / "seeds")
    assert sorted(t["params"]["seed"] for t in seeds) == [1, 2]
    assert all(t["params"]["lr"] == best_lr and t["rows"][-1]["round"] == 3 for t in seeds)
    assert seeds[0]["rows"][-1]["acc"] != seeds[1]["rows"][-1]["acc"]  # the seeds really differ
    again = CliRunner().invoke(app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path)])
    assert again.exit_code == 2 and "already holds a sweep; pass --resume" in again.output
    # Ray Tune wrote the sweep's folder in whole files (tuner/sweep/storage.py), none left partial
    assert b"WholeFiles" in (tmp_path / "fedavg-tiny" / "search" / "tuner.pkl").read_bytes()
    assert not list(tmp_path.rglob(f"*{PARTIAL}*"))


@pytest.mark.ray
@pytest.mark.slow
def test_tied_trials_name_the_trial_that_started_first_in_the_console_summary_and_report(tmp_path, ray_local):
    """checkpoint_every changes no figure, so three trials tie on score; every place that names a best trial names
    the one that started first, whatever order the grid sampler drew the values in."""
    space = tmp_path / "tie.yaml"
    space.write_text(
        "settings: {dataset: digits, partition: iid, clients: 4, rounds: 2, executor: sequential}\n"
        "search:\n  checkpoint_every: {grid: [1, 2, 3]}\nsampler: grid\nsamples: 3\nselect: val\n"
    )
    res = CliRunner().invoke(
        app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path), "--max-concurrent", "1"]
    )
    assert res.exit_code == 0, res.output
    search = trials(tmp_path / "fedavg-tie" / "search")
    assert len({t["rows"][-1]["score"] for t in search}) == 1  # a tie for ASHA, Optuna's study and the console alike
    # Tune starts trials in the order it creates them, and each folder begins with that count (one trial at a time).
    first = next(t for t in search if t["dir"].name.startswith("federated_trial_00001_"))["params"]["checkpoint_every"]
    assert f"checkpoint_every={first}" in res.output
    assert yaml.safe_load((tmp_path / "fedavg-tie" / "summary.yaml").read_text())["best_config"] == {
        "checkpoint_every": first
    }
    assert (
        CliRunner().invoke(app, ["report", str(tmp_path / "fedavg-tie"), "--out", str(tmp_path / "r")]).exit_code == 0
    )
    assert pd.read_parquet(tmp_path / "r" / "best.parquet").iloc[0]["config"] == f"checkpoint_every={first}"


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_ended_by_its_round_budget_says_so(tmp_path, ray_local):
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY)
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            "fedavg",
            "--space",
            str(space),
            "--storage",
            str(tmp_path),
            "--max-total-rounds",
            "4",
            "--max-concurrent",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "round budget" in " ".join(res.output.split())
    summary = yaml.safe_load((tmp_path / "fedavg-tiny" / "summary.yaml").read_text())
    assert summary["ended_by"].startswith("the round budget") and "max_total_rounds 4" in summary["ended_by"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_trial_refusing_its_setting_is_not_retried_and_the_sweep_does_not_exit_0(tmp_path, ray_local):
    """batch_size 5000 passes the space's checks (any int is a batch size) but no client holds a batch that
    large: the trial fails once, with the run's sentence, and the sweep says so with exit code 2."""
    space = tmp_path / "big.yaml"
    space.write_text(
        "settings: {dataset: digits, partition: iid, clients: 4, rounds: 2, executor: sequential}\n"
        "search:\n  batch_size: {grid: [10, 5000]}\nsampler: grid\nsamples: 2\n"
    )
    res = CliRunner().invoke(app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path)])
    assert (
        res.exit_code == 2
        and "1 trial of" in res.output
        and "fewer training samples than one batch" in " ".join(res.output.split())
    ), res.output
    failed = next(
        d for d in (tmp_path / "fedavg-big" / "search").glob("federated_trial_*") if (d / "error.txt").exists()
    )
    assert (d := failed / "error.txt").read_text().count("Failure #") == 1, d.read_text()  # never retried
    assert yaml.safe_load((tmp_path / "fedavg-big" / "summary.yaml").read_text())["best_config"] == {"batch_size": 10}


@pytest.mark.ray
@pytest.mark.slow
def test_a_diverging_trial_and_one_whose_worker_always_dies_are_failed_with_their_reasons_and_the_sweep_goes_on(
    tmp_path, ray_local, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    Path("dies.py").write_text(
        "import os, signal\nfrom algorithms.fedavg import FedAvg\n\n\n"
        "class Dies(FedAvg):  # FedAvg, but its worker is killed as it starts (as by the OOM killer) at lr = 0.5\n"
        "    name = 'dies'\n\n"
        "    def __init__(self, net, training, hp=None):\n"
        f"        if training.lr == 0.5 and os.getpid() != {os.getpid()}:\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        super().__init__(net, training, hp)\n"
    )
    space = tmp_path / "div.yaml"
    space.write_text(TINY.replace("lr: {loguniform: [0.001, 0.2]}", "lr: {grid: [0.05, 0.5, 1.0e+12]}"))
    db = tmp_path / "study.db"
    res = CliRunner().invoke(
        app, ["sweep", "./dies.py:Dies", "--space", str(space), "--storage", str(tmp_path), "--study-db", str(db)]
    )
    died = "3 failures, the last: The actor is dead because its worker process has died."
    assert res.exit_code == 0, res.output  # failed trials, not unfinished ones
    assert "diverged" in res.output and died in " ".join(res.output.split())
    by_lr = {t["params"]["lr"]: t for t in trials(tmp_path / "dies-div" / "search")}
    assert "diverged" in by_lr[1.0e12]["rows"][-1]["failed"]
    # not retried: it would diverge again
    assert (by_lr[1.0e12]["dir"] / "error.txt").read_text().count("Failure #") == 1
    assert by_lr[0.05]["rows"][-1]["round"] == 3 and not by_lr[0.5]["rows"]  # it never reported a round
    res = CliRunner().invoke(app, ["report", str(tmp_path / "dies-div"), "--out", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    runs = pd.read_parquet(tmp_path / "report" / "runs.parquet").sort_values("lr")
    assert (
        runs["rounds_run"].tolist() == [3, 0, 1]
        and runs["failed"].iloc[1] == died
        and "diverged" in runs["failed"].iloc[2]
    )
    import optuna  # the study outlives Ray in SQLite

    study = optuna.load_study(study_name="dies-div", storage=f"sqlite:///{db}")
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE", "FAIL", "FAIL"]


def test_stopping_rules():
    patience = Patience(3)
    assert not patience("t", {"round": 10, "best_round": 7})
    assert patience("t", {"round": 11, "best_round": 7})
    budget = RoundBudget(10)
    budget("a", {"round": 4})
    budget("b", {"round": 5})
    assert not budget.stop_all()
    budget("a", {"round": 5})
    assert budget.stop_all()
    scheduler = asha(5, 100)
    assert scheduler._time_attr == "round" and scheduler._max_t == 100 and asha(None, 100) is None
    rows = [
        {"round": 1, "acc": 0.5, "val_acc": 0.7},
        {"round": 2, "acc": 0.8, "val_acc": 0.6},
        {"round": 3, "train_loss": 1.0},
    ]
    figures = {"best_acc": 0.8, "best_val_acc": 0.7, "best_val_round": 1}
    assert selection(rows, "test") == {**figures, "selected_acc": 0.8, "best_round": 2, "score": 0.8 - 2e-12}
    assert selection(rows, "val") == {**figures, "selected_acc": 0.5, "best_round": 1, "score": 0.7 - 1e-12}
    # the same validation accuracy later: the earlier round stands
    tied = rows + [{"round": 4, "acc": 0.9, "val_acc": 0.7}]
    assert selection(tied, "val")["best_round"] == 1 and score(0.7, 1) > score(0.7, 4) > score(0.699999, 1)
    old = {"best_val_acc": 0.7, "best_acc": 0.8, "best_round": 3}  # a trial's result from before scores were reported
    assert (
        trial_score(old, "val") == score(0.7, 3)
        and trial_score(old, "test") == score(0.8, 3)
        and trial_score({**old, "score": 0.5}, "val") == 0.5
    )


def test_a_resumed_sweeps_round_budget_counts_the_rounds_its_trials_ran_before(tmp_path):
    """Tune saves the stopper when the sweep begins; resumed, it counts what the trials' files hold."""
    import pickle

    for trial_id, rounds in (("a", 4), ("b", 3)):
        (tmp_path / f"federated_trial_{trial_id}").mkdir()
        rows = [json.dumps({"trial_id": trial_id, "round": r}) for r in range(1, rounds + 1)]
        (tmp_path / f"federated_trial_{trial_id}" / "result.json").write_text(
            "\n".join(rows) + '\n{"trial_id": "a", "rou'
        )  # cut by a kill
    saved = pickle.dumps(RoundBudget(10, tmp_path))  # as Tune stores it with the experiment, before any round
    budget = pickle.loads(saved)
    assert not budget.stop_all()  # 4 + 3 before the resume
    budget("b", {"round": 4})  # b goes on
    assert not budget.stop_all()
    budget("c", {"round": 2})
    assert budget.stop_all()  # 4 + 4 + 2


def test_once_a_stage_is_stopping_its_search_suggests_no_trial():
    from optuna.distributions import FloatDistribution

    from tuner.sweep.recovery import INTERRUPTED, StoppableOptunaSearch

    search = StoppableOptunaSearch(space={"lr": FloatDistribution(0.001, 0.1, log=True)}, metric="score", mode="max")
    INTERRUPTED.clear()
    assert "lr" in search.suggest("a")
    INTERRUPTED.set()  # the first Ctrl-C
    try:
        assert search.suggest("b") is None  # Tune asks again later; by then it has stopped
    finally:
        INTERRUPTED.clear()


def test_a_trial_that_reported_its_last_round_is_done_even_if_the_stop_came_before_tune_completed_it():
    # A SIGTERM test once saw a trial report round 8 of 8 and the stop land before Tune completed it:
    # the sweep called it unfinished while its rows were whole.
    from types import SimpleNamespace

    from tuner.sweep.console import SweepProgress, stage_counts

    stage_counts.update(early=0, failed=0, done=0)
    progress = SweepProgress(total=3, rounds=8, select="val")
    progress.setup()
    last, early, failing = (SimpleNamespace(trial_id=i, last_result=None) for i in "abc")
    progress.on_trial_result(0, [], last, {"round": 8})  # the stop came here: no on_trial_complete
    assert stage_counts == {"early": 0, "failed": 0, "done": 1}
    last.last_result = {"round": 8}
    progress.on_trial_complete(0, [], last)  # completed after all: still one
    early.last_result = {"round": 3}
    progress.on_trial_result(0, [], early, {"round": 3})
    progress.on_trial_complete(0, [], early)  # stopped early by the scheduler
    progress.on_trial_result(0, [], failing, {"round": 8})
    failing.error_file, failing.last_result = None, {"round": 8}
    progress.on_trial_error(0, [], failing)  # it failed after its last round: failed, not done
    progress.on_experiment_end([])
    assert stage_counts == {"early": 1, "failed": 1, "done": 2}


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_and_report_take_relative_and_home_paths(tmp_path, monkeypatch, ray_local):
    home, work = tmp_path / "home", tmp_path / "work"
    for d in (home, work):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    cases = (
        ("", work, "group/one", "sweeps/group/one", work / "sweeps" / "group" / "one"),
        ("~/", home, "~/named", "~/named", home / "named"),
    )
    for prefix, folder, name, typed, sweep_dir in cases:  # --name is a folder under --storage, or a path of its own
        (folder / "tiny.yaml").write_text(TINY.replace("samples: 3", "samples: 1"))
        args = [
            "sweep",
            "fedavg",
            "--space",
            f"{prefix}tiny.yaml",
            "--storage",
            f"{prefix}sweeps",
            "--name",
            name,
            "--study-db",
            f"{prefix}study.db",
        ]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        assert len(trials(sweep_dir / "search")) == 1 and (folder / "study.db").exists()
        if prefix:  # a finished sweep restores and reports again
            res = CliRunner().invoke(app, [*args, "--resume"])
            assert res.exit_code == 0 and len(trials(sweep_dir / "search")) == 1, res.output
        res = CliRunner().invoke(app, ["report", typed, "--out", f"{prefix}report"])
        assert res.exit_code == 0, res.output
        assert pd.read_parquet(folder / "report" / "best.parquet")["trials"].tolist() == [1]
