"""How much one program over P runs' clients could gain, before runs are packed: a method's round over a federation
of N clients against its round over the same federation tiled P times (P·N clients, each copy holding the same
data), the work a pack of P runs would hand one program. It leaves out what a pack adds (each run's own server and
hyperparameters beside its clients), so it bounds a pack's gain from above, and it says where packing pays: where a
round is bound by per-call overhead, P runs cost less than P rounds.

    python bench/pack_bound.py --methods fedavg gpfl --packs 2 4 8 16 --json results/bench/pack-bound-digits.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algorithms.capabilities import HeldOut  # noqa: E402
from bench import provenance  # noqa: E402
from tuner.data.federated import FederatedData, Split  # noqa: E402
from tuner.federated_run import build_simulation, planned_simulation  # noqa: E402
from tuner.settings.config import resolve_layers  # noqa: E402


def tiled(data: FederatedData, copies: int) -> FederatedData:
    """The federation with every client `copies` times, in order: client i of copy c is client c·N + i."""

    def split(s: Split | None) -> Split | None:
        return None if s is None else Split(torch.cat([s.x] * copies), torch.cat([s.y] * copies), s.counts * copies)

    return replace(
        data, train=split(data.train), test=split(data.test), val=split(data.val), group=np.tile(data.group, copies)
    )


def seconds_a_round(method: str, settings: dict, copies: int, rounds: int) -> float:
    """A round's median time over `rounds` rounds after a first (warm-up), the federation tiled `copies` times."""
    plan, alone = planned_simulation(resolve_layers(method, [("bench", settings)]))
    if isinstance(alone.method, HeldOut):
        raise SystemExit(f"{method} holds part of each client's data out; its data cannot be tiled after that.")
    sim = alone
    if copies > 1:
        sim = build_simulation(replace(plan.settings(), clients=plan.clients * copies), tiled(alone.data, copies))
    sim.step()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        sim.step()  # its row's figures are read on the host: the round has finished on the device
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="+", default=["fedavg", "gpfl"])
    ap.add_argument("--packs", nargs="+", type=int, default=[2, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds (their median), after one to warm up")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--backbone", default="mlp")
    ap.add_argument("--engine", default="eager")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    settings = {
        "dataset": args.dataset,
        "partition": "dir:0.1",
        "clients": 20,
        "backbone": args.backbone,
        "engine": args.engine,
        "device": args.device,
        "rounds": args.rounds + 1,
    }
    figures: dict = {"setting": settings}
    for method in args.methods:
        alone = seconds_a_round(method, settings, 1, args.rounds)
        row = {"alone s/round": alone}
        for pack in args.packs:
            packed = seconds_a_round(method, settings, pack, args.rounds)
            row[f"P={pack}"] = {"s/round": packed, "runs·rounds/s gain": pack * alone / packed}
            print(f"{method} P={pack}: {pack * alone / packed:.2f}x ({packed:.4f} s against {alone:.4f} s alone)")
        figures[method] = row
    if args.json:
        provenance.write(args.json, figures)


if __name__ == "__main__":
    main()
