"""The GPU path in ten-minute commands: does it work, how fast is it, where does a step's time go,
how many runs share a GPU, and real-length runs, from a source checkout that has only torch & co.

    PYTHONPATH=. python bench/gpu_campaign.py --data DIR --out DIR [--stages S,S] [--budget-min 9]

DIR for --data holds Fashion-MNIST's four idx .gz files. No Ray, Optuna or install of this
project is needed (the runs are `python -m tuner.cli run` processes). A command runs the stages it
names (default: all), in this order, each with its share of --budget-min (this command's time);
each stage's result is merged into OUT/campaign.json and OUT/summary.md as soon as it is done and
printed as one line, so a stop loses nothing and later commands add to what earlier ones wrote:

1. environment  device, memory, torch/CUDA versions, TF32, the packages found;
2. correctness  each method (--methods, default all), two rounds on digits: vectorized on the device
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
                runs 2000 iterations), as many at once as the knee. FedCP's Table 2 has no
                Fashion-MNIST column (its MNIST ones need full MNIST). Runs land in
                OUT/runs/COLUMN/METHOD for `tuner report`; a run stopped by the budget keeps its rows
                and last checkpoint (every 5 rounds, 10 for 2000-round runs), and the next command's
                real run resumes it; a finished run is never started again.

`--smoke` (with `--device cpu`) runs every stage in miniature (one method per family, digits,
two rounds) in seconds: the test suite runs it so the campaign cannot rot.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from algorithms import METHODS  # noqa: E402
from bench.engine_speed import measure, table1  # noqa: E402
from tuner.config import RunConfig  # noqa: E402
from tuner import papers  # noqa: E402
from tuner.reproduce import cells  # noqa: E402
from tuner.run import build_simulation  # noqa: E402

SHARES = {"environment": 0.02, "correctness": 0.2, "speed": 0.15, "profile": 0.05, "sharing": 0.13, "real run": 0.45}
STAGES = list(SHARES)
PACKAGES = ["torch", "torchvision", "numpy", "scipy", "pandas", "pyarrow", "cvxpy", "osqp", "clarabel", "scs", "typer", "rich", "yaml", "ray", "optuna"]
SMOKE_METHODS = ["fedavg", "gpfl", "fedcp", "fedpac"]  # one per family of the papers' methods
SPEED_METHODS = ["fedavg", "gpfl", "fedcp", "fedpac", "pfedme", "pfedhn", "fedem"]  # the targets: Table 1 settings; the last three ≤ 3× FedAvg
EXACT = dict(rtol=1e-9, atol=1e-9)  # the suite's executor-equality tolerance (tests/test_engine.py)
# The papers' Fashion-MNIST columns: name -> (table, partition, clients, checkpoint_every)
COLUMNS = {
    "fedpac-20": ("fedpac-table1", "pac:20", 20, 5),
    "gpfl-dir": ("gpfl-table1", "dir:0.1", 20, 10),
    "gpfl-pat": ("gpfl-table1", "pat:2", 20, 10),
    "fedpac-100": ("fedpac-table1", "pac:20", 100, 5),
}


class Campaign:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = "cuda" if args.device == "auto" and torch.cuda.is_available() else ("cpu" if args.device == "auto" else args.device)
        self.data = str(Path(args.data).resolve()) if args.data else None
        self.start = time.monotonic()
        self.end = self.start + 60 * args.budget_min
        self.stages = [name.strip().replace("-", " ") for name in args.stages.split(",")]
        unknown = [name for name in self.stages if name not in SHARES]
        if unknown:
            raise SystemExit(f"Unknown stage {unknown[0]!r}; choose from {', '.join(n.replace(' ', '-') for n in STAGES)}.")
        path = self.out / "campaign.json"
        self.results: dict[str, dict] = json.loads(path.read_text()) if path.exists() else {}  # what earlier commands found
        self.knee = self.results.get("sharing", {}).get("best_k", 1)

    # --- budget and bookkeeping
    def left(self) -> float:
        return self.end - time.monotonic()

    def stage(self, name: str, fn) -> None:
        share = SHARES[name] / sum(SHARES[n] for n in self.stages if n in SHARES) if name in self.stages else SHARES[name]
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
        if name == "correctness" and "checks" in self.earlier and "checks" in result:  # commands check parts of the methods
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
        methods = self.args.methods or (SMOKE_METHODS if self.args.smoke else sorted(METHODS))
        engine = self.args.engine
        label = "executors equal" + ("" if engine == "eager" else f" ({engine})")
        checks = {}
        for m in methods:
            checks[f"{label}: {m}"] = _check(deadline, lambda m=m: self.executors_equal(self.digits(m, engine=engine)))
            self.progress({"checks": checks, **_verdict(checks)})
        resnet = dict(clients=12, join_ratio="0.25", backbone="resnet18", partition="iid", lr=0.01, batch_size=30, cohort_chunk=2)
        if self.args.smoke:
            # FedPAC's small clients (60 samples, two steps each): BatchNorm under vmap, not training, is checked
            resnet |= dict(clients=4, join_ratio="0.5", partition="pac:20", pac_train=60, pac_test=20, batch_size=30)
        checks["ResNet-18 BatchNorm under vmap"] = _check(deadline, lambda: self.executors_equal(self.digits("fedper", **resnet), rounds=1))
        checks["exact resume on the device"] = _check(deadline, self.exact_resume)
        return {"checks": checks, **_verdict(checks)}

    def executors_equal(self, cfg: RunConfig, rounds: int = 2) -> dict:
        """Vectorized on the campaign's device against sequential on the CPU: parameters and metrics."""
        seq = build_simulation(replace(cfg, executor="sequential", device="cpu", engine="eager"))
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
        out: dict = {}
        for method in ["fedavg"] if self.args.smoke else SPEED_METHODS:  # smoke: every figure's code, once
            if time.monotonic() > deadline:
                break
            smoke = dict(dataset="digits", partition="dir:0.3", clients=4, batch_size=40, backbone="mlp")  # the bench's code, in seconds
            out[method] = measure(method, self.device, rounds=1, **smoke) if self.args.smoke else measure(method, self.device, rounds=2, data_dir=self.data)
        parts = [f"{m} {r['eager s/round']:.3g} -> {r['compiled s/round']:.3g} s/round (compile + first round {r['compile + first round s']:.0f} s, "
                 f"a second trial's {r['second trial: compile + first round s']:.1f} s)" for m, r in out.items()]
        return {"figures": out, "line": "; ".join(parts) if parts else "no time left"}

    # --- 4
    def profile(self, deadline: float) -> dict:
        """20 compiled steps of GPFL's Table 1 cohort (smoke: digits) under torch.profiler."""
        from torch.profiler import ProfilerActivity, profile

        if self.args.smoke:
            cfg = self.digits("gpfl", dtype="float32", device=self.device, engine="compiled", executor="vectorized")
        else:
            cfg = table1("gpfl", self.device, data_dir=self.data, engine="compiled")
        sim = build_simulation(cfg)
        ids = list(range(sim.data.num_clients))
        at = sim.at(1, ids)
        phases = [replace(p, steps=20) for p in sim.method.phases()]
        cohort = {k: v.clone() for k, v in sim.clients.items()}
        sim.executor.train(phases, cohort, sim.server, at, 0)  # compiles the programs these steps need
        sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.startswith("cuda") else [])
        sync()
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            sim.executor.train(phases, cohort, sim.server, at, 0)
            sync()
        wall = time.perf_counter() - t0
        device_time = "device_time" if self.device.startswith("cuda") else "cpu_time"
        events = prof.key_averages()
        top = sorted(events, key=lambda e: getattr(e, f"self_{device_time}_total"), reverse=True)[:10]
        kernels = [{"name": e.key[:80], "calls": e.count, "ms": getattr(e, f"self_{device_time}_total") / 1e3} for e in top]
        busy = sum(getattr(e, f"self_{device_time}_total") for e in events) / 1e6 / wall if self.device.startswith("cuda") else float("nan")
        line = f"20 steps in {wall:.3f} s; device busy {100 * busy:.0f} % of the wall time; top: {kernels[0]['name']} ({kernels[0]['ms']:.1f} ms)"
        return {"wall_s": wall, "device_busy_share": busy, "top": kernels, "line": line}

    # --- 5
    def sharing(self, deadline: float) -> dict:
        """Total rounds/s of k runs at once, then the same under CUDA MPS where the node has it (Ray does not
        start MPS, so the knee, which sets tuner sweep's default share of a GPU, is taken without it)."""
        ks = [1, 2] if self.args.smoke else [1, 2, 4, 8, 16]
        rates = self.rates_sharing(ks, deadline, "plain")
        for fewer, more in zip(rates, list(rates)[1:]):  # the knee: more runs only while they add 10 % or more
            if rates[more] < 1.1 * rates[fewer]:
                break
            self.knee = more
        out = {"rounds_per_second": rates, "best_k": self.knee}
        line = ", ".join(f"k={k}: {v:.2f} rounds/s" for k, v in rates.items()) + (f"; best k = {self.knee}" if rates else "no time left")
        mps = shutil.which("nvidia-cuda-mps-control") if self.device.startswith("cuda") else None
        if mps and time.monotonic() < deadline:
            with mps_daemon(mps, self.out / "mps"):
                out["rounds_per_second_mps"] = with_mps = self.rates_sharing(ks, deadline, "mps")
            line += "; with MPS " + ", ".join(f"k={k}: {v:.2f}" for k, v in with_mps.items())
        else:
            line += "; MPS: " + ("no time left" if mps else "not on this node")
        return {**out, "line": line}

    def rates_sharing(self, ks: list[int], deadline: float, label: str) -> dict[int, float]:
        rounds = 2 if self.args.smoke else 12
        spec = ["fedavg", "--dataset", "digits", "--partition", "dir:0.3", "--clients", "4"] if self.args.smoke else \
               ["gpfl", "--dataset", "fmnist", "--partition", "dir:0.1", "--clients", "20"]  # fmt: skip
        rates = {}
        for k in ks:
            if time.monotonic() > deadline:
                break
            dirs = [self.out / "sharing" / label / f"k{k}-{i}" for i in range(k)]
            for d in dirs:  # a measurement, never resumed from an earlier command's
                shutil.rmtree(d, ignore_errors=True)
            procs = [tuner_run([*spec, "--rounds", str(rounds), "--set", f"eval_gap={rounds}", "--set", f"seed={i}", "--out", str(d)], self)
                     for i, d in enumerate(dirs)]  # fmt: skip
            if not wait_all(procs, deadline):
                break
            # Steady-state throughput: rounds after each process's first (which compiles), over the time they took.
            per_process = [(rounds - 1) / pd.read_parquet(d / "metrics.parquet")["time_s"].iloc[1:].sum() for d in dirs]
            rates[k] = sum(per_process)
        return rates

    # --- 6
    def real_run(self, deadline: float) -> dict:
        """The papers' Fashion-MNIST columns (--columns) at their length, `knee` runs at once; an unfinished run resumes next command."""
        runs = self.out / "runs"
        todo = []  # (column, method, tuner run arguments, rounds)
        for column in self.args.columns.split(","):
            if column not in COLUMNS:
                raise SystemExit(f"Unknown column {column!r}; choose from {', '.join(COLUMNS)}.")
            table, partition, clients, checkpoint_every = COLUMNS[column]
            paper = papers.TABLES[table].paper
            rounds = 2 if self.args.smoke else papers.PAPERS[paper].rounds
            if self.args.smoke:  # a miniature of the column: two of its table's methods, digits, four clients, two rounds
                published = papers.load_tables().query("paper == @paper and table == @papers.TABLES[@table].name")["method"].unique()[:2]
                column_cells = [dict(method=papers.method_of(paper, label), dataset="digits", partition="dir:0.3", clients=4, join_ratio="1",
                                     backbone="mlp", protocol=papers.PAPERS[paper].protocol) for label in published]  # fmt: skip
            else:
                column_cells = [c for c in cells(table, ["fmnist"], data_dir=self.data)[0] if c["partition"] == partition and c["clients"] == clients]
            for c in column_cells:
                args = [c["method"], "--dataset", c["dataset"], "--partition", c["partition"], "--clients", str(c["clients"]),
                        "--rounds", str(rounds), "--set", f"protocol={c['protocol']}", "--set", f"join_ratio={c['join_ratio']}",
                        "--set", f"backbone={c['backbone']}", "--set", f"checkpoint_every={checkpoint_every}"]  # fmt: skip
                todo.append((column, c["method"], args, rounds))
        out: dict = {}
        pending = [t for t in todo if not finished(runs / t[0] / t[1], t[3])]
        for column, method, _, rounds in todo:
            if (column, method) not in {(t[0], t[1]) for t in pending}:
                out[f"{column}/{method}"] = run_figures(runs / column / method, True, 0.0)
        while pending and time.monotonic() < deadline:
            batch, pending = pending[: self.knee], pending[self.knee :]
            t1 = time.monotonic()
            dirs = [runs / column / method for column, method, _, _ in batch]
            done = wait_all([tuner_run([*args, "--out", str(d)], self) for (_, _, args, _), d in zip(batch, dirs)], deadline)
            for (column, method, _, rounds), d in zip(batch, dirs):
                out[f"{column}/{method}"] = run_figures(d, done or finished(d, rounds), time.monotonic() - t1)
        complete = sum(v["finished"] for v in out.values())
        line = f"{complete} of {len(todo)} runs at their paper's length ({', '.join(self.args.columns.split(','))})"
        line += "; " + ", ".join(f"{k} {v['rounds']} r" for k, v in out.items() if not v["finished"]) if complete < len(todo) else ""
        return {"runs": out, "line": line}


def finished(run_dir: Path, rounds: int) -> bool:
    metrics = run_dir / "metrics.parquet"
    return metrics.exists() and pd.read_parquet(metrics)["round"].max() >= rounds


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


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version({"yaml": "pyyaml"}.get(name, name))
    except importlib.metadata.PackageNotFoundError:
        return None


def _verdict(checks: dict) -> dict:
    failed = [k for k, v in checks.items() if v["status"] == "failed"]
    skipped = [k for k, v in checks.items() if v["status"] == "skipped"]
    line = f"{len(checks) - len(failed) - len(skipped)} of {len(checks)} checks passed"
    line += (f"; FAILED: {', '.join(failed)}" if failed else "") + (f"; {len(skipped)} skipped (time)" if skipped else "")
    return {"failed": failed, "line": line}


def _check(deadline: float, fn) -> dict:
    if time.monotonic() > deadline:
        return {"status": "skipped"}
    t0 = time.monotonic()
    try:
        return {"status": "passed", **fn(), "seconds": round(time.monotonic() - t0, 2)}
    except Exception as e:
        return {"status": "failed", "message": f"{type(e).__name__}: {e}"[:2000], "seconds": round(time.monotonic() - t0, 2)}


def tuner_run(args: list[str], campaign: Campaign) -> subprocess.Popen | None:
    """A `tuner run` process on the campaign's device (no Ray: what a trial does, without Tune); its output goes to OUT.log.
    A run folder with a checkpoint (an earlier command's run, stopped by its budget) is resumed; one that an earlier
    command finished is not started again (None)."""
    run_dir = Path(args[args.index("--out") + 1])
    metrics = run_dir / "metrics.parquet"
    if metrics.exists() and pd.read_parquet(metrics)["round"].max() >= int(args[args.index("--rounds") + 1]):
        return None
    if (run_dir / "checkpoint.pt").exists():
        args = [args[0], "--resume", "--rounds", args[args.index("--rounds") + 1], "--out", str(run_dir)]
    extra = ["--set", f"device={campaign.device}"] + (["--set", f"data_dir={campaign.data}"] if campaign.data else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.with_name(run_dir.name + ".log")
    with open(log, "a") as out:  # the child keeps its own copy of the descriptor; a resumed run's log goes on
        proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "run", *args, *extra], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    proc.log = str(log)
    return proc


def wait_all(procs: list[subprocess.Popen], deadline: float) -> bool:
    """Wait for every process until the deadline; past it, stop them as a scheduler would (SIGTERM: rows are kept).
    True when all finished in time; a run that fails raises with the last line of its output."""
    procs = [p for p in procs if p is not None]  # runs finished by an earlier command
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
        names = list(dict.fromkeys(k for r in speed.values() for k in r))
        lines += ["", "| method | " + " | ".join(names) + " |", "|:--|" + "--:|" * len(names)]
        lines += [f"| {m} | " + " | ".join(f"{r[n]:.4g}" if n in r else "" for n in names) + " |" for m, r in speed.items()]
    top = results.get("profile", {}).get("top", [])
    if top:
        lines += ["", "| profiled kernel (20 steps) | calls | ms |", "|:--|--:|--:|"] + [f"| `{k['name']}` | {k['calls']} | {k['ms']:.2f} |" for k in top]
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
    ap.add_argument("--stages", default=",".join(s.replace(" ", "-") for s in STAGES), help="which stages this command runs, comma-separated")
    ap.add_argument("--methods", nargs="+", help="the methods the correctness stage checks (default: all)")
    ap.add_argument("--engine", default="eager", choices=["eager", "compiled"], help="the engine the correctness stage checks on the device")
    ap.add_argument("--columns", default=",".join(COLUMNS), help=f"the papers' columns the real-run stage runs, in order: {', '.join(COLUMNS)}")
    args = ap.parse_args()
    if not args.smoke and not args.data:
        ap.error("--data DIR (Fashion-MNIST's idx .gz files) is needed unless --smoke")
    c = Campaign(args)
    stages = {"environment": c.environment, "correctness": c.correctness, "speed": c.speed, "profile": c.profile, "sharing": c.sharing,
              "real run": c.real_run}  # fmt: skip
    for name in STAGES:
        if name in c.stages:
            c.stage(name, stages[name])
    print(f"summary: {c.out / 'summary.md'}")


if __name__ == "__main__":
    main()
