"""The GPU path in ten-minute commands: does it work, how fast is it, where does a step's time go,
how many runs share a GPU, and real-length runs, from a source checkout that has only torch & co.

    PYTHONPATH=. python bench/gpu_campaign.py --data DIR --out DIR [--stages S,S] [--budget-min 9]

DIR for --data holds Fashion-MNIST's four idx .gz files. No Ray, Optuna or install of this
project is needed (the runs are `python -m tuner.cli run` processes). A command runs the stages it
names (default: all), in this order, each with its share of --budget-min (this command's time);
each stage's result is merged into OUT/campaign.json and OUT/summary.md as soon as it is done and
printed as one line, so a stop loses nothing and later commands add to what earlier ones wrote:

1. environment  device, memory, torch/CUDA versions, TF32, the packages found, the commit (written by every
                command into campaign.json, whichever stages it runs);
2. correctness  each method (--methods, default all) on --backbone (cnn4 on a few small Fashion-MNIST
                clients, or the MLP on digits), two rounds: vectorized on the device
                with --engine (eager or compiled) against sequential on the CPU in float64 (equal to
                1e-9, as the suite); ResNet-18 with BatchNorm under vmap likewise; exact resume of a
                run on the device (deterministic algorithms on). A failure is recorded with its
                message and the campaign goes on;
3. speed        bench/engine_speed.py's figures for FedAvg, GPFL, FedCP and FedPAC in their Table 1
                settings: eager and compiled s/round, % of the compiled large-batch ceiling, % of
                the longest client's chain bound, recompiles;
4. profile      torch.profiler over 20 compiled steps of GPFL's Table 1 cohort: the top kernels and
                how much of the wall time the device was busy;
5. sharing      k = 1, 2, 4, 8, 16 runs of GPFL at once on the one device as separate processes
                (what Ray's fractional GPUs do): total rounds/s against k, and the knee;
6. real run     the papers' Fashion-MNIST columns (--columns, in that order): every method of FedPAC
                Table 1's pac:20 columns (20 clients; 100 clients at ρ = 0.3) at its 200 rounds, and of
                GPFL Table 1's (dir:0.1, pat:2; 20 clients, 2000 rounds, no early stop: GPFL §4.1
                runs 2000 iterations; gpfl-dir-200 at 200), --seeds runs a method, as many at once as the
                knee. FedCP's Table 2 has no Fashion-MNIST column (its MNIST ones need full MNIST). Runs
                land in OUT/runs/COLUMN/METHOD-seedN for `tuner report`; those already under
                --committed/COLUMN (results/gpu) or finished here are never run again; the rest go cheapest
                first by their measured seconds a round, each started only where it fits the time left;
                a run stopped by the budget keeps its rows and last checkpoint (every 5 rounds, 10 for
                the GPFL columns), and the next command in the same folder resumes it.

`--smoke` (with `--device cpu`) runs every stage in miniature (one method per family, digits,
two rounds) in seconds: the test suite runs it so the campaign cannot rot.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from algorithms import METHODS  # noqa: E402
from bench.campaign.real_run import COLUMNS, real_run  # noqa: E402
from bench.campaign.sharing import sharing  # noqa: E402
from bench.campaign.speed import SPEED_METHODS, profile, speed  # noqa: E402
from bench.campaign.summary import summary_markdown  # noqa: E402
from bench.engine_speed import what_ran  # noqa: E402
from bench.provenance import commit  # noqa: E402
from tuner.federated_run import build_simulation  # noqa: E402
from tuner.run_folder import device_name  # noqa: E402
from tuner.settings.config import RunConfig  # noqa: E402

SHARES = {"environment": 0.02, "correctness": 0.2, "speed": 0.15, "profile": 0.05, "sharing": 0.13, "real run": 0.45}
STAGES = list(SHARES)
PACKAGES = [
    "torch",
    "torchvision",
    "numpy",
    "scipy",
    "pandas",
    "pyarrow",
    "cvxpy",
    "osqp",
    "clarabel",
    "scs",
    "typer",
    "rich",
    "yaml",
    "pydantic",
    "ray",
    "optuna",
]
SMOKE_METHODS = ["fedavg", "gpfl", "fedcp", "fedpac"]  # one per family of the papers' methods
CHECK_BACKBONES = ("cnn4", "mlp")  # a backbone is another program: tuner/engine/compile.py CUDA_CHECKED keys by it
EXACT = dict(rtol=1e-9, atol=1e-9)  # the suite's executor-equality tolerance (tests/test_engine.py)


class Campaign:
    """The campaign's budget and bookkeeping, and the stages of its own (environment, correctness); the others
    are in bench/campaign/, a module each. `shares`: each stage's share of the budget (bench/gpu_check.py's own)."""

    def __init__(self, args, shares: dict[str, float] = SHARES):
        self.args, self.shares = args, shares
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = (
            "cuda"
            if args.device == "auto" and torch.cuda.is_available()
            else ("cpu" if args.device == "auto" else args.device)
        )
        self.data = str(Path(args.data).resolve()) if args.data else None
        self.environment_name = device_name(torch.device(self.device))  # as the runs' environment.json names it
        self.start = time.monotonic()
        self.end = self.start + 60 * args.budget_min
        self.stages = [name.strip().replace("-", " ") for name in args.stages.split(",")]
        unknown = [name for name in self.stages if name not in shares]
        if unknown:
            raise SystemExit(
                f"Unknown stage {unknown[0]!r}; choose from {', '.join(n.replace(' ', '-') for n in shares)}."
            )
        path = self.out / "campaign.json"
        # what earlier commands found
        self.results: dict[str, dict] = json.loads(path.read_text()) if path.exists() else {}
        # every command's file says where its figures came from, whichever stages it runs
        self.results["environment"] = {**self.environment(self.end), "seconds": 0.0}
        self.knee = self.results.get("sharing", {}).get("best_k", 1)

    # --- budget and bookkeeping
    def left(self) -> float:
        return self.end - time.monotonic()

    def stage(self, name: str, fn) -> None:
        share = self.shares[name] / sum(self.shares[n] for n in self.stages)
        deadline = time.monotonic() + share * 60 * self.args.budget_min
        deadline = min(self.end, deadline) if name != self.stages[-1] else self.end  # the last stage takes what is left
        self.earlier = self.results.get(name, {})
        self.running, self.t0 = name, time.monotonic()
        try:
            result = fn(deadline)
        except Exception as e:  # a stage that breaks is a finding; the next stage still runs
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=4)}
        self.progress(result)
        print(f"[{name}] {result.get('line', result.get('error', ''))} ({self.results[name]['seconds']} s)", flush=True)

    def progress(self, result: dict) -> None:
        """The running stage's result so far, written at once: a command stopped mid-stage keeps it."""
        name = self.running
        result = {**result, "seconds": round(time.monotonic() - self.t0, 1)}
        # commands check parts of the methods
        if name == "correctness" and "checks" in self.earlier and "checks" in result:
            checks = {**self.earlier["checks"], **result["checks"]}
            result |= {"checks": checks, **_verdict(checks)}
        self.results[name] = result
        self.write()

    def write(self) -> None:
        tmp = self.out / "campaign.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=2, default=str))
        os.replace(tmp, self.out / "campaign.json")
        (self.out / "summary.md").write_text(summary_markdown(self.results))

    def digits(self, method: str, **kw) -> RunConfig:
        """The suite's small setting (tests/test_engine.py); smoke: fewer, larger batches."""
        base = dict(
            method=method,
            dataset="digits",
            partition="dir:0.3",
            clients=6,
            lr=0.05,
            join_ratio="0.5-1",
            val_frac=0.2,
            dtype="float64",
        )
        if self.args.smoke:
            base |= dict(clients=4, batch_size=40)
        return RunConfig(**{**base, **kw})

    def checked(self, method: str, backbone: str, **kw) -> RunConfig:
        """A correctness check's setting on `backbone` (CHECK_BACKBONES): the MLP on the suite's digits; cnn4, the
        papers' CNN, on a few small Fashion-MNIST clients (digits' 8x8 images are too small for its convolutions)."""
        if backbone == "mlp":
            return self.digits(method, backbone="mlp", **kw)
        small = dict(partition="pac:20", pac_train=60, pac_test=20, batch_size=10)  # 6 steps a client and epoch
        return self.digits(method, dataset="fmnist", data_dir=self.data, backbone="cnn4", **small, **kw)

    # --- 1
    def environment(self, deadline: float) -> dict:
        env = {
            "device": self.device,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": sys.version.split()[0],
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        }
        if self.device.startswith("cuda"):
            p = torch.cuda.get_device_properties(self.device)
            env |= {
                "name": p.name,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "capability": f"{p.major}.{p.minor}",
            }
        else:
            env |= {"name": f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"}
        env["packages"] = {name: _version(name) for name in PACKAGES}
        env["commit"] = commit()
        missing = [n for n in ("cvxpy", "pandas", "pyarrow") if env["packages"][n] is None]
        env["line"] = f"{env['name']}, torch {env['torch']}, CUDA {env['cuda']}" + (
            f"; missing {', '.join(missing)}" if missing else ""
        )
        return env

    # --- 2
    def correctness(self, deadline: float) -> dict:
        methods = self.args.methods or (SMOKE_METHODS if self.args.smoke else sorted(METHODS))
        engine = self.args.engine
        label = "executors equal" + ("" if engine == "eager" else f" ({engine})")
        backbone = check_backbone(self.args)
        checks = {}
        for m in methods:
            checks[f"{label}: {m} on {backbone}"] = {
                **_check(deadline, lambda m=m: executors_equal(self.checked(m, backbone, engine=engine), self.device)),
                "method": m,
                "backbone": backbone,
            }
            self.progress({"checks": checks, **_verdict(checks)})
        resnet = dict(
            clients=12, join_ratio="0.25", backbone="resnet18", partition="iid", lr=0.01, batch_size=30, cohort_chunk=2
        )
        if self.args.smoke:
            # FedPAC's small clients (60 samples, two steps each): BatchNorm under vmap, not training, is checked
            resnet |= dict(clients=4, join_ratio="0.5", partition="pac:20", pac_train=60, pac_test=20, batch_size=30)
        checks["ResNet-18 BatchNorm under vmap"] = {
            **_check(
                deadline, lambda: executors_equal(self.digits("fedper", engine=engine, **resnet), self.device, rounds=1)
            ),
            "method": "fedper",
            "backbone": "resnet18",
        }
        checks["exact resume on the device"] = _check(deadline, self.exact_resume)
        return {"checks": checks, **_verdict(checks)}

    def exact_resume(self) -> dict:
        """Three rounds straight against one round, a saved and restored state, and two more, on the device."""
        cfg = replace(
            self.digits("fedrep", join_ratio="0.6-1"), dtype="float32", device=self.device, deterministic=True
        )
        straight = build_simulation(cfg)
        rows = [straight.step() for _ in range(3)]
        first = build_simulation(cfg)
        first.step()
        state = first.state_dict()
        resumed = build_simulation(cfg)
        resumed.load_state_dict(state)
        later = [resumed.step() for _ in range(2)]
        for a, b in zip(rows[1:], later, strict=False):
            for key in ("acc", "train_loss", "test_loss"):
                assert a[key] == b[key], f"round {a['round']} {key}: {a[key]} straight, {b[key]} resumed"
        for k in straight.clients:
            assert torch.equal(straight.clients[k], resumed.clients[k]), f"{k} differs after resume"
        return {"rounds": 3}


def executors_equal(cfg: RunConfig, device: str, rounds: int = 2) -> dict:
    """Vectorized on `device` against sequential on the CPU: parameters and metrics; a run asked to compile must
    have run every step and batch compiled."""
    seq = build_simulation(replace(cfg, executor="sequential", device="cpu", engine="eager"))
    vec = build_simulation(replace(cfg, executor="vectorized", device=device))
    rows = [(seq.step(), vec.step()) for _ in range(rounds)]
    if cfg.engine == "compiled":  # an eager run gives the same numbers: equality alone would not show the compiled path
        ran = vec.executor.ran
        assert not (why := ran.not_compiled()), f"the compiled run {why}" + (
            f"; the error's end: {ran.failure}" if ran.failure else ""
        )
    worst = 0.0
    for a, b in ((seq.clients, vec.clients), (seq.server, vec.server)):
        for k in a:
            other = b[k].cpu()
            torch.testing.assert_close(other, a[k], **EXACT, msg=lambda s, k=k: f"{k}: {s}")
            if a[k].is_floating_point():
                worst = max(worst, (other - a[k]).abs().max().item() if a[k].numel() else 0.0)
    for r_seq, r_vec in rows:
        assert r_seq["clients"] == r_vec["clients"], "different cohorts"
        for key in ("acc", "train_loss", "test_loss"):
            assert abs(r_seq[key] - r_vec[key]) <= 1e-9 * max(1.0, abs(r_seq[key])), (
                f"{key}: {r_seq[key]} vs {r_vec[key]}"
            )
    return {"max_abs_difference": worst, **(what_ran(vec) if cfg.engine == "compiled" else {})}


def check_backbone(args) -> str:
    """The correctness stage's backbone: --backbone, else cnn4 (the papers' columns'), the MLP in miniature."""
    return args.backbone or ("mlp" if args.smoke else "cnn4")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version({"yaml": "pyyaml"}.get(name, name))
    except importlib.metadata.PackageNotFoundError:
        return None


def _verdict(checks: dict) -> dict:
    failed = [k for k, v in checks.items() if v["status"] == "failed"]
    skipped = [k for k, v in checks.items() if v["status"] == "skipped"]
    line = f"{len(checks) - len(failed) - len(skipped)} of {len(checks)} checks passed"
    line += (f"; FAILED: {', '.join(failed)}" if failed else "") + (
        f"; {len(skipped)} skipped (time)" if skipped else ""
    )
    return {"failed": failed, "line": line}


def _check(deadline: float, fn) -> dict:
    if time.monotonic() > deadline:
        return {"status": "skipped"}
    t0 = time.monotonic()
    try:
        return {"status": "passed", **fn(), "seconds": round(time.monotonic() - t0, 2)}
    except Exception as e:
        return {
            "status": "failed",
            "message": f"{type(e).__name__}: {e}"[:2000],
            "seconds": round(time.monotonic() - t0, 2),
        }


def arguments(description: str, budget_min: float) -> argparse.ArgumentParser:
    """The options the campaign and the GPU check share."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", help="folder with Fashion-MNIST's idx .gz files (not needed with --smoke)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-min", type=float, default=budget_min)
    ap.add_argument("--device", default="auto", help="auto (CUDA when there is one), cuda, cuda:N or cpu")
    ap.add_argument(
        "--smoke", action="store_true", help="every stage in miniature on digits: seconds, for the test suite"
    )
    ap.add_argument(
        "--backbone",
        choices=CHECK_BACKBONES,
        help="the backbone the correctness stage checks each method on (default cnn4, the papers' columns'; the "
        "MLP on digits with --smoke)",
    )
    return ap


def main() -> None:
    ap = arguments(__doc__.split("\n\n")[0], budget_min=25.0)
    ap.add_argument(
        "--stages",
        default=",".join(s.replace(" ", "-") for s in STAGES),
        help="which stages this command runs, comma-separated",
    )
    ap.add_argument("--methods", nargs="+", help="the methods the correctness stage checks (default: all)")
    ap.add_argument(
        "--engine",
        default="eager",
        choices=["eager", "compiled"],
        help="the engine the correctness stage checks on the device",
    )
    ap.add_argument(
        "--speed-methods", nargs="+", default=SPEED_METHODS, help="the methods the speed stage times, in order"
    )
    ap.add_argument(
        "--columns",
        default=",".join(COLUMNS),
        help=f"the papers' columns the real-run stage runs, in order: {', '.join(COLUMNS)}",
    )
    ap.add_argument("--seeds", type=int, default=3, help="runs a method of a column, seeds 0 to N-1 (GPFL's 3 trials)")
    ap.add_argument(
        "--committed",
        default=str(ROOT / "results/gpu"),
        help="where earlier commands' runs of each column are kept (COLUMN/METHOD-seedN): those are not run again",
    )
    args = ap.parse_args()
    if not args.smoke and not args.data:
        ap.error("--data DIR (Fashion-MNIST's idx .gz files) is needed unless --smoke")
    c = Campaign(args)
    stages = {
        "environment": c.environment,
        "correctness": c.correctness,
        "speed": lambda d: speed(c, d),
        "profile": lambda d: profile(c, d),
        "sharing": lambda d: sharing(c, d),
        "real run": lambda d: real_run(c, d),
    }
    for name in STAGES:
        if name in c.stages:
            c.stage(name, stages[name])
    print(f"summary: {c.out / 'summary.md'}")


if __name__ == "__main__":
    main()
