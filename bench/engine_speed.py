"""Seconds per round of the engine in the papers' Table 1 settings, eager against compiled, one run,
ratios first.

For each method (default: FedAvg, GPFL, FedCP on Fashion-MNIST dir:0.1, 20 clients, cnn4, batch
10, 1 local epoch; FedPAC on pac:20 under its protocol), training only (evaluation off), after a
warm-up round that compiles every program the round needs:

- eager / compiled     s/round of the vectorized executor on each engine, and their ratio;
- ceiling              FedAvg only: the same training samples through one model in batches of
                       batch x clients (no federation at all), compiled: what the device does
                       with the round's arithmetic when nothing is small;
- chain bound          the longest client's steps x the time of one compiled single-client step:
                       clients train in parallel but each one's steps are sequential, so no
                       round can be faster;
- recompiles           programs compiled during the timed rounds: 0, or the method has no compiled figure
                       (the s/round would count compiling; the H200 check's FedAvg took 2, results/gpu/README.md);
- compile              the compiled run's first round (its compiling included), and a second trial's
                       (other lr and seed: the same programs, so none compiled);
- whole round          compiled, with every client's evaluation (the papers evaluate every round);
- what ran             the compiled run's programs, the Inductor configuration they compiled under,
                       and the calls CUDA graphs ran and the programs they refused (on CUDA).

A compiled figure is written only once its run is confirmed: every step and batch ran compiled and its timed
rounds compiled nothing. A run that went on eager (compiling failed) or recompiled stops the method's
measurement with the reason, and no number labelled compiled is kept for it.

Also `--sequential` times the sequential executor (the reference, slow), and `--set KEY=VALUE` changes a setting
(`--set dataset=digits --set backbone=mlp`: the small setting of bench/compile_once.py). Usage:
    python bench/engine_speed.py [--methods fedavg gpfl fedcp fedpac] [--rounds 2] [--device auto] [--set K=V]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch._dynamo.utils import counters
from torch.func import grad_and_value

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a source checkout, with or without PYTHONPATH=.

import tuner.engine.compile  # noqa: E402
from bench import provenance  # noqa: E402
from tuner.engine.compile import INDUCTOR_CONFIGS  # noqa: E402
from tuner.federated_run import build_simulation  # noqa: E402
from tuner.settings.config import RunConfig  # noqa: E402

TABLE1 = {  # method: its Table 1 Fashion-MNIST setting
    "fedavg": dict(partition="dir:0.1"),
    "gpfl": dict(partition="dir:0.1"),
    "fedcp": dict(partition="dir:0.1"),
    "fedpac": dict(partition="pac:20", protocol="fedpac"),
}


def table1(method: str, device: str, **kw) -> RunConfig:
    base = dict(
        method=method, dataset="fmnist", clients=20, eval_gap=10**6, device=device, executor="vectorized", rounds=10**6
    )
    if method in ("fedavg", "gpfl", "fedcp"):
        base |= dict(backbone="cnn4", batch_size=10, local_epochs=1)
    return RunConfig(**{**base, **TABLE1.get(method, TABLE1["fedavg"]), **kw})


def synchronizer(sim):
    return torch.cuda.synchronize if sim.data.train.y.is_cuda else (lambda: None)


def seconds_per_round(sim, rounds: int) -> tuple[float, float, int]:
    """(warm-up round's seconds, timed seconds per round, programs compiled during the timed rounds); `rounds` 0
    times the warm-up round alone."""
    sync = synchronizer(sim)
    t0 = time.perf_counter()
    sim.step()
    sync()
    warm = time.perf_counter() - t0
    compiled = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    for _ in range(rounds):
        sim.step()
    sync()
    return warm, (time.perf_counter() - t0) / max(rounds, 1), counters["stats"]["unique_graphs"] - compiled


def _sgd_program(sim):
    net, lr = sim.method.net, sim.method.training.lr
    grad = grad_and_value(lambda p, x, y: F.cross_entropy(net.head(p, net.features(p, x)), y))

    def step(params, x, y):
        g, _ = grad(params, x, y)
        return {k: v - lr * g[k] for k, v in params.items()}

    # the configuration every method compiles under
    # looked up at the call, as the engine does: a test that makes compiling fail reaches it here too
    program = tuner.engine.compile.compile_program(step, sim.data.train.y.device, INDUCTOR_CONFIGS[-1][1])
    # A CUDA graph's outputs live in its memory pool and the next replay overwrites them: the next step's
    # parameters are copied out first (one small copy a step, counted in the figure).
    return lambda params, x, y: {k: v.clone() for k, v in program(params, x, y).items()}


def ceiling_seconds(sim, rounds: int) -> float:
    """One model, the round's training samples in batches of batch_size x clients, compiled."""
    data, batch = sim.data, sim.method.training.batch_size
    b = batch * data.num_clients
    steps = sum(n // batch * batch for n in data.train.counts) // b
    params = sim.method.net.initial_state()  # the backbone alone: some methods hold it under other names
    program, sync, device = _sgd_program(sim), synchronizer(sim), data.train.y.device
    sim.method.net.module.train()

    def one_round(params):
        perm = torch.randperm(len(data.train.y), device=device)
        for s in range(steps):
            idx = perm[s * b : (s + 1) * b]
            params = program(params, data.decode(data.train.x[idx]), data.train.y[idx])
        return params

    params = one_round(params)
    sync()
    t0 = time.perf_counter()
    for _ in range(rounds):
        params = one_round(params)
    sync()
    return (time.perf_counter() - t0) / rounds


def chain_bound_seconds(sim, repeats: int = 50) -> float:
    """The longest client's steps this round x one compiled single-client step (FedAvg's, the backbone's cost)."""
    data, batch = sim.data, sim.method.training.batch_size
    longest = max(sum(p.step_count(n, batch) for p in sim.method.phases()) for n in data.train.counts)
    params = sim.method.net.initial_state()  # the backbone alone: some methods hold it under other names
    program, sync = _sgd_program(sim), synchronizer(sim)
    x, y = data.decode(data.train.x[:batch]), data.train.y[:batch]
    for _ in range(3):
        params = program(params, x, y)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        params = program(params, x, y)
    sync()
    return longest * (time.perf_counter() - t0) / repeats


class NotCompiled(RuntimeError):
    """A run asked to compile went on eager (or part of it did): its times are not the compiled engine's."""


def compiled_only(sim, what: str, recompiles: int = 0):
    """sim, once every step and batch it ran was compiled and its timed rounds compiled nothing; else NotCompiled
    with what ran instead (a timed round that compiled counts compiling in its seconds)."""
    if why := sim.executor.ran.not_compiled():
        raise NotCompiled(f"{what} {why}")
    if recompiles:
        raise NotCompiled(f"{what} compiled {recompiles} programs during its timed rounds")
    return sim


def what_ran(sim) -> dict:
    ran = sim.executor.ran
    return {
        "programs": ran.programs,
        "inductor": INDUCTOR_CONFIGS[ran.config][0],
        "compile retries": ran.retries,
        "graph calls": ran.graph_calls,
        "graph skips": ran.graph_skips,
    }


def measure(
    method: str, device: str, rounds: int, sequential: bool = False, out: dict | None = None, **settings
) -> dict:
    """The figures of one method, written into `out` as each is measured (a failure later keeps the earlier ones)."""
    out = {} if out is None else out
    cfg = table1(method, device, **settings)
    out["eager s/round"] = seconds_per_round(build_simulation(replace(cfg, engine="eager")), rounds)[1]
    sim = build_simulation(replace(cfg, engine="compiled"))
    warm, compiled_s, recompiles = seconds_per_round(sim, rounds)
    # checked before the figure is written: a fallback's or a recompiling run's time is never kept as compiled
    out |= {"compile + first round s": warm, **what_ran(compiled_only(sim, f"{method}'s compiled run", recompiles))}
    out |= {"compiled s/round": compiled_s, "recompiles": recompiles}
    # a sweep's next trial: other numbers, the same programs
    second = build_simulation(replace(cfg, engine="compiled", lr=0.0123, seed=1))
    second_first_s = seconds_per_round(second, 0)[0]
    out["second trial programs"] = compiled_only(second, f"{method}'s second trial").executor.ran.programs
    out["second trial: compile + first round s"] = second_first_s
    if sequential:
        out["sequential eager s/round"] = seconds_per_round(
            build_simulation(replace(cfg, executor="sequential", engine="eager")), rounds
        )[1]
    whole = build_simulation(replace(cfg, engine="compiled", eval_gap=1))  # with evaluation
    _, whole_s, whole_recompiles = seconds_per_round(whole, rounds)
    compiled_only(whole, f"{method}'s compiled run with evaluation", whole_recompiles)
    out |= {"compiled whole round s": whole_s, "whole round recompiles": whole_recompiles}
    out["eager / compiled"] = out["eager s/round"] / out["compiled s/round"]
    out["chain bound s"] = chain_bound_seconds(sim)
    out["% of chain bound"] = 100 * out["chain bound s"] / out["compiled s/round"]
    if method == "fedavg":
        out["ceiling s/round"] = ceiling_seconds(sim, rounds)
        out["% of ceiling"] = 100 * out["ceiling s/round"] / out["compiled s/round"]
    return out


def device_name(device: str) -> str:
    d = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    return torch.cuda.get_device_name(d) if d.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="+", default=list(TABLE1))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--sequential", action="store_true", help="also time the sequential executor")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting over Table 1's (e.g. dataset=digits, backbone=mlp: the small setting)",
    )
    ap.add_argument("--json", help="also write the figures to this file, with the command, commit and machine")
    args = ap.parse_args()
    settings = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    where = f"Table 1 settings{''.join(f', {k}={v}' for k, v in settings.items())}"
    print(f"{where}, training only, {args.rounds} timed rounds after a warm-up, on {device_name(args.device)}")
    results = {}
    for method in args.methods:
        try:
            results[method] = r = measure(method, args.device, args.rounds, args.sequential, **settings)
        except NotCompiled as e:
            results[method] = {"not compiled": str(e)}
            print(f"  {method:<7} no compiled figure: {e}", flush=True)
            continue
        line = (
            f"  {method:<7} eager {r['eager s/round']:.3f}  compiled {r['compiled s/round']:.3f} s/round  "
            f"({r['eager / compiled']:.2f}x)"
        )
        line += f"  {r['% of chain bound']:.0f} % of the chain bound ({r['chain bound s']:.3f} s)"
        if "% of ceiling" in r:
            line += f"  {r['% of ceiling']:.0f} % of the ceiling ({r['ceiling s/round']:.3f} s)"
        line += f"  recompiles {r['recompiles']}  compile + first round {r['compile + first round s']:.0f} s"
        line += (
            f" (a second trial {r['second trial: compile + first round s']:.1f} s, "
            f"{r['second trial programs']} programs)"
        )
        line += (
            f"  whole round {r['compiled whole round s']:.3f} s  ({r['programs']} programs, "
            f"{r['inductor']}; CUDA graphs: {r['graph calls']} calls, {r['graph skips']} skipped)"
        )
        print(line, flush=True)
    if args.json:
        provenance.write(args.json, results)


if __name__ == "__main__":
    main()
