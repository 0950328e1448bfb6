"""The platform's own overhead: 8 short trials as one `tuner sweep` against the same 8 runs done
back to back with `tuner run`, measured in one go on this machine.

The 8 configurations are a grid over the learning rate (so the sweep runs exactly those 8), FedAvg
on the scikit-learn digits, 10 clients, Dir(0.1), ROUNDS rounds each. The sweep runs once with one
trial at a time (pure overhead: Ray start, trial actors, reporting, checkpoints) and once with as
many trials at once as the machine has cores (what a user gets by default).
Usage: python bench/sweep_overhead.py [--rounds 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from bench import provenance  # noqa: E402

LRS = [0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15]
SETTINGS = {"dataset": "digits", "partition": "dir:0.1", "clients": 10, "executor": "sequential", "checkpoint_every": 5}


def tuner(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "tuner"), *args],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", help="also write the figures to this file, with the command, commit and machine")
    args = parser.parse_args()
    settings = {**SETTINGS, "rounds": args.rounds}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        space = tmp / "grid.yaml"
        fixed = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in settings.items())
        space.write_text(f"settings: {{{fixed}}}\nsearch:\n  lr: {{grid: {LRS}}}\n")
        sets = [
            x
            for k, v in settings.items()
            if k not in ("dataset", "partition", "clients", "rounds")
            for x in ("--set", f"{k}={v}")
        ]
        back_to_back = sum(
            tuner(
                "run",
                "fedavg",
                "--dataset",
                "digits",
                "--partition",
                "dir:0.1",
                "--clients",
                "10",
                "--rounds",
                str(args.rounds),
                *sets,
                "--set",
                f"lr={lr}",
                "--out",
                str(tmp / f"run-{lr}"),
            )
            for lr in LRS
        )
        one_at_a_time = tuner(
            "sweep", "fedavg", "--space", str(space), "--storage", str(tmp), "--name", "serial", "--max-concurrent", "1"
        )
        cores = os.cpu_count() or 1
        parallel = tuner("sweep", "fedavg", "--space", str(space), "--storage", str(tmp), "--name", "parallel")
    print(f"8 runs of {args.rounds} rounds (FedAvg, digits, 10 clients), {cores} cores")
    print(f"  tuner run, back to back:          {back_to_back:7.1f} s")
    print(
        f"  tuner sweep, 1 trial at a time:   {one_at_a_time:7.1f} s  -> overhead ratio "
        f"{one_at_a_time / back_to_back:.2f}x"
    )
    print(
        f"  tuner sweep, default concurrency: {parallel:7.1f} s  -> {back_to_back / parallel:.2f}x the "
        "back-to-back throughput"
    )
    if args.json:
        provenance.write(
            args.json,
            {
                "rounds": args.rounds,
                "cores": cores,
                "back to back s": back_to_back,
                "sweep one at a time s": one_at_a_time,
                "sweep default concurrency s": parallel,
                "overhead ratio": one_at_a_time / back_to_back,
                "throughput ratio": back_to_back / parallel,
            },
        )


if __name__ == "__main__":
    sys.exit(main())
