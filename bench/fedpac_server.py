"""FedPAC's server step for a cohort: extractor mean, centroids, the combination QPs, combined heads.

Synthetic uploads of the paper's 100-client setting (K = 512 features, 10 classes, grouped
clients), timed after the first solve (which compiles the cvxpy problem once per cohort size).
Usage: python bench/fedpac_server.py [--clients 100] [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a source checkout, with or without PYTHONPATH=.

from algorithms.fedpac import FedPAC  # noqa: E402
from algorithms.net import Net  # noqa: E402
from algorithms.rounds import Round, Training  # noqa: E402
from bench import provenance  # noqa: E402
from tuner.models import Backbone  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="also write the figures to this file, with the command, commit and machine")
    args = ap.parse_args()
    m, k, c = args.clients, args.features, args.classes
    net = Net(Backbone(nn.Linear(k, k), nn.Linear(k, c), k))  # the server only sees K-dimensional features and heads
    method = FedPAC(net, Training(0.01, 5, 50, c, clients=m))
    model = net.initial_state()
    server = method.init_server(model)
    at = Round(1, 1, torch.arange(m), torch.full((m,), 600.0), torch.full((m,), 60.0))

    def uploads() -> dict:
        centers = torch.randn(5, c, k)
        h = torch.stack([centers[i % 5] + 0.1 * torch.randn(c, k) for i in range(m)])
        out = {
            key: model[key].unsqueeze(0).repeat(m, *[1] * model[key].dim()) + 0.01 * torch.randn(m, *model[key].shape)
            for key in net.param_keys
        }
        return out | {"pac.h": h, "pac.v": torch.rand(m) * 50, "pac.sum": h * 60, "pac.count": torch.full((m, c), 60.0)}

    t0 = time.perf_counter()
    method.aggregate(server, uploads(), at)
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        up = uploads()
        t0 = time.perf_counter()
        method.aggregate(server, up, at)
        times.append(time.perf_counter() - t0)
    print(f"FedPAC server step, {m} clients, K = {k}, {c} classes ({torch.get_num_threads()} CPU threads)")
    print(f"  first round (compiles the QP once): {first:.2f} s")
    median = sorted(times)[len(times) // 2]
    print(f"  later rounds: median {median:.3f} s, max {max(times):.3f} s over {args.repeats}")
    if args.json:
        provenance.write(
            args.json,
            {
                "clients": m,
                "features": k,
                "classes": c,
                "threads": torch.get_num_threads(),
                "first round s": first,
                "later rounds median s": median,
                "later rounds max s": max(times),
                "repeats": args.repeats,
            },
        )


if __name__ == "__main__":
    main()
