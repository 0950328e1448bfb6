"""The compiled engine: whole training steps as torch.compile'd programs of fixed shapes, equal to the
eager reference in float64, each program compiled once in a run. Compiling costs seconds a program
on this CPU, so the methods here are the ones that exercise what a step can hold: two phases with
momentum and weight decay (FedPAC), keyed noise (FedCP-Gumbel), BatchNorm statistics, and the
sequential executor's per-client program, and what a forward carries from step to step (FedDBE).

Every test asserts that the compiled path ran (`assert_compiled_ran`): a run whose programs fail to compile
goes on eager and gives the same numbers, so equality alone cannot tell. `test_each_check_fails_when_compiling_fails`
runs every test of this file with compiling made to fail and requires each to fail."""

import json
from dataclasses import replace

import pytest
import torch
import torch._dynamo
import torch._functorch.config
import torch._inductor.config
import torch._inductor.scheduler
from simulations import EXACT, assert_equal_states, exact_config, reference_run, run_rounds
from torch._dynamo.utils import counters
from torch._inductor.virtualized import V

import tuner.engine.compile
from tuner.engine.compile import INDUCTOR_CONFIGS
from tuner.packed_run import planned_pack

pytestmark = pytest.mark.slow


def assert_compiled_ran(sim, rows, config: int = 0):
    """Every training step and evaluation batch of the run ran compiled (under INDUCTOR_CONFIGS[config]), none eager."""
    ran = sim.executor.ran
    assert ran.compiled_steps > 0 and ran.compiled_batches > 0, f"nothing ran compiled: {ran}"
    assert ran.eager_steps == ran.eager_batches == 0 and not ran.failed, f"the run went on eager: {ran}"
    assert ran.config == config and sim.settings.engine == "compiled"
    expected = "compiled" if config == 0 else f"compiled, {INDUCTOR_CONFIGS[config][0]}"
    assert [r["engine"] for r in rows] == [expected] * len(rows)


def compiled_run(cfg, rounds):
    """A run on the compiled engine from an empty compile cache; returns it and the programs dynamo compiled."""
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    sim, rows = run_rounds(cfg, rounds)
    assert_compiled_ran(sim, rows)
    assert sim.executor.ran.programs == counters["stats"]["unique_graphs"] - before  # the run's own count is dynamo's
    return sim, rows, counters["stats"]["unique_graphs"] - before


@pytest.mark.parametrize("method", ["fedpac", "fedcp-gumbel"])
def test_compiled_vectorized_steps_equal_the_sequential_reference_and_compile_each_shape_once(method):
    seq = reference_run(method)
    sim, rows, programs = compiled_run(exact_config(method, executor="vectorized", engine="compiled"), 2)
    assert_equal_states(seq, sim)
    for a, b in zip(seq.history, rows, strict=True):
        assert a["acc"] == pytest.approx(b["acc"], rel=1e-9) and a["train_loss"] == pytest.approx(
            b["train_loss"], rel=1e-9
        )
    assert 1 <= programs <= sim.executor.shapes_compiled()  # per phase and padded cohort size at most, none twice
    padded = [n for step in sim.executor.compiled.values() for n in step.shapes]
    # powers of two, or the whole cohort
    assert all(n & (n - 1) == 0 or n == len(rows[-1:]) or n == rows[-1]["clients"] for n in padded)


def test_a_compiled_run_compiles_nothing_after_its_shapes_are_known():
    # every round: the same cohort
    cfg = exact_config("fedavg", executor="vectorized", engine="compiled", rounds=6, join_ratio="1")
    sim, rows, programs = compiled_run(cfg, 2)
    before = counters["stats"]["unique_graphs"]
    rows += [sim.step() for _ in range(4)]
    assert_compiled_ran(sim, rows)
    assert counters["stats"]["unique_graphs"] == before and 1 <= programs <= sim.executor.shapes_compiled()


def test_compiled_steps_keep_batchnorm_statistics_per_client_in_the_same_static_tensors_every_step(monkeypatch):
    """Each client's BatchNorm statistics stay its own (padded rows left as they were), equal to eager. And CUDA
    graphs replay a step that writes into its inputs only if each written input is a tensor marked static, the
    very object (torch's CUDA-graph trees check the mark on the object handed in): the CPU shows the condition,
    every tensor a step writes (parameters, momentum, statistics) marked, the same object a size, step after
    step and round after round."""
    handed: dict[int, list] = {}
    call = tuner.engine.compile.Program.__call__

    def recording(self, params, opt_state, rest, *args):
        if self.name.endswith("steps"):
            written = [v for d in (params, opt_state) for v in d.values()] + [
                v for k, v in rest.items() if k.endswith("running_mean")
            ]
            handed.setdefault(args[-1].shape[-1], []).append(written)  # live: (steps, rows)
        return call(self, params, opt_state, rest, *args)

    monkeypatch.setattr(tuner.engine.compile.Program, "__call__", recording)
    cfg = dict(backbone="tiny_batchnorm", join_ratio="1", batch_size=30, momentum=0.5)
    eager, _ = run_rounds(exact_config("fedper", executor="sequential", **cfg), 2)
    compiled, _, _ = compiled_run(exact_config("fedper", executor="vectorized", engine="compiled", **cfg), 2)
    assert_equal_states(eager, compiled)
    means = compiled.clients["body.2.running_mean"]
    assert len({tuple(m.tolist()) for m in means}) == len(means)  # each client's own, padded rows left as they were
    assert len(handed) > 1  # clients drop out: programs of several sizes
    for calls in handed.values():
        assert all(getattr(v, "_dynamo_static_input_type", None) for v in calls[0])
        assert all(len(c) == len(calls[0]) and all(a is b for a, b in zip(c, calls[0], strict=True)) for c in calls)


def test_the_sequential_executor_compiles_one_program_a_client_calls():
    seq = reference_run("fedrep")  # two phases: head, then body
    sim, _, programs = compiled_run(exact_config("fedrep", executor="sequential", engine="compiled"), 2)
    assert_equal_states(seq, sim)
    assert programs <= sim.executor.shapes_compiled()
    assert len(sim.executor.compiled) == 2 and set(sim.executor.summing) == {
        "logits"
    }  # a step program per phase; evaluation's


def test_a_trial_with_other_numbers_compiles_nothing_new_and_runs_its_own_numbers():
    """A sweep's trials differ in lr and the method's floats: those reach the programs as inputs, so the
    second trial compiles nothing, and trains with its own numbers, not the first's (equal to eager)."""
    first = dict(executor="vectorized", join_ratio="1", clients=4, lr=0.05, hparams=dict(mu=0.01))
    compiled_run(exact_config("fedprox", engine="compiled", **first), 1)
    second = {**first, "lr": 0.03, "hparams": dict(mu=0.5)}
    sim, rows = run_rounds(exact_config("fedprox", engine="compiled", **second), 2)
    assert_compiled_ran(sim, rows)
    assert sim.executor.ran.programs == 0
    eager, eager_rows = run_rounds(exact_config("fedprox", engine="eager", **second), 2)
    assert_equal_states(eager, sim)
    assert rows[-1]["train_loss"] == pytest.approx(eager_rows[-1]["train_loss"], rel=1e-9)
    assert rows[-1]["acc"] == eager_rows[-1]["acc"] and set(sim.executor.summing) == {
        "logits"
    }  # evaluation is compiled too


def test_a_compiled_step_keeps_what_the_forward_carries_to_the_next_step():
    # FedDBE's running mean of features, written by each step's forward (Method.carried), as batch norm's statistics
    hp = {"hparams": {"rho": 0.5}}
    eager, _ = run_rounds(exact_config("feddbe", executor="sequential", **hp), 2)
    compiled, _, _ = compiled_run(exact_config("feddbe", executor="vectorized", engine="compiled", **hp), 2)
    assert_equal_states(eager, compiled)
    assert compiled.clients["dbe.running"].abs().sum() > 0


# Runs whose clients end their steps inside a block (dir:0.3's uneven clients) and whose schedule ends inside one,
# K = 3: the block's other rows and steps keep what they had.
BLOCKS = {
    "BatchNorm statistics, momentum, weight decay": (
        "fedper",
        dict(backbone="tiny_batchnorm", momentum=0.5, weight_decay=1e-3),
    ),
    "keyed noise": ("fedcp-gumbel", dict(momentum=0.5)),
    "partial batches": ("fedala", {}),
}


@pytest.mark.parametrize(
    "case,executor",
    [(case, "vectorized") for case in BLOCKS] + [("keyed noise", "sequential")],
    ids=lambda v: v.replace(" ", "-").replace(",", ""),
)
def test_a_block_of_steps_a_program_equals_a_step_at_a_time(case, executor):
    method, kw = BLOCKS[case]
    eager, eager_rows = run_rounds(exact_config(method, executor="sequential", **kw), 2)
    sim, rows, _ = compiled_run(exact_config(method, executor=executor, engine="compiled", steps_per_call=3, **kw), 2)
    assert_equal_states(eager, sim)
    for a, b in zip(eager_rows, rows, strict=True):
        assert a["acc"] == b["acc"] and a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9)
    ran = sim.executor.ran
    assert ran.compiled_steps == eager.executor.ran.eager_steps  # the steps, not the blocks, counted
    # three steps a call, but where a schedule ends inside a block: a K ignored (a step a call) fails here
    assert 2 * ran.compiled_calls < ran.compiled_steps <= 3 * ran.compiled_calls


def test_a_trial_of_blocks_compiles_once_and_the_next_nothing():
    first = dict(executor="vectorized", join_ratio="1", clients=4, lr=0.05, steps_per_call=4)
    compiled_run(exact_config("fedavg", engine="compiled", **first), 1)
    sim, rows = run_rounds(exact_config("fedavg", engine="compiled", **{**first, "lr": 0.03}), 2)
    assert_compiled_ran(sim, rows)
    ran = sim.executor.ran
    assert ran.programs == 0 and 3 * ran.compiled_calls < ran.compiled_steps <= 4 * ran.compiled_calls


def test_a_compiled_pack_equals_its_runs_alone_and_the_next_pack_compiles_nothing():
    """A pack of runs apart in seed, lr and mu runs compiled, each run equal to itself alone (eager); the next pack
    of the same method and setting, with other seeds and numbers, compiles no program."""
    base = dict(executor="vectorized", engine="compiled", join_ratio="1", clients=4)

    def runs(seeds, lrs, mus):
        return [
            exact_config("fedprox", seed=s, lr=lr, hparams=dict(mu=mu), **base)
            for s, lr, mu in zip(seeds, lrs, mus, strict=True)
        ]

    torch._dynamo.reset()
    _, pack = planned_pack(runs((0, 3), (0.05, 0.1), (0.01, 0.5)))
    rows = [pack.step() for _ in range(2)]
    assert_compiled_ran(pack, [r[0] for r in rows])
    _, second = planned_pack(cfgs := runs((5, 6), (0.03, 0.2), (0.3, 0.02)))
    rows = [second.step() for _ in range(2)]
    assert_compiled_ran(second, [r[1] for r in rows])
    assert second.executor.ran.programs == 0
    for r, cfg in enumerate(cfgs):
        eager, eager_rows = run_rounds(replace(cfg, engine="eager"), 2)
        for k, v in eager.clients.items():
            torch.testing.assert_close(second.state_dict(r)["clients"][k], v, **EXACT)
        assert rows[-1][r]["train_loss"] == pytest.approx(eager_rows[-1]["train_loss"], rel=1e-9)


CHECKS = [
    (test_compiled_vectorized_steps_equal_the_sequential_reference_and_compile_each_shape_once, {"method": "fedpac"}),
    (test_a_compiled_run_compiles_nothing_after_its_shapes_are_known, {}),
    (
        test_compiled_steps_keep_batchnorm_statistics_per_client_in_the_same_static_tensors_every_step,
        {"monkeypatch": None},
    ),
    (test_the_sequential_executor_compiles_one_program_a_client_calls, {}),
    (test_a_trial_with_other_numbers_compiles_nothing_new_and_runs_its_own_numbers, {}),
    (test_a_compiled_step_keeps_what_the_forward_carries_to_the_next_step, {}),
    (test_a_block_of_steps_a_program_equals_a_step_at_a_time, {"case": "keyed noise", "executor": "vectorized"}),
    (test_a_trial_of_blocks_compiles_once_and_the_next_nothing, {}),
    (test_a_compiled_pack_equals_its_runs_alone_and_the_next_pack_compiles_nothing, {}),
]


def test_every_test_of_this_file_is_checked_against_a_failing_compile():
    tests = {name for name, f in globals().items() if name.startswith("test_") and callable(f)}
    exempt = {
        "test_every_test_of_this_file_is_checked_against_a_failing_compile",
        "test_each_check_fails_when_compiling_fails",
        # it forces a failure of its own, and asserts what ran through assert_compiled_ran as the rest do
        "test_a_failing_compile_is_tried_again_with_loop_ordering_after_fusion_off",
        "test_a_retry_keeps_the_programs_compiled_before_it",
    }
    assert tests - exempt == {f.__name__ for f, _ in CHECKS}


@pytest.mark.parametrize("check", CHECKS, ids=[f.__name__ for f, _ in CHECKS])
def test_each_check_fails_when_compiling_fails(check, compiling_fails, monkeypatch):
    """The run goes on eager with the same numbers, so each check above must fail on what ran, not on a number."""
    test, args = check
    args = {k: monkeypatch if k == "monkeypatch" else v for k, v in args.items()}
    with pytest.raises(AssertionError, match="went on eager|nothing ran compiled"):
        test(**args)


def test_a_failing_compile_is_tried_again_with_loop_ordering_after_fusion_off(monkeypatch, capfd, tmp_path):
    """Inductor's scheduler fails as it does on CUDA with torch 2.11 (an assertion in loop reordering after fusion,
    which a CPU never runs: here it is made to): the run compiles again without it, says so in one line, and
    runs compiled, equal to eager."""
    fuse = torch._inductor.scheduler.Scheduler.fuse_nodes

    def failing_with_loop_ordering(self, nodes):
        assert not torch._inductor.config.loop_ordering_after_fusion, "isinstance(snode, SchedulerNode)"
        return fuse(self, nodes)

    monkeypatch.setattr(torch._inductor.scheduler.Scheduler, "fuse_nodes", failing_with_loop_ordering)
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)  # compile for real: no program from the caches
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    monkeypatch.setattr(tuner.engine.compile, "NEEDED", {})
    monkeypatch.setattr(tuner.engine.compile, "SHAPES_NEEDED", {})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # where the configuration is kept for new processes
    torch._dynamo.reset()
    cfg = dict(partition="iid", clients=2, join_ratio="1", val_frac=0.0)
    sim, rows = run_rounds(exact_config("fedavg", executor="vectorized", engine="compiled", **cfg), 1)
    assert_compiled_ran(sim, rows, config=1)
    # the first program failed once; the rest compiled under the second configuration at once
    assert sim.executor.ran.retries == 1
    eager, _ = run_rounds(exact_config("fedavg", executor="vectorized", engine="eager", **cfg), 1)
    assert_equal_states(eager, sim)
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("Compiling")]
    assert said == [
        "Compiling FedAvg's steps failed under torch's default Inductor configuration (InductorError: AssertionError: "
        "isinstance(snode, SchedulerNode)); compiling again with loop ordering after fusion off."
    ]
    # A sweep's next trial in the same process compiles under the configuration that worked, failing nothing again.
    second, rows = run_rounds(exact_config("fedavg", executor="vectorized", engine="compiled", lr=0.02, **cfg), 1)
    assert_compiled_ran(second, rows, config=1)
    assert second.executor.ran.retries == 0
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("Compiling")]
    # So does a new process (a sweep's next worker): the configuration is kept beside the compile cache, for this torch.
    kept = json.loads((tmp_path / tuner.engine.compile.NEEDED_FILE).read_text())
    # the steps' program, and the evaluation's, compiled under the run's configuration after the retry
    assert kept == {f"FedAvg's {what} | cpu | torch {torch.__version__}": 1 for what in ("steps", "logits")}
    monkeypatch.setattr(tuner.engine.compile, "NEEDED", {})
    monkeypatch.setattr(tuner.engine.compile, "SHAPES_NEEDED", {})
    torch._dynamo.reset()
    third, rows = run_rounds(exact_config("fedavg", executor="vectorized", engine="compiled", lr=0.03, **cfg), 1)
    assert_compiled_ran(third, rows, config=1)
    assert third.executor.ran.retries == 0
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("Compiling")]
    # another torch's Inductor may fail otherwise: its configurations are not taken
    monkeypatch.setattr(tuner.engine.compile, "NEEDED", {})
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    assert tuner.engine.compile.needed_before("FedAvg's steps", "cpu") == 0


def test_a_retry_keeps_the_programs_compiled_before_it(monkeypatch, tmp_path):
    """On a GPU a run's first programs may compile under the default configuration and a later shape fail (FedCP on
    an H100: its timed rounds compiled 2 programs again, 13.1 s a round against 0.52): the shapes compiled
    before the retry keep their programs, so round 2 compiles nothing."""
    fuse, lowered = torch._inductor.scheduler.Scheduler.fuse_nodes, []

    def failing_after_the_first_program(self, nodes):
        if torch._inductor.config.loop_ordering_after_fusion:
            lowered.append(lowered[0] if lowered else V.graph)
            assert V.graph is lowered[0], "isinstance(snode, SchedulerNode)"
        return fuse(self, nodes)

    monkeypatch.setattr(torch._inductor.scheduler.Scheduler, "fuse_nodes", failing_after_the_first_program)
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    monkeypatch.setattr(tuner.engine.compile, "NEEDED", {})
    monkeypatch.setattr(tuner.engine.compile, "SHAPES_NEEDED", {})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # no configuration kept by an earlier process
    torch._dynamo.reset()
    # uneven clients: the cohort's rows shrink within a round
    cfg = dict(partition="dir:0.3", clients=4, join_ratio="1", val_frac=0.0)
    sim, rows = run_rounds(exact_config("fedavg", executor="vectorized", engine="compiled", **cfg), 1)
    assert sim.executor.ran.retries == 1
    # the first shape compiled under the default, before the retry
    assert 0 in tuner.engine.compile.SHAPES_NEEDED["FedAvg's steps", "cpu"].values()
    programs = sim.executor.ran.programs
    rows.append(sim.step())
    assert sim.executor.ran.programs == programs  # none again
    assert_compiled_ran(sim, rows, config=1)
    eager, _ = run_rounds(exact_config("fedavg", executor="vectorized", engine="eager", **cfg), 2)
    assert_equal_states(eager, sim)
    # A sweep's next trial in the same process runs every shape's program as it is, none compiled again (FedAvg's
    # second trial on an H200 compiled its two default-configuration shapes again under the retry's: 22 s).
    second, rows = run_rounds(exact_config("fedavg", executor="vectorized", engine="compiled", lr=0.02, **cfg), 2)
    assert second.executor.ran.programs == 0 and second.executor.ran.retries == 0
    assert_compiled_ran(second, rows, config=1)
