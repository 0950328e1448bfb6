"""The GPU check in one command: does every family of methods compile on CUDA and equal the CPU reference, and how
fast do the papers' settings run compiled, with CUDA graphs. From a bare CUDA machine with torch, pydantic, the QP
packages and Fashion-MNIST's four idx .gz files, within --budget-min (default 12):

    PYTHONPATH=. python bench/gpu_check.py --data DIR --out DIR

Its stages are bench/gpu_campaign.py's, each merged into OUT/campaign.json and OUT/summary.md as it ends and
printed as one line (a stop loses nothing; a later campaign command adds to the same folder). By default the first
four, which fit the default budget as measured on an H200; the last two when named:

1. environment  device, torch and CUDA versions, the commit, the packages found;
2. correctness  each method of CHECK_METHODS (a family each) on --backbone (cnn4, the papers' CNN, on small
                Fashion-MNIST clients; or the MLP on digits) and ResNet-18's BatchNorm, two rounds,
                vectorized and compiled on the GPU against sequential eager on the CPU in float64, equal to 1e-9,
                every step and batch compiled (a run that went on eager fails its check); the checks run in
                `--parallel` processes at once, since compiling is CPU work;
3. speed        eager and compiled s/round of GPFL, FedCP, FedAvg and FedPAC in their Table 1 settings, trial 1's
                compiling from an empty compile cache, trial 2's programs, the Inductor configuration, CUDA graph
                calls and skips (bench/engine_speed.py's `measure`; a run that went on eager, or whose timed rounds
                compiled, gives no figure);
4. profile      the share of the wall time the GPU was busy over 20 compiled steps of GPFL's cohort, and a step's
                time at each padded width;
5. conv forms   cnn4's step under vmap, 20 clients of batch 10, in each convolution form (bench/conv_forms.py): ms a
                step eager and compiled;
6. blocks       GPFL's Table 1 setting compiled at 1 and at 4 steps a call (bench/step_blocks.py): s/round, the
                host's µs a step outside the compiled calls, compile seconds; last, since its compiling is long.

`--methods all` checks every method and variant (those not yet checked on CUDA first) instead of a family each, and
`--methods M...` the methods named; `--stages S,S` runs the stages named (conv-forms, blocks, ...).

`--smoke` (with `--device cpu`) runs the same code in miniature (FedAvg's check, digits): the suite runs it.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from algorithms import METHODS  # noqa: E402
from bench.campaign.speed import profile, speed  # noqa: E402
from bench.gpu_campaign import Campaign, _check, _verdict, arguments, check_backbone, executors_equal  # noqa: E402
from tuner.engine.compile import CUDA_CHECKED  # noqa: E402

# Each stage's share of --budget-min (default 12). The default stages are those measured on a GPU, and their shares
# cover what they took on an H200 with a tenth to spare (a test holds it, from the committed files): the ten
# checks 159 s (results/gpu/check-h200-a50e3b0, on the MLP; cnn4's checks are not yet measured there), the four
# speed figures 391 s, each compiling from nothing (check-h200-7a0cf86/speed), the profile 2 s. Convolution forms
# and blocks never ran on a GPU, and blocks' compiling grows with K (GPFL's Table 1 step on the CPU: 140 s at K = 1,
# 392 at 4, 1471 at 16, results/bench/step-blocks-table1.json): they run when named (`--stages`), last.
SHARES = {"environment": 0.02, "correctness": 0.3, "speed": 0.63, "profile": 0.05, "conv forms": 0.05, "blocks": 0.3}
DEFAULT_STAGES = ["environment", "correctness", "speed", "profile"]
BUDGET_MIN = 12.0
BLOCKS = [1, 4]  # steps a call: one against a block (16 would compile for many minutes)
# A method a family: plain steps (FedAvg), GPFL's and FedCP's added modules, keyed noise (FedCP-Gumbel), statistics
# passes, two phases with momentum and a QP (FedPAC), two models (Ditto), head then body (FedRep), an inner loop
# (pFedMe), mixture components (FedEM); the first six failed to compile on CUDA before the retry (results/gpu).
CHECK_METHODS = ["fedavg", "gpfl", "fedcp", "fedcp-gumbel", "fedpac", "ditto", "fedrep", "pfedme", "fedem"]
SPEED_METHODS = ["gpfl", "fedavg", "fedpac", "fedcp"]  # the headline target first, then by compile time (FedCP ~100 s)


def checked(cfg, device: str, rounds: int, threads: int) -> dict:
    """One correctness check, in a worker process: its share of the cores (the CPU reference and compiling)."""
    import torch

    torch.set_num_threads(threads)
    return _check(float("inf"), lambda: executors_equal(cfg, device, rounds))


def checked_methods(args) -> list[str]:
    """The methods the correctness stage checks: FedAvg in miniature, a family each, or (`--methods all`) every one,
    those not yet checked on CUDA first; or the methods named."""
    if args.smoke:
        return ["fedavg"]
    if not args.methods:
        return CHECK_METHODS
    if args.methods == ["all"]:
        return sorted(METHODS, key=lambda m: ((m, check_backbone(args)) in CUDA_CHECKED, m))
    return args.methods


def blocks(campaign: Campaign, deadline: float) -> dict:
    """GPFL's Table 1 setting compiled at each of BLOCKS steps a call, their rounds in turn (bench/step_blocks.py;
    smoke: FedAvg on digits at 1 and 2)."""
    from bench.step_blocks import SETTINGS, compare

    if campaign.args.smoke:
        cfgs = {
            k: campaign.digits("fedavg", engine="compiled", steps_per_call=k, device=campaign.device) for k in (1, 2)
        }
    else:
        table1 = SETTINGS["table1"]
        cfgs = {k: table1(campaign.device, engine="compiled", steps_per_call=k, data_dir=campaign.data) for k in BLOCKS}
    out = compare(cfgs, rounds=1 if campaign.args.smoke else 3)
    line = "; ".join(f"{k}: {f['s/round']:.3f} s/round, host {f['host us/step']:.0f} µs a step" for k, f in out.items())
    return {"figures": out, "line": line}


def conv_forms(campaign: Campaign, deadline: float) -> dict:
    """cnn4's step in each convolution form (smoke: 2 clients of 2 samples, a step each)."""
    from bench.conv_forms import forms, line

    size = dict(clients=2, batch=2, steps=1) if campaign.args.smoke else {}
    out = forms(torch.device(campaign.device), **size)
    return {"forms": out, "line": line(out)}


def correctness(campaign: Campaign, deadline: float) -> dict:
    """The checks in parallel processes (spawned: CUDA does not survive a fork); past the deadline the unfinished
    ones are stopped and recorded as skipped."""
    # every round the whole cohort: a program per padded size, compiled once
    fixed = dict(engine="compiled", join_ratio="1")
    backbone = check_backbone(campaign.args)
    cases = {
        f"compiled: {m} on {backbone}": (campaign.checked(m, backbone, **fixed), 2, m, backbone)
        for m in checked_methods(campaign.args)
    }
    if not campaign.args.smoke:
        resnet = dict(clients=12, backbone="resnet18", partition="iid", lr=0.01, batch_size=30, cohort_chunk=4)
        cases["compiled: ResNet-18 BatchNorm under vmap (fedper)"] = (
            campaign.digits("fedper", **fixed, **resnet),
            1,
            "fedper",
            "resnet18",
        )
    checks: dict[str, dict] = {}
    with multiprocessing.get_context("spawn").Pool(campaign.args.parallel) as pool:
        threads = max(1, (os.cpu_count() or 2) // campaign.args.parallel)
        pending = {
            name: pool.apply_async(checked, (cfg, campaign.device, rounds, threads))
            for name, (cfg, rounds, _, _) in cases.items()
        }
        for name, result in pending.items():
            try:
                checks[name] = result.get(timeout=max(0.0, deadline - time.monotonic()))
            except multiprocessing.TimeoutError:
                checks[name] = {"status": "skipped"}
            checks[name] |= {
                "method": cases[name][2],
                "backbone": cases[name][3],
            }  # tuner/engine/compile.py CUDA_CHECKED
            campaign.progress({"checks": checks, **_verdict(checks)})
        pool.terminate()
    return {"checks": checks, **_verdict(checks)}


def main() -> None:
    ap = arguments(__doc__.split("\n\n")[0], budget_min=BUDGET_MIN)
    ap.add_argument(
        "--parallel",
        type=int,
        default=max(1, min(len(CHECK_METHODS) + 1, (os.cpu_count() or 2) // 2)),
        help="correctness checks compiling at once (default: half the CPU cores)",
    )
    ap.add_argument(
        "--methods",
        nargs="+",
        help="the methods the correctness stage checks: `all`, or names (default: a family each, CHECK_METHODS)",
    )
    ap.add_argument(
        "--stages",
        default=",".join(s.replace(" ", "-") for s in DEFAULT_STAGES),
        help="which stages this command runs, comma-separated, in the order above (default: "
        f"{', '.join(DEFAULT_STAGES)}; {', '.join(s for s in SHARES if s not in DEFAULT_STAGES)} when named)",
    )
    args = ap.parse_args()
    if not args.smoke and not args.data:
        ap.error("--data DIR (Fashion-MNIST's idx .gz files) is needed unless --smoke")
    args.speed_methods, args.engine = SPEED_METHODS, "compiled"
    # trial 1 compiles from nothing: this command's programs go to a cache of its own (its workers inherit it)
    if not args.smoke:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpu-check-compile-cache-")
    c = Campaign(args, shares=SHARES)
    stages = {
        "environment": c.environment,
        "correctness": lambda d: correctness(c, d),
        "speed": lambda d: speed(c, d),
        "profile": lambda d: profile(c, d),
        "conv forms": lambda d: conv_forms(c, d),
        "blocks": lambda d: blocks(c, d),
    }
    for name, run in stages.items():
        if name in c.stages:
            c.stage(name, run)
    print(f"summary: {c.out / 'summary.md'}")


if __name__ == "__main__":
    main()
