"""Stage 5: how many runs share one GPU before their total rounds/s stops rising by 10 % (the knee, which sets
tuner sweep's default share of a GPU), with and without CUDA MPS."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from bench.campaign.processes import tuner_run, wait_all


def sharing(campaign, deadline: float) -> dict:
    """Total rounds/s of k runs at once, then the same under CUDA MPS where the node has it (Ray does not
    start MPS, so the knee, which sets tuner sweep's default share of a GPU, is taken without it)."""
    ks = [1, 2] if campaign.args.smoke else [1, 2, 4, 8]
    rates = rates_sharing(campaign, ks, deadline, "plain")
    # the knee: more runs only while they add 10 % or more
    for fewer, more in zip(rates, list(rates)[1:], strict=False):
        if rates[more] < 1.1 * rates[fewer]:
            break
        campaign.knee = more
    out = {"rounds_per_second": rates, "best_k": campaign.knee}
    line = ", ".join(f"k={k}: {v:.2f} rounds/s" for k, v in rates.items()) + (
        f"; best k = {campaign.knee}" if rates else "no time left"
    )
    mps = shutil.which("nvidia-cuda-mps-control") if campaign.device.startswith("cuda") else None
    if mps and time.monotonic() < deadline:
        with mps_daemon(mps, campaign.out / "mps"):
            out["rounds_per_second_mps"] = with_mps = rates_sharing(campaign, ks, deadline, "mps")
        line += "; with MPS " + ", ".join(f"k={k}: {v:.2f}" for k, v in with_mps.items())
    else:
        line += "; MPS: " + ("no time left" if mps else "not on this node")
    return {**out, "line": line}


def rates_sharing(campaign, ks: list[int], deadline: float, label: str) -> dict[int, float]:
    rounds = 2 if campaign.args.smoke else 12
    spec = (
        ["fedavg", "--dataset", "digits", "--partition", "dir:0.3", "--clients", "4"]
        if campaign.args.smoke
        else ["gpfl", "--dataset", "fmnist", "--partition", "dir:0.1", "--clients", "20", "--set", "engine=compiled"]
    )  # compiled, as the column's runs are: their rounds' cost is what k runs share
    rates = {}
    for k in ks:
        if time.monotonic() > deadline:
            break
        dirs = [campaign.out / "sharing" / label / f"k{k}-{i}" for i in range(k)]
        for d in dirs:  # a measurement, never resumed from an earlier command's
            shutil.rmtree(d, ignore_errors=True)
        procs = [
            tuner_run(
                [*spec, "--rounds", str(rounds), "--set", f"eval_gap={rounds}", "--set", f"seed={i}", "--out", str(d)],
                campaign,
            )
            for i, d in enumerate(dirs)
        ]
        if not wait_all(procs, deadline):
            break
        # Steady-state throughput: rounds after each process's first (which compiles), over the time they took.
        per_process = [(rounds - 1) / pd.read_parquet(d / "metrics.parquet")["time_s"].iloc[1:].sum() for d in dirs]
        rates[k] = sum(per_process)
    return rates


@contextmanager
def mps_daemon(control: str, folder: Path):
    """CUDA's Multi-Process Service for the processes started inside (they find it through the pipe folder)."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}
    for d in env.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    subprocess.run([control, "-d"], check=True)
    try:
        yield
    finally:
        subprocess.run([control], input="quit\n", text=True)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
