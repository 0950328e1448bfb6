import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

import pandas as pd
import pytest
import simulations
import torch
import yaml
from simulations import EXACT, assert_equal_states, exact_config, reference_run, run_rounds
from torch import nn

from algorithms import METHODS
from tuner.data.datasets import DEBIAN_FMNIST
from tuner.data.partition import parse_partition
from tuner.engine.compile import CUDA_COMPILE_ROUNDS
from tuner.engine.draws import batch_schedule, sample_cohort
from tuner.errors import UserError
from tuner.federated_run import build_simulation
from tuner.models import BACKBONES, Backbone
from tuner.settings.config import RunConfig, auto_executor

ROOT = Path(__file__).resolve().parents[1]


def digits(method, **kw):
    """Uneven clients (dir:0.3), partial participation drawn each round, a validation split."""
    return simulations.digits(method, **{"partition": "dir:0.3", "join_ratio": "0.5-1", "val_frac": 0.2, **kw})


# In float64, so rounding (batched and single kernels round differently, and chaotic ablations
# amplify float32's 1e-7 to 1e-3 in two rounds) stays near 1e-14 and can never pass for a real
# mismatch (a wrong tensor or a missed step: 1e-2 and more).


# on one xdist worker: each method's sequential run made once (simulations.reference_run)
@pytest.mark.xdist_group("reference_runs")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_vectorized_equals_sequential(method):
    seq = reference_run(method)
    assert not seq.drew_globally  # a draw from torch's generator would differ on a GPU (vmap refuses one outright)
    vec, vec_rows = run_rounds(exact_config(method, executor="vectorized"), 2)
    assert_equal_states(seq, vec)
    for a, b in zip(seq.history, vec_rows, strict=True):
        assert a["clients"] == b["clients"]
        for key in ("acc", "acc_std", "val_acc", "train_loss", "test_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key


def test_fedpacs_protocol_is_equal_under_both_executors():  # momentum and weight decay
    run = {"protocol": "fedpac", "backbone": "mlp", "dtype": "float64"}
    seq, _ = run_rounds(digits("fedavg", executor="sequential", **run), 2)
    vec, _ = run_rounds(digits("fedavg", executor="vectorized", **run), 2)
    assert_equal_states(seq, vec)


def test_a_hook_that_hands_back_the_servers_tensors_gives_each_client_a_copy_to_train():
    # FedAS's begin_local returns the server's body: vmap hands it back expanded over the cohort (for one client,
    # the server's tensor itself), and training in place once wrote every client's steps into one shared body
    run = {"join_ratio": "0.5", "dtype": "float64", "rounds": 2}
    seq, _ = run_rounds(digits("fedas", executor="sequential", **run), 2)
    vec, _ = run_rounds(digits("fedas", executor="vectorized", **run), 2)
    assert_equal_states(seq, vec)
    assert len(set(seq.clients["as.fim"].tolist())) > 2  # the round's clients trained bodies of their own


def assert_same_clients(a, b):
    for k in a.clients:
        torch.testing.assert_close(b.clients[k], a.clients[k], **EXACT)


@pytest.mark.slow
def test_batchnorm_statistics_stay_per_client_under_both_executors():
    # Three steps per client: over more, a ResNet on 8x8 inputs (1x1 maps, BatchNorm over 10 values)
    # amplifies float rounding chaotically, though single gradients agree to 1e-6.
    # (no evaluation: the states are compared, and evaluating twelve clients' ResNets was a fifth of the time)
    cfg = dict(
        clients=12,
        join_ratio="0.25",
        backbone="resnet18",
        partition="iid",
        lr=0.01,
        batch_size=30,
        cohort_chunk=2,
        dtype="float64",
        eval_gap=2,
    )
    seq, _ = run_rounds(digits("fedper", executor="sequential", **cfg), 1)
    vec, _ = run_rounds(digits("fedper", executor="vectorized", **cfg), 1)
    assert_same_clients(seq, vec)
    stats = [k for k in seq.clients if k.endswith("running_mean")]
    assert stats and "body.bn1.running_mean" not in seq.server  # statistics are never aggregated
    means = seq.clients[stats[0]]
    trained = [i for i in range(12) if means[i].abs().sum() > 0]  # statistics move only where a client trained
    assert len(trained) == 3 and not torch.equal(means[trained[0]], means[trained[1]])


@pytest.mark.parametrize("method", sorted(name for name, cls in METHODS.items() if not cls.family))
def test_every_method_trains_with_batchnorm_under_vmap_with_statistics_per_client(method):
    # Round 2 is where anything uploaded in round 1 comes back (FedCP once failed there). ResNet-18 itself
    # runs under both executors in the tests around this one; here each method meets BatchNorm.
    cfg = dict(
        clients=6,
        join_ratio="0.5",
        backbone="tiny_batchnorm",
        partition="iid",
        lr=0.01,
        batch_size=30,
        rounds=2,
        val_frac=0.0,
        eval_gap=2,
    )
    sim = build_simulation(digits(method, executor="vectorized", **cfg))
    statistics = lambda: {k: v.clone() for k, v in sim.server.items() if sim.method.net.is_buffer(k)}  # noqa: E731
    before = statistics()  # a method may keep models with their statistics on the server (HypCluster's clusters)
    rows = [sim.step() for _ in range(2)]
    assert all(math.isfinite(r["train_loss"]) for r in rows) and "acc" not in rows[0] and 0 <= rows[1]["acc"] <= 1
    after = statistics()
    # ... but never aggregates them
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in after)
    means = [k for k in sim.clients if k.endswith("running_mean")]
    assert any(len({tuple(v.flatten().tolist()) for v in sim.clients[k]}) > 1 for k in means)  # each client's own


def test_fedcp_keeps_batchnorm_statistics_per_client_under_both_executors():
    # FedCP evaluates the frozen global model with each client's own statistics (BatchNorm in body and
    # head); round 2 is where uploaded statistics would come back from the server and break vmap.
    cfg = dict(
        clients=12,
        join_ratio="0.25",
        backbone="tiny_batchnorm",
        partition="iid",
        lr=0.01,
        batch_size=30,
        cohort_chunk=2,
        dtype="float64",
    )
    seq, _ = run_rounds(digits("fedcp", executor="sequential", **cfg), 2)
    vec, _ = run_rounds(digits("fedcp", executor="vectorized", **cfg), 2)
    assert_same_clients(seq, vec)
    assert not [k for k in seq.server if "running_" in k or "num_batches" in k]
    means = seq.clients["body.2.running_mean"]
    trained = [i for i in range(12) if not torch.equal(means[i], torch.zeros_like(means[i]))]
    assert len(trained) >= 3 and len({tuple(means[i].tolist()) for i in trained}) == len(trained)


def test_pfedhn_refuses_a_backbone_whose_hypernetwork_would_not_fit_in_one_sentence():
    # a linear head per tensor
    with pytest.raises(UserError, match="pFedHN's hypernetwork would need 11[0-9][0-9] million weights"):
        build_simulation(digits("pfedhn", backbone="resnet18", partition="iid"))


@pytest.mark.slow
@pytest.mark.skipif(not DEBIAN_FMNIST.exists(), reason="Debian's dataset-fashion-mnist is not installed")
def test_vectorized_equals_sequential_with_cnn4_on_fmnist():
    cfg = dict(
        dataset="fmnist",
        partition="pac:20",
        clients=5,
        pac_train=60,
        pac_test=30,
        backbone="cnn4",
        lr=0.01,
        val_frac=0.0,
        dtype="float64",
        engine="eager",
    )  # the executors' equality on the reference engine (auto would compile a 100-round cnn4 run)
    seq, _ = run_rounds(digits("fedavg", executor="sequential", **cfg), 2)
    vec, _ = run_rounds(digits("fedavg", executor="vectorized", **cfg), 2)
    assert_same_clients(seq, vec)


def test_randomness_is_a_function_of_seed_round_and_client():
    assert sample_cohort(0, 5, 20, (0.5, 0.5)) == sample_cohort(0, 5, 20, (0.5, 0.5))
    assert len(sample_cohort(0, 5, 20, (0.5, 0.5))) == 10
    sizes = {len(sample_cohort(0, r, 20, (0.5, 1.0))) for r in range(30)}
    assert min(sizes) >= 10 and max(sizes) <= 20 and len(sizes) > 3
    s = batch_schedule(0, 1, 0, 3, n=47, batch=10, epochs=2)
    assert s.shape == (8, 10)  # the partial batch is dropped each epoch
    assert sorted(s[:4].flatten().tolist()) == sorted(set(s[:4].flatten().tolist()))
    assert not torch.equal(s, batch_schedule(0, 2, 0, 3, n=47, batch=10, epochs=2))


@pytest.mark.slow
def test_exact_resume_in_a_new_process(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    common = [
        "fedrep",
        "--dataset",
        "digits",
        "--partition",
        "pat:2",
        "--clients",
        "5",
        "--set",
        "join_ratio=0.6-1",
        "--set",
        "checkpoint_every=1",
    ]
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    assert CliRunner().invoke(app, ["run", *common, "--rounds", "4", "--out", str(straight)]).exit_code == 0
    assert CliRunner().invoke(app, ["run", *common, "--rounds", "2", "--out", str(halves)]).exit_code == 0
    resumed = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "run", "fedrep", "--resume", "--rounds", "4", "--out", str(halves)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    a, b = pd.read_parquet(straight / "metrics.parquet"), pd.read_parquet(halves / "metrics.parquet")
    assert list(b["round"]) == [1, 2, 3, 4]
    pd.testing.assert_frame_equal(a.drop(columns="time_s"), b.drop(columns="time_s"))
    sa, sb = torch.load(straight / "checkpoint.pt"), torch.load(halves / "checkpoint.pt")
    for k in sa["clients"]:
        assert torch.equal(sa["clients"][k], sb["clients"][k]), k


def test_fedavg_learns_on_digits():
    _, rows = run_rounds(RunConfig(method="fedavg", dataset="digits", partition="iid", clients=5, lr=0.05), 5)
    assert rows[-1]["acc"] > 0.6  # chance is 0.1
    assert rows[-1]["best_acc"] == max(r["acc"] for r in rows)


def test_fedper_beats_fedavg_on_pathological_digits():
    cfg = dict(dataset="digits", partition="pat:2", clients=10, lr=0.05)
    _, fedavg = run_rounds(RunConfig(method="fedavg", **cfg), 5)
    _, fedper = run_rounds(RunConfig(method="fedper", **cfg), 5)
    assert fedper[-1]["best_acc"] > fedavg[-1]["best_acc"] + 0.1
    assert fedper[-1]["best_acc"] > 0.8


def test_fedavg_ft_fine_tunes_copies_only():
    sim = build_simulation(RunConfig(method="fedavg_ft", dataset="digits", partition="pat:2", clients=4, lr=0.05))
    sim.step()
    before = {k: v.clone() for k, v in sim.clients.items()}
    sim.evaluate()
    assert all(torch.equal(before[k], sim.clients[k]) for k in before)
    for k in sim.server:  # every client holds the global model; fine-tuning never touches it
        assert torch.equal(sim.clients[k][0], sim.server[k])


def test_out_of_memory_halves_the_chunk_and_runs_every_client_once():
    sim = build_simulation(digits("fedavg", clients=8))
    executor = sim.executor
    done = []

    def run_chunk(part):
        if len(part) > 2:
            raise torch.cuda.OutOfMemoryError("simulated")
        done.extend(part)

    executor.chunked(8, run_chunk)  # tries 8, then 4, then settles on 2
    assert done == list(range(8)) and executor.settings.cohort_chunk == 2


def test_chunked_cohorts_equal_the_sequential_reference():
    seq, seq_rows = run_rounds(digits("fedrep", executor="sequential", clients=7, dtype="float64"), 2)
    vec, vec_rows = run_rounds(digits("fedrep", executor="vectorized", clients=7, cohort_chunk=3, dtype="float64"), 2)
    assert_equal_states(seq, vec)
    assert vec_rows[-1]["acc"] == pytest.approx(seq_rows[-1]["acc"])


def test_executor_auto_is_vectorized_on_a_gpu_and_for_small_batches_and_sequential_for_large_batches_on_a_cpu():
    resolved = lambda **kw: RunConfig(method="fedavg", dataset="digits", **kw).resolved().executor  # noqa: E731
    assert resolved(device="cpu") == "vectorized"  # GPFL's batch of 10
    assert resolved(device="cpu", protocol="fedpac") == "sequential"  # FedPAC's batch of 50
    # (resolving device=cuda needs a GPU)
    assert auto_executor("cuda", 50) == auto_executor("cuda:1", 10) == "vectorized"
    # a choice overrides the rule
    assert resolved(device="cpu", protocol="fedpac", executor="vectorized") == "vectorized"


def test_engine_auto_compiles_for_runs_long_enough_to_repay_it_and_on_a_gpu_only_what_was_checked_there():
    from tuner.engine.compile import CPU_COMPILE_ROUNDS, CUDA_CHECKED, auto_engine, engine_for

    # checked on CUDA on the MLP, its break-even not measured there: the largest measured one
    largest = max(CUDA_COMPILE_ROUNDS.values())
    assert auto_engine("cuda", largest, "mlp", "gpfl") == auto_engine("cuda:1", largest, "mlp", "feddbe") == "compiled"
    assert auto_engine("cuda", largest - 1, "mlp", "gpfl") == "eager"
    assert auto_engine("cuda", 2000, "resnet18", "fedper") == "compiled"
    # a backbone is another program: GPFL's cnn4 has a break-even but no equality check on CUDA yet, so eager;
    # once checked it compiles from its own break-even
    assert ("gpfl", "cnn4") not in CUDA_CHECKED and auto_engine("cuda", 2000, "cnn4", "gpfl") == "eager"
    assert {auto_engine("cuda", 2000, "resnet18", m) for m in ("gpfl", "fedavg")} == {"eager"}
    with patch("tuner.engine.compile.CUDA_CHECKED", CUDA_CHECKED | {("gpfl", "cnn4")}):
        gpfl = CUDA_COMPILE_ROUNDS["gpfl", "cnn4"]
        assert auto_engine("cuda", gpfl, "cnn4", "gpfl") == "compiled" != auto_engine("cuda", gpfl - 1, "cnn4", "gpfl")
    # failed on CUDA (pFedMe, FedDyn), or never checked there (FedBABU)
    assert {auto_engine("cuda", 2000, "mlp", m) for m in ("pfedme", "feddyn", "fedbabu")} == {"eager"}
    # a family that fails upstream runs eager on CUDA even when compiling is asked for, and says why
    assert engine_for("compiled", "cuda", 10, "mlp", "pfedme-official", "pfedme") == "eager"
    assert engine_for("compiled", "cpu", 10, "mlp", "pfedme-official", "pfedme") == "compiled"
    assert engine_for("eager", "cuda", 2000, "mlp", "gpfl", "gpfl") == "eager"
    mlp = CPU_COMPILE_ROUNDS["mlp"]
    assert (
        auto_engine("cpu", mlp - 1, "mlp", "gpfl") == "eager" and auto_engine("cpu", mlp, "mlp", "fedpac") == "compiled"
    )
    cfg = RunConfig(method="fedavg", dataset="digits", rounds=20).resolved()
    assert cfg.engine == "eager" and "engine: eager" in cfg.to_yaml()  # config.yaml says what ran
    assert RunConfig(method="fedavg", dataset="digits", rounds=2000).resolved().engine == "compiled"
    # a cnn4 round repays it sooner
    assert RunConfig(method="fedavg", dataset="fmnist", backbone="cnn4", rounds=100).resolved().engine == "compiled"
    assert RunConfig(method="fedavg", dataset="digits", engine="compiled").resolved().engine == "compiled"


H200_SPEED = ROOT / "results/gpu/check-h200-7a0cf86/speed/campaign.json"


def test_the_rounds_from_which_auto_compiles_on_cuda_are_the_committed_gpu_figures():
    """Each measured method's first round (compiling) over what a compiled round saves, from the H200 speed stage
    at 7a0cf86, where every timed round of all four compiled nothing."""
    run = json.loads(H200_SPEED.read_text())
    figures = run["speed"]["figures"]
    assert run["environment"]["commit"] == "7a0cf86" and {f["recompiles"] for f in figures.values()} == {0}
    backbone = {"fedpac": "pac_cnn"}  # the others ran cnn4 (bench/engine_speed.py's Table 1 settings)
    repaid = {
        (m, backbone.get(m, "cnn4")): math.ceil(
            f["compile + first round s"] / (f["eager s/round"] - f["compiled s/round"])
        )
        for m, f in figures.items()
    }
    assert CUDA_COMPILE_ROUNDS == repaid
    # ... and the page that quotes them quotes them, and the first H100 figures
    h100 = json.loads((ROOT / "results/gpu/compiled-engine-b9d680f/figures.json").read_text())["methods"]
    gpfl, fedavg, fedcp = h100["gpfl"], h100["fedavg"], h100["fedcp"]
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    assert (
        f"GPFL {gpfl['eager s/round']} s a round eager against {gpfl['compiled s/round']} compiled "
        f"({gpfl['compile + first round s']} s compiling "
        f"the first round, {gpfl['programs']} programs; a second trial {gpfl['second trial programs']} "
        f"programs); FedAvg {fedavg['eager s/round']}–"
        f"{fedavg['eager s/round, slowest measured']} against {fedavg['compiled s/round']} and FedCP "
        f"{fedcp['eager s/round']} against "
        f"{fedcp['compiled s/round']}"
    ) in performance
    assert (
        f"GPFL {repaid['gpfl', 'cnn4']} rounds, FedCP {repaid['fedcp', 'cnn4']}, FedAvg "
        f"{repaid['fedavg', 'cnn4']}, all on cnn4, "
        f"and FedPAC {repaid['fedpac', 'pac_cnn']} on its CNN"
    ) in performance


def test_the_rounds_from_which_auto_compiles_on_a_cpu_are_the_committed_bench_figures():
    """GPFL's first round from an empty compile cache over what a compiled round saves, a backbone each: the MLP in
    the small setting (digits), cnn4 in Table 1's; every timed round compiled nothing."""
    from tuner.engine.compile import CPU_COMPILE_ROUNDS

    repaid, figures = {}, {}
    for backbone in ("mlp", "cnn4"):
        run = json.loads((ROOT / f"results/bench/compile-rounds-cpu-{backbone}.json").read_text())
        f = run["figures"]["gpfl"]
        assert run["machine"].startswith("CPU") and f["recompiles"] == 0 and f["programs"] > 0
        assert ("--set backbone=mlp" in run["command"]) == (backbone == "mlp")
        repaid[backbone] = math.ceil(f["compile + first round s"] / (f["eager s/round"] - f["compiled s/round"]))
        figures[backbone] = f
    assert CPU_COMPILE_ROUNDS == repaid
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    assert f"`mlp` {repaid['mlp']} rounds and `cnn4` {repaid['cnn4']}" in performance
    m, c = figures["mlp"], figures["cnn4"]
    assert (
        f"the MLP's digits round is {m['eager s/round']:.3f} s eager and {m['compiled s/round']:.3f} compiled after "
        f"{m['compile + first round s']:.0f} s of compiling, cnn4's Table 1 round {c['eager s/round']:.1f} s eager "
        f"and {c['compiled s/round']:.1f} compiled after {c['compile + first round s']:.0f} s"
    ) in performance


def test_the_pages_state_autos_rule_and_the_gpu_sharing_figures_as_the_code_and_the_committed_campaign():
    from tuner.engine.compile import CPU_COMPILE_ROUNDS, CUDA_CHECKED
    from tuner.sweep.cluster import TRIALS_PER_GPU

    flat = lambda page: " ".join((ROOT / page).read_text().split())  # noqa: E731
    on_mlp = {m for m, backbone in CUDA_CHECKED if backbone == "mlp"}
    assert CUDA_CHECKED - {(m, "mlp") for m in on_mlp} == {("fedper", "resnet18")}
    assert not {backbone for _, backbone in CUDA_CHECKED} & {"cnn4", "pac_cnn"}
    assert (
        f"on a CPU from {CPU_COMPILE_ROUNDS['cnn4']} rounds on cnn4 and {CPU_COMPILE_ROUNDS['mlp']} on the "
        "MLP; on CUDA only for the methods and backbones checked there to compile and equal the CPU reference "
        f"({len(on_mlp)} methods on the MLP and FedPer on ResNet-18; none yet on cnn4 or FedPAC's CNN), else eager"
    ) in flat("docs/running.md")
    rates = json.loads((ROOT / "results/gpu/campaign-h100/campaign.json").read_text())["sharing"]["rounds_per_second"]
    assert TRIALS_PER_GPU == len(rates) == 2 and rates["2"] > 1.9 * rates["1"]
    assert f"ran {rates['2']:.2f} rounds/s together against {rates['1']:.2f} for one" in flat("docs/sweeps.md")


def test_a_runs_nonzero_floats_are_tensor_inputs_and_zeros_ints_and_switches_stay_static():
    sim = build_simulation(digits("gpfl", dtype="float64", hparams=dict(lam=0.0, mu=0.3)))
    hp, training = sim.method.hp, sim.method.training
    assert isinstance(hp.mu, torch.Tensor) and hp.mu.dtype == torch.float64 and hp.mu.dim() == 0 and hp.mu.item() == 0.3
    assert hp.lam == 0.0 and type(hp.lam) is float and hp.pci is True  # zero switches L_mlg off statically
    assert isinstance(training.lr, torch.Tensor) and training.lr.item() == 0.05 and training.momentum == 0.0
    assert type(training.batch_size) is int and type(training.rounds) is int
    # the simulation reads a copy: the method and the frozen hyperparameters it was handed stay as they were
    from tuner.engine.simulation import Simulation
    from tuner.federated_run import build_method

    plan = digits("gpfl", dtype="float64", hparams=dict(lam=0.0, mu=0.3)).resolved()
    method = build_method(plan, sim.data)
    again = Simulation(method, sim.data, sim.settings)
    assert type(method.hp.mu) is float and type(method.training.lr) is float
    assert isinstance(again.method.hp.mu, torch.Tensor) and again.method is not method


# the first program to fail: a statistics pass's, a training step's
@pytest.mark.parametrize("method", ["gpfl", "fedrep"])
def test_a_program_that_cannot_be_compiled_leaves_the_run_to_eager_and_says_so_where_results_are(
    method, monkeypatch, capsys, tmp_path
):
    """Tried under each Inductor configuration once, then eager: the same numbers, one line each, every round's
    `engine` column and config.yaml (what a resume runs) saying what ran."""
    from torch._dynamo.exc import TorchDynamoException

    import tuner.engine.compile
    from tuner.federated_run import run

    attempts = []

    def no_compiler(fn, device, config):
        def fails(*args):
            attempts.append(fn)
            raise TorchDynamoException("no working C++ compiler")

        return fails

    monkeypatch.setattr(tuner.engine.compile, "compile_program", no_compiler)
    cfg = digits(method, dtype="float64", executor="vectorized", rounds=2)
    sim = run(replace(cfg, engine="compiled").resolved(), tmp_path / "run")
    reference, reference_rows = run_rounds(replace(cfg, engine="eager"), 2)
    assert_equal_states(reference, sim)
    assert [r["acc"] for r in sim.history] == [r["acc"] for r in reference_rows]
    assert "no working C++ compiler" in sim.executor.ran.failed and sim.executor.ran.compiled_steps == 0
    assert list(pd.read_parquet(tmp_path / "run/metrics.parquet")["engine"]) == ["eager", "eager"]
    assert RunConfig(**yaml.safe_load((tmp_path / "run/config.yaml").read_text())).engine == "eager"
    name, hook = type(sim.method).__name__, "statistics" if method == "gpfl" else "steps"
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert lines == [
        f"Compiling {name}'s {hook} failed under torch's default Inductor configuration "
        "(TorchDynamoException: no working C++ compiler); "
        "compiling again with loop ordering after fusion off.",
        f"Compiling {name}'s programs failed (TorchDynamoException: no working C++ compiler); the run goes on "
        "with engine=eager.",
    ]
    assert len(attempts) == len(tuner.engine.compile.INDUCTOR_CONFIGS)  # once each, never again


def test_deterministic_algorithms_follow_each_runs_setting():
    build_simulation(digits("fedavg", deterministic=True))
    assert torch.are_deterministic_algorithms_enabled()
    build_simulation(digits("fedavg"))
    assert not torch.are_deterministic_algorithms_enabled()


# --- the method contract
def test_a_methods_passes_are_read_from_the_hooks_it_defines_and_sums_with_nowhere_to_go_are_refused():
    from algorithms import METHODS
    from algorithms.base import Method
    from algorithms.rounds import Passes

    hook = lambda self, client, server, stats, at: client  # noqa: E731
    stats = lambda self, state, server, x, y, w: {}  # noqa: E731
    assert type("Plain", (Method,), {}).passes == Passes()
    assert type("Local", (Method,), {"shared": ()}).passes == Passes(upload=False)
    assert type("Begins", (Method,), {"begin_local": hook, "statistics": stats}).passes == Passes(
        begin_local=True, statistics_before=True
    )
    both = type("Both", (Method,), {"begin_local": hook, "end_local": hook, "statistics": stats}).passes
    assert both == Passes(begin_local=True, end_local=True, statistics_before=True, statistics_after=True)  # FedPAC
    trained = type("Trained", (Method,), {"end_local": hook, "trained_statistics": stats}).passes
    assert trained == Passes(end_local=True, statistics_after=True, trained_statistics=True)  # FedAS
    assert METHODS["fedpac"].passes == both and METHODS["fedas"].passes.trained_statistics
    with pytest.raises(TypeError, match="defines statistics but neither begin_local nor end_local"):
        type("Counting", (Method,), {"statistics": stats})
    with pytest.raises(TypeError, match="defines trained_statistics but not end_local"):
        type("Orphan", (Method,), {"trained_statistics": stats})
    with pytest.raises(TypeError, match="declares its passes, which are read from the hooks it defines"):
        type("Declared", (Method,), {"passes": Passes(begin_local=True), "begin_local": hook})


def test_hooks_receive_the_round_with_each_clients_samples_and_steps(monkeypatch):
    sim = build_simulation(digits("scaffold", rounds=3, batch_size=20, local_epochs=2))
    seen = {}
    aggregate = sim.method.aggregate
    monkeypatch.setattr(
        sim.method,
        "aggregate",
        lambda server, uploads, at: seen.setdefault(at.number, at) and aggregate(server, uploads, at),
    )
    sim.step()
    sim.step()
    at = seen[2]
    counts = [sim.data.train.counts[i] for i in at.clients.tolist()]
    assert at.total == 3 and at.samples.tolist() == counts
    assert at.steps.tolist() == [2 * (n // 20) for n in counts]  # every epoch's full batches
    assert at.client(1).clients == at.clients[1] and at.client(1).steps.dim() == 0


def test_the_sequential_executor_names_the_hook_round_and_client_of_a_failure(monkeypatch):
    from tuner.engine.executors import MethodFailed

    sim = build_simulation(digits("fedavg", executor="sequential", join_ratio="1"))

    def failing(state, server, x, y):
        raise ValueError("a bug in the method")

    monkeypatch.setattr(sim.method, "loss", failing)
    with pytest.raises(MethodFailed, match=r"FedAvg\.loss failed in round 1 for client [0-5]: a bug in the method"):
        sim.step()


def test_a_configuration_is_planned_once_with_its_device_decided_and_a_plan_is_never_replaced():
    cfg = RunConfig(method="fedavg", dataset="digits", partition="dir:0.3", join_ratio="0.5-1").resolved()
    assert cfg.resolved() is cfg and cfg.device == "cpu" and cfg.executor == "vectorized" and cfg.lr == 0.005
    assert cfg.split == ("dir", 0.3) and cfg.join == (0.5, 1.0)
    with pytest.raises(TypeError, match="change its settings"):
        replace(cfg, lr=0.1)  # a plan changed by hand would keep its parsed partition and checks
    again = replace(cfg.settings(), lr=0.1, partition="pat:2")  # the settings changed are planned anew
    assert type(again) is RunConfig and again.resolved().lr == 0.1 and again.resolved().split == ("pat", 2.0)
    assert "split" not in cfg.to_yaml() and yaml.safe_load(cfg.to_yaml()) == yaml.safe_load(cfg.settings().to_yaml())


def test_a_run_and_a_sweep_trial_parse_their_partition_and_join_ratio_once(tmp_path, monkeypatch):
    """Planned once at the edge (`tuner run`, a trial's settings), then read from the plan by everything after."""
    from cli_runs import invoke

    import tuner.settings.config as config
    from tuner.sweep.trials import trial_config

    parsed = []
    monkeypatch.setattr(config, "parse_partition", lambda text: parsed.append(text) or parse_partition(text))
    monkeypatch.setattr(config.RunConfig, "join_range", lambda self: parsed.append(self.join_ratio) or (0.5, 1.0))
    res = invoke("run", "fedavg", "--dataset", "digits", "--clients", "4", "--rounds", "1", "--out", tmp_path / "r")
    assert res.exit_code == 0 and parsed == ["dir:0.1", "1"], (parsed, res.output)
    parsed.clear()
    base = {"method": "fedavg", "dataset": "digits", "clients": 4, "rounds": 1}
    plan = trial_config(base, {"lr": 0.01}, worker_rounds=100)
    build_simulation(plan).step()
    assert parsed == ["dir:0.1", "1"] and plan.engine == "eager"
    # the worker's rounds, not the trial's one, decide auto's engine: 1000 repay compiling the mlp on a CPU
    assert trial_config(base, {"lr": 0.01}, worker_rounds=1000).engine == "compiled"


# --- randomness is part of the method contract
def test_a_drawing_methods_trajectory_ignores_torchs_generators_and_its_noise_matters():
    straight, _ = run_rounds(exact_config("fedcp-gumbel", executor="vectorized"), 2)
    perturbed = build_simulation(exact_config("fedcp-gumbel", executor="vectorized"))
    for r in range(2):
        torch.manual_seed(1234 + r)  # what another run in the process, or a library, would do to the global streams
        perturbed.step()
    assert_equal_states(straight, perturbed)
    softmax, _ = run_rounds(exact_config("fedcp", executor="vectorized"), 2)
    # the Gumbel noise was drawn
    assert not torch.allclose(softmax.clients["cpn.0.weight"], straight.clients["cpn.0.weight"])


def test_keyed_noise_is_a_function_of_key_and_position_alone():
    from algorithms.common import gumbel, uniform

    key = torch.tensor(12345)
    u = uniform(key, (4000,), torch.float64)
    assert torch.equal(u, uniform(key, (4000,), torch.float64)) and 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.02 and abs(u.var().item() - 1 / 12) < 0.01  # uniform's moments
    assert not torch.equal(u, uniform(torch.tensor(12346), (4000,), torch.float64))
    keys = torch.tensor([7, 8, 9])
    looped = torch.stack([gumbel(k, (5, 2), torch.float64) for k in keys])
    # vmap draws what a loop draws
    assert torch.equal(torch.vmap(lambda k: gumbel(k, (5, 2), torch.float64), randomness="error")(keys), looped)
    g = gumbel(key, (20000,), torch.float64)
    assert abs(g.mean().item() - 0.5772) < 0.03  # the Euler-Mascheroni constant: Gumbel(0, 1)'s mean


def test_a_backbone_that_draws_is_refused_under_vmap(monkeypatch):
    def dropout_mlp(input_shape, num_classes):
        body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 16), nn.Dropout(0.5))
        return Backbone(body, nn.Linear(16, num_classes), 16)

    monkeypatch.setitem(BACKBONES, "dropout_mlp", dropout_mlp)
    sim = build_simulation(digits("fedavg", executor="vectorized", backbone="dropout_mlp"))
    with pytest.raises(
        UserError, match=r"FedAvg\.loss draws random numbers from torch's generator \(a Dropout in the backbone\?\)"
    ):
        sim.step()
