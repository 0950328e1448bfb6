"""Packs (tuner/engine/pack.py), measured in one run on this machine: trials·rounds a second of P runs packed into one
program against one run alone, for P = 1, 2, 4, 8, 16, in the digits setting (MLP) and Table 1's federation (cnn4
on Fashion-MNIST, 20 clients, Dir(0.1), at batch 100), with the memory each pack's state takes; then a whole
16-trial digits sweep packed (`tuner sweep --pack`) beside today's sweep (`--pack 1`), the same space, trials and
rounds, both on every core.

    python bench/packing.py --json results/bench/packing-digits.json

On a GPU the same command measures there (--device cuda); the memory is then the pack's peak on the device."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provenance  # noqa: E402
from tuner.federated_run import build_simulation  # noqa: E402
from tuner.packed_run import planned_pack  # noqa: E402
from tuner.settings.config import RunConfig  # noqa: E402
from tuner.sweep.pack_host import PACK_TRIAL_CPUS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "digits": {"dataset": "digits", "partition": "dir:0.1", "clients": 20, "backbone": "mlp"},
    # Table 1's federation and backbone, at batch 100 (a tenth of its steps, not of its compute)
    "table1": {"dataset": "fmnist", "partition": "dir:0.1", "clients": 20, "backbone": "cnn4", "batch_size": 100},
}
SWEEP_SPACE = """
settings: {{dataset: digits, partition: dir:0.1, clients: 20, backbone: mlp, rounds: {rounds}, device: {device}}}
search:
  lr: {{loguniform: [0.005, 0.1]}}
samples: {trials}
sampler: random
"""


def state_bytes(pack) -> int:
    return sum(v.numel() * v.element_size() for part in (pack.clients, pack.server) for v in part.values())


def seconds_a_round(step, rounds: int) -> float:
    step()  # warm-up (and compiling, on the compiled engine)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()  # a round's rows are read on the host: it has ended on the device
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput(method: str, setting: dict, packs: list[int], rounds: int, device: str, data_dir: str | None) -> dict:
    """Trials·rounds a second of one run alone and of each pack, the pack's gain over alone, and its state's bytes."""
    base = {**setting, "method": method, "rounds": rounds + 2, "device": device, "data_dir": data_dir}
    alone = seconds_a_round(build_simulation(RunConfig(**base)).step, rounds)
    out = {"alone s/round": alone, "alone trials·rounds/s": 1 / alone}
    for p in packs:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        _, pack = planned_pack([RunConfig(**base, seed=s) for s in range(p)])
        packed = seconds_a_round(pack.step, rounds)
        memory = torch.cuda.max_memory_allocated() if device == "cuda" else state_bytes(pack)
        out[f"P={p}"] = {
            "s/round": packed,
            "trials·rounds/s": p / packed,
            "gain": p * alone / packed,
            "memory MB": memory / 2**20,
        }
        print(f"{method} {p:>2} packed: {p * alone / packed:.2f}x one run alone ({packed:.3f} s a round)", flush=True)
        del pack
    return out


def sweep_seconds(trials: int, rounds: int, pack: int, device: str) -> float:
    """A whole `tuner sweep` of `trials` trials of `rounds` rounds, wall-clock, start to end."""
    # every core: the pack's (beside its waiting trials' slivers), or one a trial
    cpus = str((os.cpu_count() or 1) - pack * PACK_TRIAL_CPUS) if pack > 1 else "1"
    with tempfile.TemporaryDirectory() as d:
        space = Path(d) / "bench.yaml"
        space.write_text(SWEEP_SPACE.format(rounds=rounds, trials=trials, device=device))
        command = [sys.executable, "-m", "tuner.cli", "sweep", "fedavg", "--space", str(space), "--storage", d]
        command += ["--pack", str(pack), "--cpus-per-trial", cpus]
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="+", default=["fedavg", "gpfl"])
    ap.add_argument("--packs", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--table1-packs", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (their median), after one to warm up")
    ap.add_argument("--sweep-trials", type=int, default=16, help="0: no sweep")
    ap.add_argument("--sweep-rounds", type=int, default=30)
    ap.add_argument("--sweep-pack", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", default=None, help="where Fashion-MNIST is [default: Debian's package's]")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    figures: dict = {"settings": SETTINGS}
    for name, packs, rounds in (("digits", args.packs, args.rounds), ("table1", args.table1_packs, 1)):
        figures[name] = {
            m: throughput(m, SETTINGS[name], packs, rounds, args.device, args.data_dir) for m in args.methods
        }
    if args.sweep_trials:  # 0: no sweep (a machine without Ray)
        today = sweep_seconds(args.sweep_trials, args.sweep_rounds, 1, args.device)
        packed = sweep_seconds(args.sweep_trials, args.sweep_rounds, args.sweep_pack, args.device)
        work = args.sweep_trials * args.sweep_rounds
        figures["sweep"] = {
            "trials": args.sweep_trials,
            "rounds": args.sweep_rounds,
            "pack": args.sweep_pack,
            "today s": today,
            "packed s": packed,
            "today trials·rounds/s": work / today,
            "packed trials·rounds/s": work / packed,
        }
        figures["sweep_speedup"] = today / packed
        print(f"a {args.sweep_trials}-trial sweep: {today:.1f} s today, {packed:.1f} s packed ({today / packed:.2f}x)")
    if args.json:
        provenance.write(args.json, figures)


if __name__ == "__main__":
    main()
