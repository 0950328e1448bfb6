"""kNN-Per's λ: each client's best of FedPAC's grid {0.5, ..., 0.8} by leave-one-out accuracy on its own
datastore (our rule) against the fixed λ = 0.5, measured on one training.

kNN-Per trains as FedAvg; λ only mixes at prediction, so both columns read the same models each round:
the rule's column is what `tuner run knn-per-logits` reports under the same settings, up to float
rounding carried over rounds (results/reproduction/pac-knn-per-logits: 80.57 at round 1 as here, 85.00
at round 8 where this read 85.04). Writes a CSV of round, both accuracies and the mean λ the rule chose.
Usage: python bench/knn_lambda.py [--method knn-per-logits] [--rounds 30] [--out knn-lambda.csv]
       (FedPAC's Fashion-MNIST split: pac:20, 20 clients, seed 0, FedPAC's protocol)
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import pandas as pd
import torch

from tuner.federated_run import build_simulation
from tuner.settings.config import parse_set, resolve_layers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="knn-per-logits")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--out", default="knn-lambda.csv")
    ap.add_argument("--set", dest="settings", nargs="*", default=[], help="other run settings as name=value")
    args = ap.parse_args()
    split = {
        "dataset": args.dataset,
        "partition": "pac:20",
        "clients": 20,
        "rounds": args.rounds,
        "protocol": "fedpac",
        "executor": "sequential",
    }
    cfg = resolve_layers(args.method, [("the benchmark", split), ("--set", parse_set(args.settings))])
    sim = build_simulation(cfg)
    method, rows = sim.method, []
    for _ in range(args.rounds):
        row = sim.step()  # evaluated with the rule
        rule = method.hp
        method.hp = replace(rule, lam=torch.tensor(0.5, dtype=torch.float32))
        fixed = sim.evaluate()
        method.hp = rule
        memory = sim._memory(sim.clients, sim.at(sim.round, list(range(sim.data.num_clients))))
        chosen = [
            float(
                method.chosen_lambda(
                    {**{k: v[i] for k, v in sim.clients.items()}, **{k: v[i] for k, v in memory.items()}}
                )
            )
            for i in range(sim.data.num_clients)
        ]
        rows.append(
            {
                "round": row["round"],
                "acc_rule": row["acc"],
                "acc_lambda_0.5": fixed["acc"],
                "mean_lambda_chosen": sum(chosen) / len(chosen),
            }
        )
        print(
            f"round {row['round']:3d}  rule {100 * row['acc']:.2f}  λ=0.5 {100 * fixed['acc']:.2f}  mean λ "
            f"chosen {rows[-1]['mean_lambda_chosen']:.3f}",
            flush=True,
        )
        pd.DataFrame(rows).to_csv(args.out, index=False)  # each round: a stopped run keeps what it measured


if __name__ == "__main__":
    main()
