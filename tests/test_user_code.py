"""A user's own method, backbone and data, from files outside the repository: run under both executors,
swept by Ray Tune, tabled beside the baselines; every mistake in them one sentence."""

import json
import os
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from cli_runs import invoke, runner
from simulations import assert_equal_states, exact_config, reference_run, run_rounds

from tuner.cli import app
from tuner.settings.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ["--dataset", "digits", "--partition", "iid", "--clients", "4", "--rounds", "1"]

FEDNEW = '''
from dataclasses import dataclass

import torch.nn.functional as F

from algorithms import Method


class FedNew(Method):
    """FedAvg whose clients keep their head near the server's: a proximal term on the head alone."""

    name = "fednew"

    @dataclass
    class Hparams:
        mu: float = 0.5

    def loss(self, state, server, x, y):
        prox = sum(((state[k] - server[k]) ** 2).sum() for k in server if k.startswith("head."))
        return F.cross_entropy(self.net.logits(state, x), y) + self.hp.mu / 2 * prox
'''


@pytest.fixture
def fednew(tmp_path) -> str:
    """A method in a file of the user's, outside the repository."""
    path = tmp_path / "mine" / "fednew.py"
    path.parent.mkdir()
    path.write_text(FEDNEW)
    return f"{path}:FedNew"


TYPED = FEDNEW.replace(
    "from dataclasses import dataclass", "from dataclasses import dataclass\nfrom typing import Literal, Optional"
).replace(
    "        mu: float = 0.5",
    "        mu: float = 0.5\n        clip: Optional[float] = None\n        widths: tuple[int, ...] = (3,)\n  "
    '      mix: Literal["mean", "median"] = "mean"',
)


def test_a_users_hyperparameters_are_typed_by_their_hints(tmp_path):
    """Optional, tuples and Literal as a user writes them; values from --set or YAML take their hint's type."""
    from tuner.errors import UserError
    from tuner.settings.config import resolve_layers

    path = tmp_path / "typed.py"
    path.write_text(TYPED)
    method = f"{path}:FedNew"
    cfg = resolve_layers(
        method, [("--set", {"dataset": "digits", "clip": "0.5", "widths": [3, 4], "mix": "median", "mu": "1e-4"})]
    )
    assert cfg.hparams == {
        "mu": 0.0001,
        "clip": 0.5,
        "widths": (3, 4),
        "mix": "median",
    }  # "1e-4": YAML's string, a float here
    assert resolve_layers(method, [("--set", {"dataset": "digits", "clip": None})]).hparams["clip"] is None
    for name, value, words in (
        ("mix", "mode", "must be one of 'mean', 'median', not 'mode'"),
        ("widths", "3", "must be a list of int values"),
        ("mu", None, "mu needs a value"),
        ("mu", float("inf"), "mu must be a finite number"),
    ):
        with pytest.raises(UserError, match=words):
            resolve_layers(method, [("--set", {"dataset": "digits", name: value})])


def test_a_method_from_a_file_runs_alike_under_both_executors_and_is_not_fedavg(fednew):
    seq, _ = run_rounds(exact_config(fednew, executor="sequential"), 2)
    vec, _ = run_rounds(exact_config(fednew, executor="vectorized"), 2)
    assert_equal_states(seq, vec)
    fedavg = reference_run("fedavg")
    assert seq.server.keys() == fedavg.server.keys()
    assert not torch.allclose(seq.server["head.weight"], fedavg.server["head.weight"])  # its loss term acts


def test_the_template_runs_as_written_and_is_fedavg(tmp_path):
    res = invoke("methods", "--template", "fed-new")
    assert res.exit_code == 0
    path = tmp_path / "fed_new.py"
    path.write_text(res.output)
    assert "class FedNew(Method)" in res.output and 'name = "fed-new"' in res.output
    mine, _ = run_rounds(exact_config(f"{path}:FedNew", executor="sequential"), 2)
    assert_equal_states(reference_run("fedavg"), mine)  # every hook spells out FedAvg's default


def test_the_fedbn_example_keeps_batchnorm_local_under_both_executors():
    cfg = dict(backbone=f"{ROOT}/examples/bn_cnn.py:build")
    seq, _ = run_rounds(exact_config(f"{ROOT}/examples/fedbn.py:FedBN", executor="sequential", **cfg), 2)
    vec, _ = run_rounds(exact_config(f"{ROOT}/examples/fedbn.py:FedBN", executor="vectorized", **cfg), 2)
    assert_equal_states(seq, vec)
    norms = [k for k in seq.clients if k.startswith(("body.1.", "body.4."))]  # the two BatchNorm layers
    assert norms and not any(k in seq.server for k in norms) and "body.0.weight" in seq.server
    fedavg, _ = run_rounds(exact_config("fedavg", executor="sequential", **cfg), 2)
    assert "body.1.weight" in fedavg.server and not torch.allclose(
        fedavg.server["body.0.weight"], seq.server["body.0.weight"]
    )


def test_a_relative_method_path_is_recorded_absolute(tmp_path, fednew, monkeypatch):
    monkeypatch.chdir(Path(fednew.rpartition(":")[0]).parent)
    res = invoke("run", "./fednew.py:FedNew", *DIGITS, "--set", "mu=0.1", "--out", tmp_path / "run")
    assert res.exit_code == 0, res.output
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert cfg["method"] == fednew and cfg["hparams"] == {"mu": 0.1}
    again = invoke("run", "./fednew.py:FedNew", "--resume", "--rounds", "2", "--out", tmp_path / "run")
    assert again.exit_code == 0, again.output


def test_an_installed_packages_method_is_listed_and_runs_by_name(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "fednew_pkg").mkdir(parents=True)
    (site / "fednew_pkg" / "__init__.py").write_text(FEDNEW)
    info = site / "fednew_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fednew-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pfl_tuner.methods]\nfednew = fednew_pkg:FedNew\n")
    monkeypatch.syspath_prepend(str(site))
    listed = runner.invoke(app, ["methods"], env={"COLUMNS": "250"})
    assert listed.exit_code == 0 and "fednew" in listed.output and "fednew_pkg:FedNew" in listed.output
    res = invoke("run", "fednew", *DIGITS, "--out", tmp_path / "run")
    assert res.exit_code == 0, res.output


@pytest.mark.ray
@pytest.mark.slow
def test_a_users_method_sweeps_in_ray_workers_and_gets_its_own_rows(tmp_path, fednew, monkeypatch):
    import ray

    from tuner.sweep.cluster import OWN_RAY_CONFIG

    monkeypatch.chdir(Path(fednew.rpartition(":")[0]).parent)  # relative paths, in the space file too, are from here
    space = Path("fednew.yaml")
    Path("model.py").write_text(
        "from tuner.models import mlp\n\ndef build(shape, classes):\n    return mlp(shape, classes)\n"
    )
    space.write_text(
        textwrap.dedent("""
        method: ./fednew.py:FedNew
        settings: {dataset: digits, partition: iid, clients: 4, rounds: 2, executor: sequential, backbone:
        ./model.py:build}
        search:
          mu: {loguniform: [0.01, 1.0]}
        samples: 2
    """)
    )
    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        _system_config=OWN_RAY_CONFIG,
    )  # trials in turn, on one worker
    try:
        res = invoke("sweep", "./fednew.py:FedNew", "--space", space, "--storage", tmp_path / "sweeps")
    finally:
        ray.shutdown()
    assert res.exit_code == 0, res.output
    sweep = tmp_path / "sweeps" / "fednew"  # the space fednew.yaml of method fednew
    results = [
        json.loads(line) for f in (sweep / "search").glob("*/result.json") for line in f.read_text().splitlines()
    ]
    # worker processes
    assert len({r["trial_id"] for r in results}) == 2 and all(r["pid"] != os.getpid() for r in results)
    out = invoke("report", sweep, "--out", tmp_path / "report")
    assert out.exit_code == 0, out.output
    runs = pd.read_parquet(tmp_path / "report" / "runs.parquet")
    assert set(runs["title"]) == {"fednew"} and (runs["method"] == fednew).all()
    # found by trials in their own directories
    assert (runs["backbone"] == str(Path("model.py").resolve()) + ":build").all()
    assert "fednew" in (tmp_path / "report" / "best.md").read_text()


def test_a_users_method_gets_its_own_row_in_a_paper_table_beside_the_baselines(tmp_path, fednew):
    run = tmp_path / "runs" / "fednew"
    run.mkdir(parents=True)  # a finished run in GPFL/FedCP's Fashion-MNIST Dir(0.1) cell, as `tuner run` writes it
    cfg = RunConfig(
        method=fednew,
        dataset="fmnist",
        partition="dir:0.1",
        clients=20,
        rounds=2,
        backbone="cnn4",
        protocol="pfllib",
        lr=0.005,
        batch_size=10,
        local_epochs=1,
        momentum=0.0,
        weight_decay=0.0,
        normalize="half",
        augment=False,
        full_last_round=False,
        groups=5,
        hparams={"mu": 0.5},
    )
    run.joinpath("config.yaml").write_text(cfg.to_yaml())
    pd.DataFrame({"round": [1, 2], "acc": [0.5, 0.9], "best_acc": [0.5, 0.9], "time_s": [1.0, 1.0]}).to_parquet(
        run / "metrics.parquet"
    )
    res = invoke("report", tmp_path / "runs", ROOT / "results" / "reproduction", "--out", tmp_path / "report")
    assert res.exit_code == 0, res.output
    tables = pd.read_parquet(tmp_path / "report" / "tables.parquet")
    mine = tables[(tables["method"] == "fednew") & (tables["seeds"] > 0)]
    assert len(mine) and mine["ours_mean"].tolist() == [90.0] * len(mine)
    for table in set(mine["table"]):  # beside every baseline of that table
        assert {"FedAvg", "FedPer"} <= set(tables.loc[tables["table"] == table, "method"])


# ---------------------------------------------------------------- the user's data


# ---------------------------------------------------------------- every mistake: one sentence, exit 2


def bad_method(tmp_path: Path, source: str) -> str:
    path = tmp_path / "bad.py"
    path.write_text(textwrap.dedent(source))
    return f"{path}:Bad"


METHOD_MISTAKES = {
    "not a Method": ("class Bad:\n    name = 'bad'\n", "subclass algorithms.Method"),
    "no name": ("from algorithms import Method\nclass Bad(Method):\n    pass\n", "no name of its own"),
    "a built-in's name": (
        "from algorithms import Method\nclass Bad(Method):\n    name = 'fedavg'\n",
        "like a built-in",
    ),
    "a hyperparameter without default": (
        "from dataclasses import dataclass\nfrom algorithms import Method\nclass Bad(Method):\n    name = 'bad'\n"
        "    @dataclass\n    class Hparams:\n        mu: float\n",
        "mu has no default",
    ),
    "a file that does not import": (
        "import numpy\nraise RuntimeError('half-written')\n",
        "line 2: RuntimeError: half-written",
    ),
    "a syntax error": ("class Bad(:\n", "does not import: line 1"),
    "sums with nowhere to go": (
        "from algorithms import Method\nclass Bad(Method):\n    name = 'bad'\n    def statistics(self, state, "
        "server, x, y, w):\n        return {}\n",
        "defines statistics but neither begin_local nor end_local",
    ),
    "no such class": ("x = 1\n", "defines no 'Bad'"),
}


@pytest.mark.parametrize("mistake", list(METHOD_MISTAKES))
def test_a_mistaken_method_is_one_sentence(tmp_path, mistake):
    source, words = METHOD_MISTAKES[mistake]
    res = invoke("run", bad_method(tmp_path, source), *DIGITS, "--out", tmp_path / "run")
    assert res.exit_code == 2 and words in res.output, res.output


BACKBONE_MISTAKES = {
    "no body": ("from torch import nn\ndef build(shape, k):\n    return nn.Linear(64, k)\n", "missing: body, head"),
    "no feature_dim": (
        "from torch import nn\ndef build(shape, k):\n    m = nn.Module()\n    m.body, m.head = nn.Flatten(), "
        "nn.Linear(64, k)\n    return m\n",
        "needs feature_dim",
    ),
    "a wrong feature_dim": (
        "from torch import nn\nfrom tuner.models import Backbone\ndef build(shape, k):\n"
        "    return Backbone(nn.Sequential(nn.Flatten(), nn.Linear(64, 32)), nn.Linear(32, k), feature_dim=16)\n",
        "not (16,)",
    ),
    "a head of the wrong size": (
        "from torch import nn\nfrom tuner.models import Backbone\ndef build(shape, k):\n"
        "    return Backbone(nn.Flatten(), nn.Linear(64, 3), feature_dim=64)\n",
        "not the data's 10 classes",
    ),
    "not a function": ("build = 3\n", "is not a function"),
}


@pytest.mark.parametrize("mistake", list(BACKBONE_MISTAKES))
def test_a_mistaken_backbone_is_one_sentence(tmp_path, mistake):
    source, words = BACKBONE_MISTAKES[mistake]
    (tmp_path / "model.py").write_text(source)
    res = invoke("run", "fedavg", *DIGITS, "--set", f"backbone={tmp_path}/model.py:build", "--out", tmp_path / "run")
    assert res.exit_code == 2 and words in res.output, res.output


def test_reproduce_runs_a_users_method_in_every_setting_of_a_table(fednew, monkeypatch):
    from tuner.experiments import reproduce

    monkeypatch.setattr(reproduce, "_available", lambda dataset, data_dir: True)
    table, _ = reproduce.cells("gpfl-table1", ["fmnist"])
    mine, _ = reproduce.cells("gpfl-table1", ["fmnist"], [fednew])
    settings = lambda cells: [{k: v for k, v in c.items() if k != "method"} for c in cells]  # noqa: E731
    assert {c["method"] for c in mine} == {fednew}
    # each of the table's settings, once
    assert sorted(map(str, settings(mine))) == sorted(set(map(str, settings(table))))


def test_the_own_code_pages_example_tables_and_figures_are_the_committed_reports():
    """docs/own_code.md's two `best.md` tables are results/examples/*/best.md, and what the page says of them is
    computed from the same files."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "own_code.md").read_text()
    table = lambda text: "\n".join(line for line in text.splitlines() if line.startswith("|"))  # noqa: E731
    for example in ("bn-digits", "sites"):
        assert table((root / "results" / "examples" / example / "best.md").read_text()) in page, example
    best = pd.read_parquet(root / "results/examples/bn-digits/best.parquet").set_index("method")["selected_acc"] * 100
    flat = " ".join(page.split())
    assert f"buys FedBN {best['My FedBN'] - best['FedAvg']:.2f} points over FedAvg" in flat
    assert f"FedPer's personal head, made for label skew, gains {best['FedPer'] - best['FedAvg']:.2f}" in flat
    sites = pd.read_parquet(root / "results/examples/sites/runs.parquet")
    fedper = sites[sites["method"] == "fedper"]
    ties = (fedper["val_acc"] == fedper["val_acc"].max()).sum()
    assert (
        f"{['no', 'one', 'two', 'three', 'four', 'five', 'six'][ties]} of FedPer's six trials tie at "
        f"{100 * fedper['val_acc'].max():.2f} %" in flat
    )
    chosen = pd.read_parquet(root / "results/examples/sites/best.parquet").set_index("method")["selected_acc"] * 100
    assert f"FedPer's head of its own gains {chosen['FedPer'] - chosen['FedAvg']:.0f} points over FedAvg" in flat
