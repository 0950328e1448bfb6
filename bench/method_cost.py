"""Seconds per round of every method beside FedAvg's, in GPFL's practical setting, one run each.

Fashion-MNIST, dir:0.1, 20 clients, everyone each round, cnn4, batch 10, one local epoch (the
PFLlib protocol), each method at its defaults. The first round timed, training and evaluation
both (every method pays the same first-round costs of allocation), since methods differ in both (FedAvg-FT and FedBABU
fine-tune before
evaluating, kNN-Per builds its datastore). Prints a Markdown table: s/round and the ratio to FedAvg.
Usage: python bench/method_cost.py [--dataset fmnist] [--partition dir:0.1] [--clients 20]
       [--executor vectorized] [--device auto] [--methods fedavg ditto ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a source checkout, with or without PYTHONPATH=.

from algorithms import METHODS  # noqa: E402
from bench import provenance  # noqa: E402
from tuner.federated_run import build_data, build_simulation  # noqa: E402
from tuner.settings.config import RunConfig, resolve_layers  # noqa: E402


def seconds_per_round(cfg: RunConfig, data, sync) -> float:
    sim = build_simulation(cfg, data)
    sync()
    t0 = time.perf_counter()
    sim.step()
    sync()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--partition", default="dir:0.1")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--executor", default="vectorized")
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--methods",
        nargs="*",
        default=["fedavg"] + sorted(n for n, c in METHODS.items() if not c.family and n != "fedavg"),
    )
    ap.add_argument("--json", help="also write the figures to this file, with the command, commit and machine")
    args = ap.parse_args()
    settings = {
        "dataset": args.dataset,
        "partition": args.partition,
        "clients": args.clients,
        "rounds": 1,
        "executor": args.executor,
        "device": args.device,
    }
    first = resolve_layers("fedavg", [("bench", settings)])
    device = torch.device(first.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    data = build_data(first, device)  # one partition for every method
    rows = []
    for name in args.methods:
        cfg = resolve_layers(name, [("bench", settings)])
        rows.append((name, seconds_per_round(cfg, data, sync)))
        print(f"{name}: {rows[-1][1]:.2f} s", flush=True)
    base = dict(rows).get("fedavg", rows[0][1])
    print(f"\n{args.dataset} {args.partition}, {args.clients} clients, {args.executor} on {device}\n")
    print("| method | s / round | × FedAvg |\n| --- | --- | --- |")
    for name, seconds in rows:
        print(f"| {METHODS[name].title} | {seconds:.2f} | {seconds / base:.2f} |")
    if args.json:
        provenance.write(args.json, {"setting": settings, "s per round": dict(rows)})


if __name__ == "__main__":
    main()
