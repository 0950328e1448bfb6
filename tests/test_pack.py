"""A pack (tuner/engine/pack.py): P runs of one method as one federation, each run's figures and state those it has
alone, in float64 to 1e-9 (here: to the last bit, where nothing is summed in another order)."""

import contextlib
from dataclasses import fields

import pytest
import torch
from simulations import EXACT, exact_config, run_rounds

from tuner.engine.pack import Pack
from tuner.errors import DivergedError, UserError
from tuner.federated_run import build_simulation
from tuner.packed_run import planned_pack
from tuner.plugins import method_class

FIGURES = ("acc", "acc_std", "val_acc", "train_loss", "test_loss", "best_acc")

# one method a family of what a pack keeps apart: the optimizer's numbers, batch norm statistics, keyed noise, partial
# batches and training on receipt, a held-out split and per-client server slots, a server written in Python (QP),
# tensors drawn at build, a datastore, fine-tuning before evaluation, carried tensors, batched statistics, a server
# optimizer, a phase's own lr, parameter groups' lrs, a server that trains from its seed
FAMILIES = [
    "fedavg",
    "fedbn",
    "fedcp-gumbel",
    "fedala",
    "fedfomo",
    "fedamp",
    "fedpac",
    "gpfl-nopci",
    "knn-per",
    "fedavg_ft",
    "feddbe",
    "fedas",
    "fedadam",
    "ditto",
    "apple",
    "fedgen",
]


def halved(method: str) -> dict:
    """Every nonzero float hyperparameter of the method at half its default: a second run's own numbers."""
    defaults = method_class(method).Hparams()
    return {
        f.name: getattr(defaults, f.name) / 2
        for f in fields(defaults)
        if type(getattr(defaults, f.name)) is float and getattr(defaults, f.name)
    }


def runs_of(method: str, **kw) -> list:
    """Two runs of one method apart in their seed, lr, momentum, weight decay and every float hyperparameter."""
    first = exact_config(method, momentum=0.9, weight_decay=1e-3, **kw)
    second = exact_config(
        method, seed=3, lr=0.1, momentum=0.5, weight_decay=1e-2, hparams={**first.hparams, **halved(method)}, **kw
    )
    return [first, second]


def assert_pack_equals_alone(cfgs: list, rounds: int = 2) -> Pack:
    _, pack = planned_pack(cfgs)
    packed = [pack.step() for _ in range(rounds)]
    for r, cfg in enumerate(cfgs):
        alone, rows = run_rounds(cfg, rounds)
        for t, row in enumerate(rows):
            assert packed[t][r]["clients"] == row["clients"]
            for key in FIGURES:
                assert packed[t][r][key] == pytest.approx(row[key], rel=1e-9, abs=1e-12), (r, t, key)
        state = pack.state_dict(r)
        for part, own in (("clients", alone.clients), ("server", alone.server)):
            assert state[part].keys() == own.keys()
            for k, v in own.items():
                torch.testing.assert_close(state[part][k], v.cpu(), **EXACT)
    return pack


@pytest.mark.parametrize("method", FAMILIES)
def test_a_packed_run_equals_the_run_alone(method):
    assert_pack_equals_alone(runs_of(method))


@pytest.mark.parametrize("kw", [{"executor": "sequential"}, {"cohort_chunk": 3}, {"augment": True}])
def test_a_pack_equals_its_runs_on_either_executor_chunked_and_augmented(kw):
    assert_pack_equals_alone(runs_of("ditto", **kw))


def test_runs_whose_numbers_leak_into_each_other_fail_the_check(monkeypatch):
    """The check can fail: a pack whose rows all read run 0's numbers is caught."""
    monkeypatch.setattr(
        "tuner.engine.packed_method.PackedHooks.pack_reading", lambda self, numbers: contextlib.nullcontext()
    )
    with pytest.raises(AssertionError):
        assert_pack_equals_alone(runs_of("fedprox"))


def test_three_seeds_pack_and_each_keeps_its_own_state():
    cfgs = [exact_config("gpfl", seed=s) for s in (0, 1, 2)]
    pack = assert_pack_equals_alone(cfgs, rounds=1)
    assert len({pack.histories[r][0]["acc"] for r in range(3)}) == 3


def test_runs_that_are_not_one_program_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="mu is 0 in some runs and not in others"):
        planned_pack([exact_config("fedprox"), exact_config("fedprox", hparams={"mu": 0.0})])
    with pytest.raises(ValueError, match="one after another"):
        planned_pack([exact_config("pfedhn"), exact_config("pfedhn", seed=1)])
    with pytest.raises(UserError, match="differ in.*batch_size"):
        planned_pack([exact_config("fedavg"), exact_config("fedavg", batch_size=20)])


def test_a_packed_runs_checkpoint_resumes_it_alone_and_back():
    """A run's state out of a pack is its Simulation's, so it resumes alone; and alone's loads into a pack."""
    cfgs = runs_of("fedprox")
    _, pack = planned_pack(cfgs)
    pack.step()
    alone, rows = run_rounds(cfgs[1], 2)
    resumed = build_simulation(cfgs[1])
    resumed.load_state_dict(pack.state_dict(1))
    assert resumed.step()["acc"] == pytest.approx(rows[1]["acc"], rel=1e-9)
    _, again = planned_pack(cfgs)
    for r in range(2):
        again.load_state_dict(r, pack.state_dict(r))
    assert again.step()[1]["acc"] == pytest.approx(rows[1]["acc"], rel=1e-9)


def test_a_run_that_diverges_in_a_pack_says_what_it_says_alone_and_the_others_go_on():
    cfgs = [exact_config("fedavg", dtype="float32"), exact_config("fedavg", seed=1, lr=1e6, dtype="float32")]
    with pytest.raises(DivergedError) as alone:
        run_rounds(cfgs[1], 2)
    _, pack = planned_pack(cfgs)
    rows = [pack.step() for _ in range(2)]
    said = [r[1]["diverged"] for r in rows if "diverged" in r[1]]
    assert said[0] == str(alone.value) and len(pack.histories[1]) == 2 - len(said)
    _, steady = run_rounds(cfgs[0], 2)
    assert [r[0]["acc"] for r in rows] == [r["acc"] for r in steady]


def test_the_packing_figures_in_the_docs_are_the_committed_benchs():
    """README's and docs/performance.md's figures of packs are results/bench/packing-digits.json's, and --pack auto
    packs nothing on a CPU while no packed sweep measured there beat today's."""
    import json
    from pathlib import Path

    from tuner.sweep.pack_host import AUTO_PACK

    root = Path(__file__).resolve().parents[1]
    run = json.loads((root / "results/bench/packing-digits.json").read_text())
    f, sweep = run["figures"], run["figures"]["sweep"]
    assert run["machine"].startswith("CPU") and run["command"].startswith("python bench/packing.py")
    performance = " ".join((root / "docs/performance.md").read_text().split())
    for setting in ("digits", "digits one core"):
        for method in ("fedavg", "gpfl"):
            g = [f"{f[setting][method][f'P={p}']['gain']:.2f}" for p in (2, 4, 8, 16)]
            assert f"{g[0]}, {g[1]}, {g[2]} and {g[3]}×" in performance, (setting, method, g)
    assert (
        f"FedAvg {f['table1']['fedavg']['P=8']['gain']:.2f}× and GPFL {f['table1']['gpfl']['P=8']['gain']:.2f}×"
        in performance
    )
    packs = [sweep[f"pack {p}"] for p in (4, 8, 16)]
    assert f"took {sweep['today']['s']:.1f} s today" in performance
    assert f"{packs[0]['s']:.1f}, {packs[1]['s']:.1f} and {packs[2]['s']:.1f} s in packs of 4, 8 and 16" in performance
    first = [sweep["today"]["first round reported s"][0], *[p["first round reported s"][0] for p in packs]]
    assert "first round reported at {:.1f} s today, {:.1f}, {:.1f} and {:.1f} s packed".format(*first) in performance
    best = f"`sweep_speedup` {f['sweep_speedup']:.2f} (packs of {f['sweep_speedup_pack']})"
    assert best in performance
    readme = " ".join((root / "README.md").read_text().split())
    assert f"made {f['digits']['fedavg']['P=8']['gain']:.2f}× one run's" in readme
    assert f"{f['digits one core']['fedavg']['P=8']['gain']:.2f}× on one core" in readme
    assert f"ran at {f['sweep_speedup']:.2f}× today's" in readme
    assert AUTO_PACK["cpu"] == 1 and f["sweep_speedup"] < 3  # the target a packed CPU sweep does not reach
