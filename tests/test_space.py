"""Search-space files: what they turn into, and every mistake refused before a sweep starts."""

from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from tuner.cli import app
from tuner.errors import UserError
from tuner.sweep.space_file import load_space

SPACES = Path(__file__).resolve().parents[1] / "search_spaces"


def write(tmp_path, text, name="space.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_distributions_defaults_and_stopping(tmp_path):
    p = write(
        tmp_path,
        """
settings: {dataset: digits, clients: 4, rounds: 30}
search:
  lam: {grid: [0, 0.1, 1, 5, 10]}
  lr: {loguniform: [0.001, 0.1]}
  local_epochs: {int: [1, 5]}
  partition: {categorical: ["dir:0.1", "dir:0.5"]}
  cpn_input: {uniform: [0.2, 0.3]}
stop: {grace: 5, patience: 10, max_total_rounds: 200}
""",
    )
    with pytest.raises(UserError, match="cpn_input"):  # not a number setting of fedcp
        load_space(p, "fedcp")
    p = write(tmp_path, p.read_text().replace("  cpn_input: {uniform: [0.2, 0.3]}\n", ""))
    space = load_space(p, "fedcp")
    d = optuna.distributions
    assert space.search["lam"] == d.CategoricalDistribution([0, 0.1, 1, 5, 10])
    assert space.search["lr"] == d.FloatDistribution(0.001, 0.1, log=True)
    assert space.search["local_epochs"] == d.IntDistribution(1, 5)
    assert space.sampler == "tpe" and space.samples == 10
    # TPE models the space after a third of the trials, not after Optuna's default 10 (all of these)
    assert space.make_sampler(0)._n_startup_trials == 3
    # honest by default: the sweep selects on a validation split it carves, never on test accuracy
    assert space.select == "val" and space.figure == "best_val_acc" and space.base_config().val_frac == 0.1
    assert (space.stop.grace, space.stop.rules) == (5, {"patience": 10, "max_total_rounds": 200})
    # the paper's setting first: FedCP's λ = 5, the MLP's lr 0.005, one local epoch; dir:0.1 is the default partition
    assert space.defaults() == {"lam": 5.0, "lr": 0.005, "local_epochs": 1, "partition": "dir:0.1"}


def test_default_outside_the_range_is_left_to_the_sampler(tmp_path):
    p = write(tmp_path, "settings: {dataset: digits}\nsearch:\n  lam: {uniform: [0.2, 0.9]}\n  mu: {grid: [0.1, 1]}\n")
    assert load_space(p, "gpfl").defaults() == {"mu": 0.1}


def test_all_grid_uses_the_grid_sampler_over_the_whole_product(tmp_path):
    p = write(
        tmp_path,
        "settings: {dataset: digits}\nsearch:\n  lam: {grid: [0, 0.1, 1]}\n  mu: {grid: [0, 0.1]}\nsamples: 2\n",
    )
    space = load_space(p, "gpfl")
    assert space.sampler == "grid" and space.samples == 6
    # said, not silent
    assert space.notes == [f"{p}: samples: the grid sampler runs each of its 6 points once, so 6 trials, not 2."]
    assert isinstance(space.make_sampler(0), optuna.samplers.GridSampler)
    # no count given: nothing to say
    assert load_space(write(tmp_path, "search:\n  lam: {grid: [0, 1]}\n"), "gpfl").notes == []


def test_command_line_overrides_and_val_selection(tmp_path):
    p = write(tmp_path, "settings: {dataset: digits}\nsearch:\n  lr: {loguniform: [0.001, 0.1]}\n")
    space = load_space(p, "fedavg", {"sampler": "random", "samples": 3, "select": "val", "patience": 4}, {"rounds": 7})
    assert (space.sampler, space.samples, space.select, space.stop.rules["patience"]) == ("random", 3, "val", 4)
    assert space.figure == "best_val_acc"
    cfg = space.base_config()
    assert cfg.rounds == 7 and cfg.val_frac == 0.1  # val selection gets a validation split
    with pytest.raises(UserError, match="cannot also be fixed"):
        load_space(p, "fedavg", settings={"lr": 0.1})


@pytest.mark.parametrize(
    "text, message",
    [
        ("search: [lr\n", "is not valid YAML at line"),
        (
            "search:\n  lr: {normal: [0, 1]}\n",
            "unknown distribution 'normal'; use one of uniform, loguniform, int, categorical, grid",
        ),
        ("search:\n  lr: {uniform: [0.1, 0.01]}\n", "low 0.1 must be below high 0.01"),
        ("search:\n  lamda: {grid: [1, 2]}\n", "'lamda' is not a setting of fedcp; allowed:"),
        ("search:\n  lr: {loguniform: [0, 1]}\n", "loguniform needs a positive low bound"),
        ("search:\n  local_epochs: {int: [1.5, 3]}\n", "whole-number bounds"),
        ("search:\n  partition: {categorical: ['dir:0.1', 'dirichlet']}\n", "not understood"),
        ("search:\n  lam: {grid: []}\n", "needs a list of distinct values"),
        ("search:\n  lam: {grid: [1]}\nsampler: annealing\n", "unknown sampler 'annealing'"),
        ("search:\n  lam: {grid: [1]}\nselect: train\n", "select must be test or val"),
        ("search:\n  lam: {grid: [1]}\nstop: {patiense: 3}\n", "stop.patiense is unknown"),
        ("search:\n  lam: {grid: [1]}\nsamples: 0\n", "space.yaml: samples must be a whole number"),
        ("serach:\n  lam: {grid: [1]}\n", "unknown key 'serach'"),
        ("method: gpfl\nsearch:\n  lam: {grid: [1]}\n", "is a space for gpfl, not fedcp"),
        ("settings: {rounds: 10}\nsearch:\n  lam: {grid: [1]}\nstop: {grace: 20}\n", "exceeds the run's 10 rounds"),
        ("search: {}\n", "names no setting to search"),
    ],
)
def test_bad_space_files_are_refused_with_one_sentence(tmp_path, text, message):
    p = write(tmp_path, text)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")) as e:
        load_space(p, "fedcp")
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    storage = tmp_path / "sweeps"
    res = CliRunner().invoke(app, ["sweep", "fedcp", "--space", str(p), "--storage", str(storage)])
    assert res.exit_code == 2 and "Traceback" not in res.output and not storage.exists()


@pytest.mark.parametrize("path", sorted(SPACES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_space_loads(path):
    import yaml

    method = yaml.safe_load(path.read_text())["method"]
    space = load_space(path, method)
    assert space.samples >= 1 and space.search


def test_a_variant_uses_its_methods_space():
    space = load_space(SPACES / "fedpac-grid.yaml", "fedpac-fa")
    assert space.method == "fedpac-fa" and space.samples == 5 and space.base_config().hparams["combine"] == "none"


def test_every_method_has_a_shipped_space():
    import yaml

    from algorithms import METHODS

    shipped = {yaml.safe_load(p.read_text())["method"] for p in SPACES.glob("*.yaml")}
    assert {name for name, cls in METHODS.items() if not cls.family} <= shipped


def test_a_space_names_a_shared_setting_and_overrides_it(tmp_path):
    from tuner.settings.papers import SETTINGS

    p = write(tmp_path, "setting: fedpac-fmnist-pac20\nsettings: {rounds: 30}\nsearch:\n  lr: {grid: [0.1, 1]}\n")
    cfg = load_space(p, "fedavg").base_config()
    shared = SETTINGS["fedpac-fmnist-pac20"]
    assert (cfg.dataset, cfg.partition, cfg.protocol, cfg.checkpoint_every) == (
        shared["dataset"],
        shared["partition"],
        "fedpac",
        20,
    )
    assert cfg.rounds == 30 and cfg.batch_size == 50  # the file's own settings win; the protocol fills the rest
    p = write(tmp_path, "setting: fmnist\nsearch:\n  lr: {grid: [0.1, 1]}\n")
    with pytest.raises(
        UserError, match="unknown setting 'fmnist'; name one of pfllib-fmnist-dir0.1, fedpac-fmnist-pac20"
    ):
        load_space(p, "fedavg")


def test_a_stopping_rule_registered_in_stopping_py_alone_is_read_from_a_space_file_and_stops_the_search(tmp_path):
    """The map's promise (docs/architecture.md): a stopping rule touches tuner/sweep/stopping.py alone. A toy rule,
    registered there only, is a key of a space file's `stop:`, refused where not positive, and built into the search
    stage's stopper; a configuration's reruns go without it where it bounds the search alone."""
    from ray.tune.stopper import Stopper

    from tuner.sweep import stopping
    from tuner.sweep.stages import search_stage, seeds_stage

    class After(Stopper):
        def __init__(self, rounds: int):
            self.rounds = rounds

        def __call__(self, trial_id, result):
            return result["round"] >= self.rounds

        def stop_all(self):
            return False

    toy = stopping.StoppingRule("after", "stop every trial after this many rounds", lambda n, _: After(n), True)
    space_file = write(tmp_path, "settings: {dataset: digits, rounds: 5}\nsearch:\n  lr: {loguniform: [0.001, 0.1]}\n")
    with_rule = space_file.with_name("with.yaml")
    with_rule.write_text(space_file.read_text() + "stop: {after: 2}\n")
    with pytest.raises(UserError, match=r"stop\.after is unknown; stop may hold grace, patience, max_total_rounds"):
        load_space(with_rule, "fedavg")
    stopping.STOPPING_RULES["after"] = toy
    try:
        space = load_space(with_rule, "fedavg")
        assert space.stop.rules == {"after": 2}
        built = search_stage(space, tmp_path / "sweep", None, restoring=True).stopper
        assert built("t", {"round": 2}) and not built("t", {"round": 1})  # the toy rule's, at its value
        assert seeds_stage(space, {}, 2, False).stopper is None  # it bounds the search alone
        with_rule.write_text(space_file.read_text() + "stop: {after: 0}\n")
        with pytest.raises(UserError, match="after"):
            load_space(with_rule, "fedavg")
    finally:
        del stopping.STOPPING_RULES["after"]
