"""Packs (tuner/engine/pack.py), measured in one run on this machine: trials·rounds a second of P runs packed into one
program against one run alone, for P = 1, 2, 4, 8, 16, in the digits setting (MLP) and Table 1's federation (cnn4
on Fashion-MNIST, 20 clients, Dir(0.1), at batch 100), with the memory each pack's state takes, on every core and
(on a CPU) on one; then a whole 16-trial digits sweep in packs of 4, 8 and 16 (`tuner sweep --pack`) beside today's
sweep (`--pack 1`), the same space, trials and rounds, all on every core.

    python bench/packing.py --json results/bench/packing-digits.json

On a GPU the same command measures there (--device cuda); the memory is then the pack's peak on the device."""

from __future__ import annotations

import argparse
import json
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


def throughput(
    method: str, setting: dict, packs: list[int], rounds: int, device: str, data_dir: str | None, threads: int
) -> dict:
    """Trials·rounds a second of one run alone and of each pack on `threads` CPU threads, the pack's gain over
    alone, and its state's bytes."""
    torch.set_num_threads(threads)
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


def sweep_seconds(trials: int, rounds: int, pack: int, device: str) -> dict:
    """A whole `tuner sweep` of `trials` trials of `rounds` rounds, wall-clock, start to end, and when its first
    and its last trial reported their first round and their last: where its time went."""
    # every core: the pack's (beside its waiting trials' slivers), or one a trial
    cpus = str((os.cpu_count() or 1) - pack * PACK_TRIAL_CPUS) if pack > 1 else "1"
    with tempfile.TemporaryDirectory() as d:
        space = Path(d) / "bench.yaml"
        space.write_text(SWEEP_SPACE.format(rounds=rounds, trials=trials, device=device))
        command = [sys.executable, "-m", "tuner.cli", "sweep", "fedavg", "--space", str(space), "--storage", d]
        command += ["--pack", str(pack), "--cpus-per-trial", cpus]
        start, started_at = time.perf_counter(), time.time()
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        seconds = time.perf_counter() - start
        reports = [
            [json.loads(line)["reported_at"] - started_at for line in f.read_text().splitlines() if line.strip()]
            for f in Path(d).rglob("result.json")
        ]
        return {
            "s": seconds,
            "trials·rounds/s": trials * rounds / seconds,
            "first round reported s": [min(r[0] for r in reports), max(r[0] for r in reports)],
            "last round reported s": [min(r[-1] for r in reports), max(r[-1] for r in reports)],
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="+", default=["fedavg", "gpfl"])
    ap.add_argument("--packs", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--table1-packs", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (their median), after one to warm up")
    ap.add_argument("--sweep-trials", type=int, default=16, help="0: no sweep")
    ap.add_argument("--sweep-rounds", type=int, default=30)
    ap.add_argument("--sweep-packs", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", default=None, help="where Fashion-MNIST is [default: Debian's package's]")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    figures: dict = {"settings": SETTINGS}
    every = torch.get_num_threads()
    measured = [("digits", "digits", args.packs, args.rounds, every), ("table1", "table1", args.table1_packs, 1, every)]
    if args.device == "cpu":  # on one core: what a pack gains where a sweep already runs a trial a core
        measured.append(("digits one core", "digits", args.packs, args.rounds, 1))
    for name, setting, packs, rounds, threads in measured:
        figures[name] = {
            m: throughput(m, SETTINGS[setting], packs, rounds, args.device, args.data_dir, threads)
            for m in args.methods
        }
    torch.set_num_threads(every)
    if args.sweep_trials:  # 0: no sweep (a machine without Ray)
        today = sweep_seconds(args.sweep_trials, args.sweep_rounds, 1, args.device)
        packed = {p: sweep_seconds(args.sweep_trials, args.sweep_rounds, p, args.device) for p in args.sweep_packs}
        figures["sweep"] = {
            "trials": args.sweep_trials,
            "rounds": args.sweep_rounds,
            "today": today,
            **{f"pack {p}": {**f, "speedup": today["s"] / f["s"]} for p, f in packed.items()},
        }
        best = min(packed, key=lambda p: packed[p]["s"])
        figures["sweep_speedup"], figures["sweep_speedup_pack"] = today["s"] / packed[best]["s"], best
        for p, f in packed.items():
            print(f"a {args.sweep_trials}-trial sweep: {today['s']:.1f} s today, {f['s']:.1f} s in packs of {p}")
    if args.json:
        provenance.write(args.json, figures)


if __name__ == "__main__":
    main()
