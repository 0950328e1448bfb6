"""What compiling costs a sweep and what it saves, each figure a comparison inside one run.

Stages (`--stages`, default all):
- trials   the small setting (GPFL, digits, MLP, 20 clients of dir:0.1, batch 10, vectorized):
           compile seconds of trial 1 (an empty compile cache), of trials 2 and 3 with other
           numbers in the same process (programs in memory), and of a trial in a new process
           that reads the first's on-disk cache; the programs each added. Compile seconds = a
           trial's first round less its rounds after (the rounds themselves).
- host     the same setting, compiled, after its programs are made: microseconds per cohort step
           in the step loop outside the compiled call, the block's bookkeeping and its batches' gather
           among them, and the round's setup outside the loop (schedules, the chunk's copies) a step
           (steps a call against the host's time: bench/step_blocks.py);
- demo     wall time of the demo sweep (search_spaces/demo.yaml) on engine eager, compiled and
           auto, each with a compile cache of its own, empty at the start;
- long     a 16-trial, 50-round GPFL sweep on digits (the demo's space, stopping rules off),
           eager against compiled, each from an empty compile cache.
Usage: python bench/compile_once.py [--stages trials host demo long] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from bench import provenance  # noqa: E402

SMALL = dict(
    method="gpfl",
    dataset="digits",
    partition="dir:0.1",
    clients=20,
    batch_size=10,
    executor="vectorized",
    eval_gap=10**6,
)
TRIALS = [
    dict(lr=0.05, hparams=dict(lam=0.01, mu=0.1)),
    dict(lr=0.02, hparams=dict(lam=0.1, mu=0.3)),
    dict(lr=0.1, hparams=dict(lam=0.001, mu=0.01)),
]


def trial_seconds(rounds: int = 4, **settings) -> dict:
    """One compiled trial in this process: compile seconds, steady s/round, programs it added."""
    from torch._dynamo.utils import counters

    from tuner.federated_run import build_simulation
    from tuner.settings.config import RunConfig

    sim = build_simulation(RunConfig(**{**SMALL, "engine": "compiled", "rounds": rounds, **settings}))
    before = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    sim.step()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(rounds - 1):
        sim.step()
    steady = (time.perf_counter() - t0) / (rounds - 1)
    if why := sim.executor.ran.not_compiled():  # never an eager run's time as a compiled trial's
        raise RuntimeError(f"the compiled trial {why}")
    return {
        "compile s": max(0.0, first - steady),
        "s/round": steady,
        "programs": counters["stats"]["unique_graphs"] - before,
    }


def in_process(trials: list[dict]) -> list[dict]:
    return [trial_seconds(**t) for t in trials]


def new_process(trials: list[dict], cache: Path) -> list[dict]:
    """The trials in a fresh Python process whose torch caches live in `cache`."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from bench.compile_once import in_process; "
        f"print(json.dumps(in_process({trials!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def stage_trials() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        cold = new_process(TRIALS, Path(cache))  # trial 1 from an empty cache, then 2 and 3 in its process
        warm = new_process(TRIALS[1:2], Path(cache))[0]  # another worker: torch's on-disk caches
    first = cold[0]["compile s"]
    out = {
        "trial 1 (empty cache)": cold[0],
        "trials 2-3, same process": cold[1:],
        "a trial in a new process, warm cache": warm,
        "same process / trial 1": max(t["compile s"] for t in cold[1:]) / first,
        "new process / trial 1": warm["compile s"] / first,
    }
    later = ", ".join(f"{t['compile s']:.2f} s ({t['programs']} programs)" for t in cold[1:])
    print(
        f"  trial 1 compiles {first:.1f} s ({cold[0]['programs']} programs); trials 2-3 in its process {later}; "
        f"a new process with the warm cache {warm['compile s']:.1f} s "
        f"({100 * out['new process / trial 1']:.0f} % of trial 1); "
        f"steady {cold[0]['s/round']:.3f} s/round",
        flush=True,
    )
    return out


def stage_host(rounds: int = 5) -> dict:
    """Time inside the compiled calls against the training loop's whole time, per cohort step."""
    import tuner.engine.executors as ex
    import tuner.engine.steps as steps
    from tuner.federated_run import build_simulation
    from tuner.settings.config import RunConfig

    sim = build_simulation(RunConfig(**{**SMALL, "engine": "compiled", "rounds": rounds + 1, **TRIALS[0]}))
    sim.step()  # compiles
    clock = {"program": 0.0, "call": 0.0, "inputs": 0.0, "loop": 0.0, "train": 0.0, "steps": 0}
    call, inputs, loop, train = (
        steps.CompiledStep.__call__,
        ex.Executor._batch_block,
        ex.Executor.run_steps,
        ex.Executor.train,
    )

    def timed(name, fn):
        def wrapper(*args, **kw):
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            clock[name] += time.perf_counter() - t0
            return out

        return wrapper

    def counted_call(self, *args):
        clock["steps"] += len(args[-1])  # the block's steps
        if not hasattr(self.program, "timed"):
            self.program = timed("program", self.program)
            self.program.timed = True
        return timed("call", call)(self, *args)

    patched = (counted_call, timed("inputs", inputs), timed("loop", loop), timed("train", train))
    steps.CompiledStep.__call__, ex.Executor._batch_block, ex.Executor.run_steps, ex.Executor.train = patched
    try:
        for _ in range(rounds):
            sim.step()
    finally:
        steps.CompiledStep.__call__, ex.Executor._batch_block, ex.Executor.run_steps, ex.Executor.train = (
            call,
            inputs,
            loop,
            train,
        )
    n = clock["steps"]
    us = lambda s: 1e6 * s / n  # noqa: E731
    out = {
        "steps": n,
        "host us/step": us(clock["loop"] - clock["program"]),
        "block bookkeeping us/step": us(clock["call"] - clock["program"]),
        "gather us/step": us(clock["inputs"]),
        "in the compiled call us/step": us(clock["program"]),
        "round setup us/step": us(clock["train"] - clock["loop"]),
    }
    print(
        f"  host {out['host us/step']:.0f} µs a cohort step outside the compiled call (the block's bookkeeping "
        f"{out['block bookkeeping us/step']:.0f}, "
        f"the batches' gather {out['gather us/step']:.0f}); in the call "
        f"{out['in the compiled call us/step']:.0f} µs; "
        f"the round's setup outside the step loop {out['round setup us/step']:.0f} µs a step; {n} steps",
        flush=True,
    )
    return out


def sweep_seconds(storage: Path, name: str, *args: str) -> float:
    t0 = time.perf_counter()
    cmd = [
        str(ROOT / ".venv" / "bin" / "tuner"),
        "sweep",
        "gpfl",
        "--space",
        "search_spaces/demo.yaml",
        "--name",
        name,
        "--storage",
        str(storage),
        *args,
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def stage_demo() -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("eager", "compiled", "auto"):
            cache = Path(tmp) / f"cache-{engine}"
            out[f"demo {engine} s"] = sweep_seconds(
                Path(tmp), f"demo-{engine}", "--set", f"engine={engine}", "--compile-cache", str(cache)
            )
            print(f"  demo sweep, engine {engine}: {out[f'demo {engine} s']:.0f} s", flush=True)
    out["demo auto / better"] = out["demo auto s"] / min(out["demo eager s"], out["demo compiled s"])
    print(f"  demo: auto / the better engine {out['demo auto / better']:.2f}", flush=True)
    return out


def stage_long() -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("eager", "compiled"):
            cache = Path(tmp) / f"cache-{engine}"
            long = [
                "--samples",
                "16",
                "--set",
                "rounds=50",
                "--grace",
                "50",
                "--patience",
                "50",
                "--set",
                f"engine={engine}",
                "--compile-cache",
                str(cache),
            ]
            out[f"16x50 {engine} s"] = sweep_seconds(Path(tmp), f"long-{engine}", *long)
            print(f"  16 trials x 50 rounds, engine {engine}: {out[f'16x50 {engine} s']:.0f} s", flush=True)
    out["16x50 compiled / eager"] = out["16x50 compiled s"] / out["16x50 eager s"]
    print(f"  16x50: compiled / eager {out['16x50 compiled / eager']:.2f}", flush=True)
    return out


STAGES = {"trials": stage_trials, "host": stage_host, "demo": stage_demo, "long": stage_long}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    import torch

    print(f"compile_once on CPU ({torch.get_num_threads()} threads), torch {torch.__version__}", flush=True)
    results = {stage: STAGES[stage]() for stage in args.stages}
    if args.json:
        provenance.write(args.json, results)


if __name__ == "__main__":
    main()
