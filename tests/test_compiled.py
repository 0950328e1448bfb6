"""The compiled engine: whole training steps as torch.compile'd programs of fixed shapes, equal to the
eager reference in float64, each program compiled once in a run. Compiling costs seconds a program
on this CPU, so the methods here are the ones that exercise what a step can hold: two phases with
momentum and weight decay (FedPAC), keyed noise (FedCP-Gumbel), BatchNorm statistics, and the
sequential executor's per-client program, and what a forward carries from step to step (FedDBE)."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters


from simulations import assert_equal_states, exact_config, reference_run, run_rounds

pytestmark = pytest.mark.slow


def compiled_run(cfg, rounds):
    """A run on the compiled engine from an empty compile cache; returns it and the programs dynamo compiled."""
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    sim, rows = run_rounds(cfg, rounds)
    return sim, rows, counters["stats"]["unique_graphs"] - before


@pytest.mark.parametrize("method", ["fedpac", "fedcp-gumbel"])
def test_compiled_vectorized_steps_equal_the_sequential_reference_and_compile_each_shape_once(method):
    seq = reference_run(method)
    sim, rows, programs = compiled_run(exact_config(method, executor="vectorized", engine="compiled"), 2)
    assert_equal_states(seq, sim)
    for a, b in zip(seq.history, rows):
        assert a["acc"] == pytest.approx(b["acc"], rel=1e-9) and a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9)
    assert 1 <= programs <= sim.executor.shapes_compiled()  # per phase and padded cohort size at most, none twice
    padded = [n for step in sim.executor.compiled.values() for n, _, _ in step.masks]
    assert all(n & (n - 1) == 0 or n == len(rows[-1:]) or n == rows[-1]["clients"] for n in padded)  # powers of two, or the whole cohort


def test_a_compiled_run_compiles_nothing_after_its_shapes_are_known():
    cfg = exact_config("fedavg", executor="vectorized", engine="compiled", rounds=6, join_ratio="1")  # every round: the same cohort
    sim, _, programs = compiled_run(cfg, 2)
    before = counters["stats"]["unique_graphs"]
    for _ in range(4):
        sim.step()
    assert counters["stats"]["unique_graphs"] == before and 1 <= programs <= sim.executor.shapes_compiled()


def test_compiled_steps_keep_batchnorm_statistics_per_client():
    cfg = dict(backbone="tiny_batchnorm", join_ratio="1", batch_size=30)
    eager, _ = run_rounds(exact_config("fedper", executor="sequential", **cfg), 2)
    compiled, _, _ = compiled_run(exact_config("fedper", executor="vectorized", engine="compiled", **cfg), 2)
    assert_equal_states(eager, compiled)
    means = compiled.clients["body.2.running_mean"]
    assert len({tuple(m.tolist()) for m in means}) == len(means)  # each client's own, padded rows left as they were


def test_the_sequential_executor_compiles_one_program_a_client_calls():
    seq = reference_run("fedrep")  # two phases: head, then body
    sim, _, programs = compiled_run(exact_config("fedrep", executor="sequential", engine="compiled"), 2)
    assert_equal_states(seq, sim)
    assert programs <= sim.executor.shapes_compiled()
    assert len(sim.executor.compiled) == 2 and set(sim.executor.summing) == {"logits"}  # a step program per phase; evaluation's


def test_a_trial_with_other_numbers_compiles_nothing_new_and_runs_its_own_numbers():
    """A sweep's trials differ in lr and the method's floats: those reach the programs as inputs, so the
    second trial compiles nothing, and trains with its own numbers, not the first's (equal to eager)."""
    first = dict(executor="vectorized", join_ratio="1", clients=4, lr=0.05, hparams=dict(mu=0.01))
    compiled_run(exact_config("fedprox", engine="compiled", **first), 1)
    second = {**first, "lr": 0.03, "hparams": dict(mu=0.5)}
    before = counters["stats"]["unique_graphs"]
    sim, rows = run_rounds(exact_config("fedprox", engine="compiled", **second), 2)
    assert counters["stats"]["unique_graphs"] == before
    eager, eager_rows = run_rounds(exact_config("fedprox", engine="eager", **second), 2)
    assert_equal_states(eager, sim)
    assert rows[-1]["train_loss"] == pytest.approx(eager_rows[-1]["train_loss"], rel=1e-9)
    assert rows[-1]["acc"] == eager_rows[-1]["acc"] and set(sim.executor.summing) == {"logits"}  # evaluation is compiled too


def test_a_compiled_step_keeps_what_the_forward_carries_to_the_next_step():
    # FedDBE's running mean of features, written by each step's forward (Method.carried), as batch norm's statistics
    hp = {"hparams": {"rho": 0.5}}
    eager, _ = run_rounds(exact_config("feddbe", executor="sequential", **hp), 2)
    compiled, _, _ = compiled_run(exact_config("feddbe", executor="vectorized", engine="compiled", **hp), 2)
    assert_equal_states(eager, compiled)
    assert compiled.clients["dbe.running"].abs().sum() > 0
