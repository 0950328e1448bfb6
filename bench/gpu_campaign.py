"""The GPU path in one command: does it work, how fast is it, how many runs share a GPU, and a
real-length run, within a time budget, from a source checkout that has only torch & co.

    PYTHONPATH=. python bench/gpu_campaign.py --data DIR --out DIR [--budget-min 25]

DIR for --data holds Fashion-MNIST's four idx .gz files. No Ray, Optuna or install of this
project is needed (the runs are `python -m tuner.cli run` processes). Five stages, in order, each
with its share of the budget; each stage's result is written (campaign.json, summary.md under
--out) as soon as it is done and printed as one line, so a stop loses nothing:

1. environment  device, memory, torch/CUDA versions, TF32, the packages found;
2. correctness  every method and variant, two rounds on digits: vectorized on the device against
                sequential on the CPU in float64 (equal to 1e-9, as the suite); ResNet-18 with
                BatchNorm under vmap likewise; exact resume of a run on the device (deterministic
                algorithms on). FedPAC's QP runs on the device's statistics in its checks.
                A failure is recorded with its message and the campaign goes on;
3. speed        bench/engine_speed.py's measurement (sequential, vectorized, large-batch ceiling),
                then whole rounds (training + evaluation) of GPFL, FedCP and FedPAC in their
                Table 1 Fashion-MNIST settings;
4. sharing      k = 1, 2, 4, 8 runs at once on the one device as separate processes (what Ray's
                fractional GPUs do): total rounds/s against k;
5. real run     GPFL, cnn4, Fashion-MNIST dir:0.1, 20 clients, the paper's 2000 rounds, timed; then,
                in the time left, FedPAC Table 1's Fashion-MNIST pac:20 cells at the paper's 200
                rounds, as many at once as stage 4 found best. Runs land in OUT/runs/ for
                `tuner report`; a run stopped by the budget keeps its rows and checkpoint, so
                `tuner run M --resume --rounds N --out OUT/runs/...` finishes it.

`--smoke` (with `--device cpu`) runs every stage in miniature (one method per family, digits,
two rounds) in seconds: the test suite runs it so the campaign cannot rot.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from algorithms import METHODS  # noqa: E402
from bench.engine_speed import ceiling_rounds_per_second, rounds_per_second  # noqa: E402
from tuner.config import RunConfig  # noqa: E402
from tuner.reproduce import cells  # noqa: E402
from tuner.run import build_simulation  # noqa: E402

SHARES = {"environment": 0.02, "correctness": 0.2, "speed": 0.15, "sharing": 0.13, "real run": 0.5}
PACKAGES = ["torch", "torchvision", "numpy", "scipy", "pandas", "pyarrow", "cvxpy", "osqp", "clarabel", "scs", "typer", "rich", "yaml", "ray", "optuna"]
SMOKE_METHODS = ["fedavg", "gpfl", "fedcp", "fedpac"]  # one per family of the papers' methods
EXACT = dict(rtol=1e-9, atol=1e-9)  # the suite's executor-equality tolerance (tests/test_engine.py)


class Campaign:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = "cuda" if args.device == "auto" and torch.cuda.is_available() else ("cpu" if args.device == "auto" else args.device)
        self.data = str(Path(args.data).resolve()) if args.data else None
        self.start = time.monotonic()
        self.end = self.start + 60 * args.budget_min
        self.results: dict[str, dict] = {}
        self.knee = 1

    # --- budget and bookkeeping
    def left(self) -> float:
        return self.end - time.monotonic()

    def stage(self, name: str, fn) -> None:
        deadline = time.monotonic() + SHARES[name] * 60 * self.args.budget_min
        deadline = min(self.end, deadline) if name != "real run" else self.end
        t0 = time.monotonic()
        try:
            result = fn(deadline)
        except Exception as e:  # a stage that breaks is a finding; the next stage still runs
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=4)}
        result["seconds"] = round(time.monotonic() - t0, 1)
        self.results[name] = result
        self.write()
        print(f"[{name}] {result.get('line', result.get('error', ''))} ({result['seconds']} s)", flush=True)

    def write(self) -> None:
        tmp = self.out / "campaign.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=2, default=str))
        os.replace(tmp, self.out / "campaign.json")
        (self.out / "summary.md").write_text(summary_markdown(self.results))

    def config(self, method: str, **kw) -> RunConfig:
        base = dict(method=method, dataset="fmnist", data_dir=self.data, download=False, device=self.device)
        return RunConfig(**{**base, **kw})

    def digits(self, method: str, **kw) -> RunConfig:
        """The suite's small setting (tests/test_engine.py); smoke: fewer, larger batches."""
        base = dict(method=method, dataset="digits", partition="dir:0.3", clients=6, lr=0.05, join_ratio="0.5-1", val_frac=0.2, dtype="float64")
        if self.args.smoke:
            base |= dict(clients=4, batch_size=40)
        return RunConfig(**{**base, **kw})

    # --- 1
    def environment(self, deadline: float) -> dict:
        env = {"device": self.device, "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
               "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32}  # fmt: skip
        if self.device.startswith("cuda"):
            p = torch.cuda.get_device_properties(self.device)
            env |= {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "capability": f"{p.major}.{p.minor}"}
        else:
            env |= {"name": f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"}
        env["packages"] = {name: _version(name) for name in PACKAGES}
        missing = [n for n in ("cvxpy", "pandas", "pyarrow") if env["packages"][n] is None]
        env["line"] = f"{env['name']}, torch {env['torch']}, CUDA {env['cuda']}" + (f"; missing {', '.join(missing)}" if missing else "")
        return env

    # --- 2
    def correctness(self, deadline: float) -> dict:
        methods = SMOKE_METHODS if self.args.smoke else sorted(METHODS)
        checks = {}
        for m in methods:
            checks[f"executors equal: {m}"] = _check(deadline, lambda m=m: self.executors_equal(self.digits(m)))
        resnet = dict(clients=12, join_ratio="0.25", backbone="resnet18", partition="iid", lr=0.01, batch_size=30, cohort_chunk=2)
        if self.args.smoke:
            # FedPAC's small clients (60 samples, two steps each): BatchNorm under vmap, not training, is checked
            resnet |= dict(clients=4, join_ratio="0.5", partition="pac:20", pac_train=60, pac_test=20, batch_size=30)
        checks["ResNet-18 BatchNorm under vmap"] = _check(deadline, lambda: self.executors_equal(self.digits("fedper", **resnet), rounds=1))
        checks["exact resume on the device"] = _check(deadline, self.exact_resume)
        failed = [k for k, v in checks.items() if v["status"] == "failed"]
        skipped = [k for k, v in checks.items() if v["status"] == "skipped"]
        line = f"{len(checks) - len(failed) - len(skipped)} of {len(checks)} checks passed"
        line += (f"; FAILED: {', '.join(failed)}" if failed else "") + (f"; {len(skipped)} skipped (time)" if skipped else "")
        return {"checks": checks, "failed": failed, "line": line}

    def executors_equal(self, cfg: RunConfig, rounds: int = 2) -> dict:
        """Vectorized on the campaign's device against sequential on the CPU: parameters and metrics."""
        seq = build_simulation(replace(cfg, executor="sequential", device="cpu"))
        vec = build_simulation(replace(cfg, executor="vectorized", device=self.device))
        rows = [(seq.step(), vec.step()) for _ in range(rounds)]
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
                assert abs(r_seq[key] - r_vec[key]) <= 1e-9 * max(1.0, abs(r_seq[key])), f"{key}: {r_seq[key]} vs {r_vec[key]}"
        return {"max_abs_difference": worst}

    def exact_resume(self) -> dict:
        """Three rounds straight against one round, a saved and restored state, and two more, on the device."""
        cfg = replace(self.digits("fedrep", join_ratio="0.6-1"), dtype="float32", device=self.device, deterministic=True)
        straight = build_simulation(cfg)
        rows = [straight.step() for _ in range(3)]
        first = build_simulation(cfg)
        first.step()
        state = first.state_dict()
        resumed = build_simulation(cfg)
        resumed.load_state_dict(state)
        later = [resumed.step() for _ in range(2)]
        for a, b in zip(rows[1:], later):
            for key in ("acc", "train_loss", "test_loss"):
                assert a[key] == b[key], f"round {a['round']} {key}: {a[key]} straight, {b[key]} resumed"
        for k in straight.clients:
            assert torch.equal(straight.clients[k], resumed.clients[k]), f"{k} differs after resume"
        return {"rounds": 3}

    # --- 3
    def speed(self, deadline: float) -> dict:
        rounds = 1 if self.args.smoke else 2
        if self.args.smoke:
            base = self.digits("fedavg", dtype="float32", eval_gap=10**6, device=self.device)
        else:
            base = self.config("fedavg", partition="dir:0.1", clients=20, batch_size=10, local_epochs=1, eval_gap=10**6, backbone="cnn4")
        sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
        out: dict = {}
        for executor in ("vectorized", "sequential"):
            if time.monotonic() > deadline:
                break
            sim = build_simulation(replace(base, executor=executor))
            out[f"fedavg {executor} s/round"] = 1 / rounds_per_second(sim, rounds, sync)
        if time.monotonic() < deadline:
            out["fedavg ceiling s/round"] = 1 / ceiling_rounds_per_second(sim, rounds, sync)
        if "fedavg sequential s/round" in out:
            out["vectorized / sequential"] = out["fedavg sequential s/round"] / out["fedavg vectorized s/round"]
        if "fedavg ceiling s/round" in out:
            out["ceiling time / vectorized time"] = out["fedavg ceiling s/round"] / out["fedavg vectorized s/round"]
        for method, cell in self.table_settings().items():
            if time.monotonic() > deadline:
                break
            out[f"{method} whole round s"] = 1 / rounds_per_second(build_simulation(replace(cell, executor="vectorized")), rounds, sync)
        parts = [f"{k} {v:.3g}" for k, v in out.items()]
        return {"figures": out, "line": "; ".join(parts) if parts else "no time left"}

    def table_settings(self) -> dict[str, RunConfig]:
        if self.args.smoke:
            return {m: self.digits(m, dtype="float32", device=self.device) for m in ("gpfl", "fedcp", "fedpac")}
        return {
            "gpfl": self.config("gpfl", partition="dir:0.1", clients=20),
            "fedcp": self.config("fedcp", partition="dir:0.1", clients=20),
            "fedpac": self.config("fedpac", partition="pac:20", clients=20, protocol="fedpac"),
        }

    # --- 4
    def sharing(self, deadline: float) -> dict:
        ks = [1, 2] if self.args.smoke else [1, 2, 4, 8]
        rounds = 2 if self.args.smoke else 12
        spec = ["fedavg", "--dataset", "digits", "--partition", "dir:0.3", "--clients", "4"] if self.args.smoke else \
               ["fedavg", "--dataset", "fmnist", "--partition", "dir:0.1", "--clients", "20", "--set", "backbone=cnn4"]  # fmt: skip
        rates = {}
        for k in ks:
            if time.monotonic() > deadline:
                break
            dirs = [self.out / "sharing" / f"k{k}-{i}" for i in range(k)]
            procs = [tuner_run([*spec, "--rounds", str(rounds), "--set", f"eval_gap={rounds}", "--set", f"seed={i}", "--out", str(d)], self)
                     for i, d in enumerate(dirs)]  # fmt: skip
            finished = wait_all(procs, deadline)
            if not finished:
                break
            # Steady-state throughput: rounds after each process's first, over the time they took.
            per_process = [(rounds - 1) / pd.read_parquet(d / "metrics.parquet")["time_s"].iloc[1:].sum() for d in dirs]
            rates[k] = sum(per_process)
        for fewer, more in zip(rates, list(rates)[1:]):  # the knee: more runs only while they add 10 % or more
            if rates[more] < 1.1 * rates[fewer]:
                break
            self.knee = more
        line = ", ".join(f"k={k}: {v:.2f} rounds/s" for k, v in rates.items()) + (f"; best k = {self.knee}" if rates else "no time left")
        return {"rounds_per_second": rates, "best_k": self.knee, "line": line}

    # --- 5
    def real_run(self, deadline: float) -> dict:
        runs = self.out / "runs"
        if self.args.smoke:
            gpfl = ["gpfl", "--dataset", "digits", "--partition", "dir:0.3", "--clients", "4", "--rounds", "2"]
            table = [dict(method="fedpac", partition="dir:0.3", clients=4)]
            cell_args = lambda c: [c["method"], "--dataset", "digits", "--partition", c["partition"], "--clients", str(c["clients"]), "--rounds", "2"]  # noqa: E731
        else:
            gpfl = ["gpfl", "--dataset", "fmnist", "--partition", "dir:0.1", "--clients", "20", "--rounds", "2000", "--set", "checkpoint_every=50"]
            table = [c for c in cells("fedpac-table1", ["fmnist"], data_dir=self.data)[0] if c["partition"] == "pac:20"]
            cell_args = lambda c: [c["method"], "--dataset", "fmnist", "--partition", c["partition"], "--clients", str(c["clients"]),  # noqa: E731
                                   "--rounds", "200", "--set", "protocol=fedpac", "--set", "checkpoint_every=20"]  # fmt: skip
        out: dict = {}
        t0 = time.monotonic()
        gpfl_dir = runs / "dir-gpfl"
        finished = wait_all([tuner_run([*gpfl, "--out", str(gpfl_dir)], self)], t0 + 0.6 * (deadline - t0))
        out["gpfl"] = run_figures(gpfl_dir, finished, time.monotonic() - t0)
        pending = list(table)
        done = []
        while pending and time.monotonic() < deadline:
            batch, pending = pending[: self.knee], pending[self.knee :]
            t1 = time.monotonic()
            dirs = [runs / f"pac-{c['method']}" for c in batch]
            finished = wait_all([tuner_run([*cell_args(c), "--out", str(d)], self) for c, d in zip(batch, dirs)], deadline)
            for c, d in zip(batch, dirs):
                out[f"pac-{c['method']}"] = run_figures(d, finished, time.monotonic() - t1)
            done += [c["method"] for c in batch]
        g = out["gpfl"]
        line = f"GPFL {g['rounds']} rounds in {g['seconds']:.0f} s ({g['s_per_round']:.3g} s/round, best {g['best_acc']:.4f})"
        line += f"; FedPAC Table 1 cells run: {len(done)} of {len(table)}"
        return {"runs": out, "line": line}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version({"yaml": "pyyaml"}.get(name, name))
    except importlib.metadata.PackageNotFoundError:
        return None


def _check(deadline: float, fn) -> dict:
    if time.monotonic() > deadline:
        return {"status": "skipped"}
    t0 = time.monotonic()
    try:
        return {"status": "passed", **fn(), "seconds": round(time.monotonic() - t0, 2)}
    except Exception as e:
        return {"status": "failed", "message": f"{type(e).__name__}: {e}"[:2000], "seconds": round(time.monotonic() - t0, 2)}


def tuner_run(args: list[str], campaign: Campaign) -> subprocess.Popen:
    """A `tuner run` process on the campaign's device (no Ray: what a trial does, without Tune); its output goes to OUT.log."""
    extra = ["--set", f"device={campaign.device}"] + (["--set", f"data_dir={campaign.data}"] if campaign.data else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run_dir = Path(args[args.index("--out") + 1])
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.with_name(run_dir.name + ".log")
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "run", *args, *extra], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    proc.log = str(log)
    return proc


def wait_all(procs: list[subprocess.Popen], deadline: float) -> bool:
    """Wait for every process until the deadline; past it, stop them as a scheduler would (SIGTERM: rows are kept).
    True when all finished in time; a run that fails raises with the last line of its output."""
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    stopped = [p for p in procs if p.poll() is None]
    for p in stopped:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait()
    for p in procs:
        if p.returncode != 0 and p not in stopped:
            last = (Path(p.log).read_text().strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{' '.join(p.args[3:5])} exited with {p.returncode}: {last} (log: {p.log})")
    return not stopped


def run_figures(run_dir: Path, finished: bool, seconds: float) -> dict:
    metrics = run_dir / "metrics.parquet"
    if not metrics.exists():
        return {"rounds": 0, "finished": False, "seconds": seconds, "s_per_round": float("nan"), "best_acc": float("nan")}
    m = pd.read_parquet(metrics)
    return {"rounds": int(m["round"].max()), "finished": finished, "seconds": seconds, "s_per_round": float(m["time_s"].median()),
            "best_acc": float(m["acc"].max()), "final_acc": float(m["acc"].dropna().iloc[-1]), "dir": str(run_dir)}  # fmt: skip


def summary_markdown(results: dict) -> str:
    lines = ["# GPU campaign", ""]
    env = results.get("environment", {})
    if env:
        lines += [f"Device: {env.get('name')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, TF32 matmul {env.get('tf32_matmul')}", ""]
    lines += ["| stage | result | seconds |", "|:--|:--|--:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r.get('line', r.get('error', ''))} | {r['seconds']} |")
    speed = results.get("speed", {}).get("figures", {})
    if speed:
        lines += ["", "| speed figure | value |", "|:--|--:|"] + [f"| {k} | {v:.4g} |" for k, v in speed.items()]
    runs = results.get("real run", {}).get("runs", {})
    if runs:
        lines += ["", "| run | rounds | finished | s/round | best acc | final acc |", "|:--|--:|:--|--:|--:|--:|"]
        lines += [f"| {k} | {r['rounds']} | {r['finished']} | {r['s_per_round']:.3g} | {r['best_acc']:.4f} | {r.get('final_acc', float('nan')):.4f} |"
                  for k, r in runs.items()]  # fmt: skip
    failed = results.get("correctness", {}).get("checks", {})
    bad = {k: v for k, v in failed.items() if v["status"] == "failed"}
    if bad:
        lines += ["", "Failed checks:", ""] + [f"- {k}: {v['message'].splitlines()[0]}" for k, v in bad.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="folder with Fashion-MNIST's idx .gz files (not needed with --smoke)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-min", type=float, default=25.0)
    ap.add_argument("--device", default="auto", help="auto (CUDA when there is one), cuda, cuda:N or cpu")
    ap.add_argument("--smoke", action="store_true", help="every stage in miniature on digits: seconds, for the test suite")
    args = ap.parse_args()
    if not args.smoke and not args.data:
        ap.error("--data DIR (Fashion-MNIST's idx .gz files) is needed unless --smoke")
    c = Campaign(args)
    for name, fn in (("environment", c.environment), ("correctness", c.correctness), ("speed", c.speed), ("sharing", c.sharing), ("real run", c.real_run)):
        c.stage(name, fn)
    print(f"summary: {c.out / 'summary.md'}")


if __name__ == "__main__":
    main()
