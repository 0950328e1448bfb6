"""Rounds per second of FedAvg + cnn4 on a Fashion-MNIST practical partition, three ways, one run.

- sequential: the reference executor, one client after another;
- vectorized: the whole cohort per step with torch.func.vmap;
- ceiling:    the same number of training samples through one model, one large batch
              (batch_size x clients) per step: what the hardware does with no federation at all.

Training only (evaluation is switched off with a large eval_gap), after one warm-up round.
Usage: python bench/engine_speed.py [--rounds 2] [--device auto] [--clients 20]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.func import grad_and_value

from tuner.config import RunConfig
from tuner.run import build_simulation


def rounds_per_second(sim, rounds: int, sync) -> float:
    sim.step()  # warm-up
    sync()
    t0 = time.perf_counter()
    for _ in range(rounds):
        sim.step()
    sync()
    return rounds / (time.perf_counter() - t0)


def ceiling_rounds_per_second(sim, rounds: int, sync) -> float:
    """One model, the round's training samples in batches of batch_size x clients."""
    data, method = sim.data, sim.method
    net = method.net
    batch = sim.method.training.batch_size
    b = batch * data.num_clients
    samples = sum(n // batch * batch for n in data.train.counts)
    steps = samples // b
    params = {k: v[0].clone() for k, v in sim.clients.items()}
    step = grad_and_value(lambda p, x, y: F.cross_entropy(net.head(p, net.features(p, x)), y))
    net.module.train()
    device = data.train.y.device

    def one_round():
        perm = torch.randperm(len(data.train.y), device=device)
        for s in range(steps):
            idx = perm[s * b : (s + 1) * b]
            g, _ = step(params, data.decode(data.train.x[idx]), data.train.y[idx])
            for k in g:
                params[k].sub_(0.005 * g[k])

    one_round()
    sync()
    t0 = time.perf_counter()
    for _ in range(rounds):
        one_round()
    sync()
    return rounds / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--partition", default="dir:0.1")
    args = ap.parse_args()
    base = RunConfig(method="fedavg", dataset="fmnist", partition=args.partition, clients=args.clients, batch_size=10, local_epochs=1, eval_gap=10**6, device=args.device, backbone="cnn4")
    results = {}
    for executor in ("sequential", "vectorized"):
        sim = build_simulation(RunConfig(**{**base.__dict__, "executor": executor}))
        cuda = sim.data.train.y.is_cuda
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        results[executor] = rounds_per_second(sim, args.rounds, sync)
    results["ceiling"] = ceiling_rounds_per_second(sim, args.rounds, sync)
    device = torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)"
    print(f"FedAvg, cnn4, fmnist {args.partition}, {args.clients} clients, batch 10, 1 local epoch, on {device}")
    for k, v in results.items():
        print(f"  {k:<11} {v:8.3f} rounds/s  ({1 / v:7.2f} s/round)")
    print(f"  vectorized / sequential = {results['vectorized'] / results['sequential']:.2f}x")
    print(f"  vectorized / ceiling    = {100 * results['vectorized'] / results['ceiling']:.0f} %")


if __name__ == "__main__":
    main()
