"""Experiments of many stages on Ray: a paper's table reproduced cell by cell, the tuned comparison, population
training (PBT, PB2) with its replay."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from sweeps import TINY, trials, tuned_lr
from typer.testing import CliRunner

from tuner.cli import app
from tuner.report.intervals import difference
from tuner.selection import SCORE
from tuner.settings.config import resolve_layers
from tuner.settings.tuned_files import checkout_commit


def test_reproduce_lists_the_cells_the_local_data_allows():
    from tuner.errors import UserError
    from tuner.experiments.reproduce import cells

    todo, skipped = cells("fedpac-table2")
    assert sorted(c["method"] for c in todo) == ["fedpac", "fedpac-cc", "fedpac-fa", "fedpac-none"]
    assert all(c["partition"] == "pac:20" and c["dataset"] == "fmnist" and c["protocol"] == "fedpac" for c in todo)
    assert any(s.startswith("Cifar10: no local data") for s in skipped)
    todo, skipped = cells("gpfl-table1", datasets=["fmnist"], methods=["gpfl", "fedper"])
    assert sorted((c["method"], c["partition"]) for c in todo) == [
        ("fedper", "dir:0.1"),
        ("fedper", "pat:2"),
        ("gpfl", "dir:0.1"),
        ("gpfl", "pat:2"),
    ]
    for table in ("gpfl-table1", "fedpac-table1", "fedcp-table2"):  # every method of every table is implemented
        assert not [s for s in cells(table)[1] if "not implemented" in s], table
    with pytest.raises(UserError, match="Unknown table 'gpfl-table9'"):
        cells("gpfl-table9")


@pytest.mark.ray
@pytest.mark.slow
def test_reproduce_runs_every_cell_with_seeds_and_prints_the_table(tmp_path, ray_local, monkeypatch):
    """A cell's seeds packed (--pack 2, every run at once): each run as it is alone (tests/test_sweep_pack.py)."""
    monkeypatch.chdir(tmp_path)  # a relative --storage, through the same path handling as the sweep's (below)
    res = CliRunner().invoke(
        app,
        [
            "reproduce",
            "fedpac-table2",
            "--method",
            "fedpac",
            "--method",
            "fedpac-none",
            "--rounds",
            "1",
            "--seeds",
            "2",
            "--storage",
            "repro",
            "--set",
            "pac_train=60",
            "--set",
            "pac_test=20",
            "--set",
            "executor=sequential",
            "--pack",
            "2",
            "--cpus-per-trial",
            "0.5",
            "--max-concurrent",
            "4",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "FedPAC Table2-ablation" in res.output and "left out: Cifar10" in res.output
    storage = tmp_path / "repro"
    ts = trials(storage / "fedpac-table2" / "reproduce")
    assert sorted((t["params"]["cell"]["method"], t["params"]["seed"]) for t in ts) == [
        ("fedpac", 0),
        ("fedpac", 1),
        ("fedpac-none", 0),
        ("fedpac-none", 1),
    ]
    assert {t["rows"][0]["pack"] for t in ts} == {2}  # a cell's two seeds as one program
    import pandas as pd

    tables = pd.read_parquet(storage / "fedpac-table2" / "report" / "tables.parquet")
    row = tables[
        (tables["table"] == "Table2-ablation")
        & (tables["method"] == "FedPAC")
        & (tables["column"] == "FMNIST dominant_s20")
    ].iloc[0]
    assert row["seeds"] == 2 and row["paper_mean"] == 91.83


@pytest.mark.ray
@pytest.mark.slow
def test_a_tuned_comparison_of_two_searches_a_method_reruns_each_ones_best_and_holds_both_in_the_gain(
    tmp_path, ray_local, monkeypatch
):
    """--searches 2: FedAvg searched twice (seeds 0 and 1, each trying the paper's lr first), each search's best
    rerun on seeds 2 and 3 beside the defaults (a configuration both found, once), the tuned file the better search's
    by validation, the fair row over both searches."""
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "roster", "--tune", "--method", "fedavg", "--trials", "2", "--searches", "2", "--seeds", "2"]
    args += ["--rounds", "2", "--grace", "1", "--storage", "runs", "--set", "dataset=digits", "--set", "clients=4"]
    res = CliRunner().invoke(app, [*args, "--space-dir", str(Path(__file__).resolve().parents[1] / "search_spaces")])
    assert res.exit_code == 0, res.output
    top = tmp_path / "runs" / "roster-tuned"
    searched = [t["params"] for t in trials(top / "search")]
    paper = resolve_layers("fedavg", [("test", {"dataset": "digits", "clients": 4})]).lr
    by_search = {s: [p for p in searched if p["cell"]["seed"] == s] for s in (0, 1)}
    assert {p["cell"].get("val_seed") for p in searched} == {None, 1}  # the second search, its own validation draw
    assert all(len(mine) == 2 and mine[0]["lr"] == paper for mine in by_search.values())
    record = yaml.safe_load((top / "comparison.yaml").read_text())
    found = {json.loads(k)["seed"]: v for k, v in record["best"].items()}
    assert sorted(found) == [0, 1] and record["asked"]["searches"] == 2 and record["asked"]["seeds"] == [2, 3]
    configs = {json.dumps(v["config"], sort_keys=True) for v in found.values()}
    reruns = [t["params"] for t in trials(top / "seeds")]
    assert sorted(p["seed"] for p in reruns) == sorted([2, 3] * len(configs))  # one configuration found twice: once
    assert sorted(p["seed"] for p in [t["params"] for t in trials(top / "defaults")]) == [2, 3]
    tuned = yaml.safe_load((tmp_path / "results/tuned/digits-dir0.1-4c-mlp/fedavg.yaml").read_text())
    chosen = max((0, 1), key=lambda s: found[s]["val_acc"])  # the first of equals
    assert tuned["provenance"]["searches"] == 2 and tuned["provenance"]["sampler_seed"] == chosen
    assert tuned["settings"]["lr"] == found[chosen]["config"]["lr"]
    here = checkout_commit()  # each stage's commit, recorded as it starts; the tuned file's is its search's
    assert (
        record["commits"] == {s: [here] for s in ("defaults", "search", "seeds")}
        and tuned["provenance"]["commit"] == here
    )
    fair = pd.read_parquet(top / "report" / "fair.parquet").iloc[0]
    assert fair["searches"] == 2 and fair["seeds"] == 2


@pytest.mark.ray
@pytest.mark.slow
def test_a_tuned_comparison_runs_searches_reruns_and_writes_what_a_run_takes_back(tmp_path, ray_local, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = [
        "reproduce",
        "roster",
        "--tune",
        "--method",
        "fedavg",
        "--method",
        "local",
        "--trials",
        "3",
        "--seeds",
        "2",
        "--rounds",
        "3",
        "--grace",
        "1",
        "--storage",
        "runs",
        "--set",
        "dataset=digits",
        "--set",
        "clients=4",
        "--space-dir",
        str(Path(__file__).resolve().parents[1] / "search_spaces"),
    ]
    res = CliRunner().invoke(app, command)
    assert res.exit_code == 0, res.output
    top = tmp_path / "runs" / "roster-tuned"
    assert "| method " in res.output and "rank defaults → tuned" in res.output  # the fair table, on the console too
    search = [t["params"] for t in trials(top / "search")]
    for method in ("fedavg", "local"):
        mine = [p for p in search if p["cell"]["method"] == method]
        paper = resolve_layers(method, [("test", {"dataset": "digits", "clients": 4})]).lr
        assert len(mine) == 3 and mine[0]["lr"] == paper  # the same trials each, the paper's default tried first
    # every trial's reports as TensorBoard event files, which docs/sweeps.md points `tensorboard --logdir` at
    assert all(list(d.glob("events.out.tfevents.*")) for d in (top / "search").glob("federated_trial_*"))
    defaults = sorted((p["cell"]["method"], p["seed"]) for p in [t["params"] for t in trials(top / "defaults")])
    reruns = sorted((p["tuned"]["method"], p["seed"]) for p in [t["params"] for t in trials(top / "seeds")])
    assert defaults == reruns == [("fedavg", 1), ("fedavg", 2), ("local", 1), ("local", 2)]

    runs = pd.read_parquet(top / "report" / "runs.parquet")
    fair = pd.read_parquet(top / "report" / "fair.parquet").set_index("method")
    for method in ("fedavg", "local"):
        by_seed = {
            stage: runs[(runs["method"] == method) & (runs["stage"] == stage)]
            .set_index("seed")["selected_acc"]
            .loc[[1, 2]]
            for stage in ("defaults", "seeds")
        }
        gain = difference(list(by_seed["seeds"].loc[[1, 2]]), list(by_seed["defaults"].loc[[1, 2]]), paired=True)
        assert fair.at[method, "gain"] == pytest.approx(100 * gain.mean)
        searched = runs[(runs["method"] == method) & (runs["stage"] == "search")]
        tuned = yaml.safe_load((tmp_path / "results/tuned/digits-dir0.1-4c-mlp" / f"{method}.yaml").read_text())
        provenance = tuned["provenance"]
        assert provenance["search_rounds_trained"] == searched["rounds_run"].sum() == fair.at[method, "search_rounds"]
        chosen = searched.loc[searched[SCORE].idxmax()]
        assert provenance["rounds_trained"] == chosen["rounds_run"] and provenance["comparison"] == "roster-tuned"
        assert provenance["sampler"] == "tpe" and provenance["sampler_random_start"] == 2  # 3 trials: TPE from the 3rd
        assert sorted(tuned["provenance"]["seeds_test_acc"]) == sorted(by_seed["seeds"])
        assert tuned["settings"]["lr"] == searched.loc[searched[SCORE].idxmax(), "lr"]  # chosen by validation
    best = pd.read_parquet(top / "report" / "best.parquet").set_index("sweep")  # a best configuration a cell
    assert {m: best.at[f"roster-tuned/{m}-digits-dir0.1-4c", "trials"] for m in ("fedavg", "local")} == {
        "fedavg": 3,
        "local": 3,
    }
    share = pd.read_parquet(top / "report" / "fair_columns.parquet")["training_share"].iloc[0]
    assert 0 < share < 1

    # the tuned settings run as they were found; a data setting typed over them is refused
    ran = CliRunner().invoke(app, ["run", "fedavg", "--tuned", "digits-dir0.1-4c-mlp", "--rounds", "1", "--out", "r"])
    assert ran.exit_code == 0, ran.output
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["lr"] == tuned_lr(tmp_path, "fedavg")
    refused = CliRunner().invoke(app, ["run", "fedavg", "--tuned", "digits-dir0.1-4c-mlp", "--partition", "iid"])
    assert refused.exit_code == 2 and "was tuned with partition=dir:0.1, not iid" in refused.output
    methods = CliRunner().invoke(app, ["methods"], env={"COLUMNS": "400"})
    assert re.search(r"fedavg .*│ digits-dir0.1-4c-mlp", methods.output)

    # resumed, a finished comparison runs nothing again; resumed with another budget, it is refused
    before = len(list(top.rglob("params.json")))
    again = CliRunner().invoke(app, [*command, "--resume"])
    assert again.exit_code == 0, again.output
    assert len(list(top.rglob("params.json"))) == before
    other = CliRunner().invoke(app, [*command, "--resume", "--trials", "4"])
    assert other.exit_code == 2 and "was started with other settings (trials: 3, now 4)" in other.output


FORCED_EXPLOIT = """
settings: {dataset: digits, partition: iid, clients: 4, rounds: 6, executor: sequential, dtype: float64}
search:
  lr: {loguniform: [0.0001, 0.1]}
samples: 2
scheduler: {kind: KIND, perturbation_interval: 2, quantile: 0.5}
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pbt", "pb2"])
def test_population_training_on_ray_exploits_and_the_replay_it_prints_reruns_its_best(
    tmp_path, ray_local, monkeypatch, kind
):
    """One trial at a time, PBT pausing a trial at each perturbation while the other waits: the two alternate every
    2 rounds (the paper's lr 0.005 first, then a seeded draw, 0.0081). At round 2 neither has a checkpoint PBT kept;
    by round 4 the one behind takes the other's state (quantile 0.5 of two) and trains rounds 5 and 6 on (with 4
    rounds it would have none left, and no exploit happens). This test requires that exploit: a population where
    none happened fails it. The command the report prints for the best trial, run as printed,
    retrains its curve exactly (float64)."""
    from tuner.report.best import perturbed
    from tuner.settings.schedule import ROUNDS_FILE, read_rounds

    space = tmp_path / "forced.yaml"
    space.write_text(FORCED_EXPLOIT.replace("KIND", kind))
    res = CliRunner().invoke(
        app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path), "--name", "pop"]
    )
    assert res.exit_code == 0, res.output
    files = [
        max(d.glob(f"checkpoint_*/{ROUNDS_FILE}")) for d in (tmp_path / "pop" / "search").glob("federated_trial_*")
    ]
    own = [
        f"federated_trial_{json.loads(f.parents[1].joinpath('result.json').read_text().splitlines()[0])['trial_id']}"
        for f in files
    ]
    held = [{r["trial"] for r in read_rounds(f)[0]} for f in files]
    assert len(files) == 2 and any(trained != {name} for trained, name in zip(held, own, strict=True)), held

    monkeypatch.chdir(tmp_path)
    report = CliRunner().invoke(app, ["report", "pop", "--out", "r"])
    assert report.exit_code == 0, report.output
    best_md, schedule = (tmp_path / "r" / "best.md").read_text(), pd.read_csv(tmp_path / "r" / "schedule-pop.csv")
    drawn = (tmp_path / "r" / "schedule-pop.png").exists()
    assert drawn == perturbed(schedule) == ("the best trial's schedule" in best_md) != ("never perturbed" in best_md)
    printed = re.search(r"`(tuner run fedavg --config \S+ --schedule \S+)`", best_md).group(1)
    monkeypatch.chdir(tmp_path / "r")
    replay = CliRunner().invoke(app, [*printed.split()[1:], "--out", str(tmp_path / "replay")])
    assert replay.exit_code == 0, replay.output
    replayed = pd.read_parquet(tmp_path / "replay" / "metrics.parquet")
    best = next(f for f in files if pd.DataFrame(read_rounds(f)[0])["lr"].tolist() == schedule["lr"].tolist())
    trained = pd.read_parquet(best)
    assert list(replayed["acc"]) == list(trained["acc"]) and list(replayed["val_acc"]) == list(trained["val_acc"])


@pytest.mark.ray
@pytest.mark.slow
def test_a_population_trials_result_json_holds_a_row_for_every_round_it_trained(tmp_path, ray_local):
    """4 trials of 40 rounds perturbed every 5, reporting each round: every round a trial trained (its own rounds in
    its checkpoints, told apart by ran_at) has its row, though exploits restart trials within the sweep. Ray Tune's
    own writer left one such trial 21 rows of its 40 (tests/test_faults.py shows why)."""
    from tuner.settings.schedule import ROUNDS_FILE, read_rounds

    space = tmp_path / "rows.yaml"
    space.write_text(
        TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 40").replace(
            "samples: 3", "samples: 4\nscheduler: {kind: pbt, perturbation_interval: 5}"
        )
    )
    res = CliRunner().invoke(app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path)])
    assert res.exit_code == 0, res.output
    for t in trials(tmp_path / "fedavg-rows" / "search"):
        name = f"federated_trial_{t['rows'][0]['trial_id']}"
        trained = {
            (r["round"], r["ran_at"])
            for f in t["dir"].glob(f"checkpoint_*/{ROUNDS_FILE}")
            for r in read_rounds(f)[0]
            if r["trial"] == name
        }
        rows = [r for r in t["rows"] if not r.get("handed_over")]
        assert len(rows) >= len(trained), (name, [r["round"] for r in rows], sorted(trained))
