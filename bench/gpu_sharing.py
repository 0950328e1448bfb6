"""How many trials of the cnn4 Fashion-MNIST setting share one GPU before the sweep's total
throughput stops rising: for k = 1, 2, 4, 8, a sweep of k trials at once, each asking for 1/k of
the GPU, ROUNDS rounds each (GPFL Table 1's practical setting: 20 clients, Dir(0.1), batch 10,
evaluation off), measured in one run. Prints total rounds per second against k.
Needs a CUDA GPU. Usage: python bench/gpu_sharing.py [--rounds 5] [--method fedavg]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--shares", default="1,2,4,8")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_sharing.py needs a CUDA GPU.")
    print(f"{args.method}, cnn4, fmnist dir:0.1, 20 clients, {args.rounds} rounds per trial, on {torch.cuda.get_device_name()}")
    with tempfile.TemporaryDirectory() as tmp:
        for k in map(int, args.shares.split(",")):
            seeds = list(range(k))
            space = Path(tmp) / f"k{k}.yaml"
            space.write_text(
                "settings: {dataset: fmnist, partition: 'dir:0.1', clients: 20, backbone: cnn4, "
                f"rounds: {args.rounds}, eval_gap: {args.rounds}, checkpoint_every: {args.rounds}}}\n"
                f"search:\n  seed: {{grid: {seeds}}}\n"
            )
            t0 = time.perf_counter()
            subprocess.run([str(ROOT / ".venv/bin/tuner"), "sweep", args.method, "--space", str(space), "--storage", tmp,
                            "--name", f"k{k}", "--gpus-per-trial", str(1 / k), "--cpus-per-trial", "1"], check=True, cwd=ROOT)  # fmt: skip
            seconds = time.perf_counter() - t0
            print(f"  {k} trials sharing the GPU: {k * args.rounds / seconds:6.2f} rounds/s in total ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
