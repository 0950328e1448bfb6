"""Steps a compiled call (`steps_per_call`, K): what a block of K steps a program saves the host and costs in
compiling, each figure a comparison inside one run.

For each setting (`digits`: GPFL, digits, MLP, 20 clients of dir:0.1, batch 10, the small setting of
bench/compile_once.py; `table1`: GPFL's Table 1 Fashion-MNIST setting, dir:0.1, 20 clients, cnn4, batch 10) and
each K (default 1, 4, 16), one compiled run of the vectorized executor, training only (evaluation off):

- compile s            its first round less a timed round: the programs' compiling (K steps traced into each),
                       from an empty compile cache of its own;
- s/round              the median of its timed rounds, after the first; the Ks' rounds run in turn, so that what
                       the machine does meanwhile falls on each alike;
- host µs/step         the training loop's time outside the compiled calls (the block's gather, slicing, the
                       loss's sum, the loop itself) over the steps it ran;
- in the call µs/step  the time inside the compiled calls over the steps (on a CPU the arithmetic itself; on
                       CUDA launching a graph's replay and dynamo's guards, the GPU's work being asynchronous);
- host / K=1           each K's host µs a step over K = 1's: the factor a block saves the host.

A figure is taken only from a run whose every step ran compiled. Usage:
    python bench/step_blocks.py [--settings digits table1] [--blocks 1 4 16] [--rounds 10] [--device auto]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a source checkout, with or without PYTHONPATH=.

from bench import provenance  # noqa: E402
from bench.compile_once import SMALL  # noqa: E402
from bench.engine_speed import NotCompiled, synchronizer, table1  # noqa: E402
from tuner.engine.compile import use_cache  # noqa: E402
from tuner.federated_run import build_simulation  # noqa: E402
from tuner.settings.config import RunConfig  # noqa: E402

SETTINGS = {
    "digits": lambda device, **kw: RunConfig(**{**SMALL, "rounds": 10**6, "device": device, **kw}),
    "table1": lambda device, **kw: table1("gpfl", device, **kw),
}


class Clock:
    """Time inside a run's step loop and inside the compiled calls it makes, and the steps they ran, added up over
    the rounds run inside `with clock:`."""

    def __init__(self, sim):
        import tuner.engine.executors as executors

        self.loop = self.call = 0.0
        self.steps = 0
        self.sim, self.executors = sim, executors
        self.run_steps = executors.Executor.run_steps

    def __enter__(self):
        clock, run_steps = self, self.run_steps

        def timed_loop(executor, step, *args):
            if not getattr(step.program, "timed", False):  # the run's own programs, timed into its own clock
                step.program = clock.timed_call(step.program)
            t0 = time.perf_counter()
            run_steps(executor, step, *args)
            clock.loop += time.perf_counter() - t0

        self.executors.Executor.run_steps = timed_loop
        self.before = self.sim.executor.ran.compiled_steps
        return self

    def timed_call(self, program):
        def call(*args):
            t0 = time.perf_counter()
            out = program(*args)
            self.call += time.perf_counter() - t0
            return out

        call.timed = True
        return call

    def __exit__(self, *exc):
        self.executors.Executor.run_steps = self.run_steps
        self.steps += self.sim.executor.ran.compiled_steps - self.before


def compare(cfgs: dict[int, RunConfig], rounds: int) -> dict[str, dict]:
    """Each K's compiled run (`cfgs`: K -> its configuration), its first round compiling from an empty cache of its
    own, then `rounds` rounds of each in turn (K = 1's, K = 4's, ..., again), so that what the machine does
    meanwhile falls on all of them alike: the figures of the module's docstring, and each K's ratios to the first."""
    runs = {}
    for block, cfg in cfgs.items():
        with tempfile.TemporaryDirectory() as cache:  # compile seconds from nothing, not from K's earlier runs
            use_cache(cache)
            sim = build_simulation(cfg)
            t0 = time.perf_counter()
            sim.step()
            synchronizer(sim)()
            runs[block] = (sim, Clock(sim), time.perf_counter() - t0, [])
    for _ in range(rounds):
        for sim, clock, _, seconds in runs.values():
            with clock:
                t0 = time.perf_counter()
                sim.step()
                synchronizer(sim)()
                seconds.append(time.perf_counter() - t0)
    out = {}
    for block, (sim, clock, first, seconds) in runs.items():
        if why := sim.executor.ran.not_compiled():
            raise NotCompiled(f"K={block}: the run {why}; no figure is labelled compiled from it.")
        per_round = statistics.median(seconds)
        out[f"K={block}"] = {
            "compile s": first - per_round,
            "s/round": per_round,
            "host us/step": 1e6 * (clock.loop - clock.call) / clock.steps,
            "in the call us/step": 1e6 * clock.call / clock.steps,
            "steps a round": clock.steps / rounds,
            "programs": sim.executor.ran.programs,
        }
    base = next(iter(out.values()))
    for f in out.values():
        f["host / K=1"] = f["host us/step"] / base["host us/step"]
        f["s/round / K=1"] = f["s/round"] / base["s/round"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--blocks", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    print(f"step_blocks on {provenance.machine()}, torch {torch.__version__}", flush=True)
    results: dict[str, dict] = {}
    for setting in args.settings:
        cfgs = {b: SETTINGS[setting](args.device, engine="compiled", steps_per_call=b) for b in args.blocks}
        out = results[setting] = compare(cfgs, args.rounds)
        for label, f in out.items():
            print(
                f"  {setting} {label}: compile {f['compile s']:.1f} s, {f['s/round']:.3f} s/round "
                f"({f['s/round / K=1']:.2f} of the first), host {f['host us/step']:.0f} µs a step "
                f"({f['host / K=1']:.2f} of the first), in the call {f['in the call us/step']:.0f} µs a step",
                flush=True,
            )
        if args.json:  # a long run keeps what it measured
            provenance.write(args.json, results)


if __name__ == "__main__":
    main()
