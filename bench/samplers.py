"""TPE against random search at equal trials: one method's shipped space searched by Optuna's TPE (a third of its
trials drawn at random first, tuner/sweep/space.py tpe_startup) and by random sampling, the same trials, rounds and
stopping, over several sweep seeds (the seed draws the sampler's draws and seeds the runs). For each sweep: the
best trial's validation accuracy and the test accuracy at its round (`select: val`). TPE − random is paired over the
seeds (the same seed: the same first point, partition and run seeds), with its 95 % t interval.

    python bench/samplers.py --method ditto --seeds 0 1 2 3 4 --json results/bench/samplers-digits.json

Each sweep is a `tuner sweep` subprocess on local Ray, under OUT/ (a temporary folder unless --keep names one; a
finished sweep there is read, not run again)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from bench import provenance  # noqa: E402
from tuner.report.intervals import difference  # noqa: E402
from tuner.sweep.space import tpe_startup  # noqa: E402

SAMPLERS = ("tpe", "random")


def sweep(method: str, sampler: str, seed: int, args, storage: Path) -> dict:
    """The sweep's best trial (summary.yaml's): its validation accuracy and the test accuracy at its round."""
    name = f"{method}-{sampler}-seed{seed}"
    if not (storage / name / "summary.yaml").exists():
        search = yaml.safe_load((ROOT / "search_spaces" / f"{method}.yaml").read_text())["search"]
        settings = {"dataset": args.dataset, "partition": args.partition, "clients": args.clients}
        settings |= {"rounds": args.rounds, "seed": seed}
        file = storage / f"{name}.yaml"
        space = {"settings": settings, "search": search, "sampler": sampler, "samples": args.trials, "select": "val"}
        file.write_text(yaml.safe_dump(space | {"stop": {"grace": args.rounds}}, sort_keys=False))  # no early stop
        command = [sys.executable, "-m", "tuner.cli", "sweep", method, "--space", str(file), "--storage", str(storage)]
        subprocess.run([*command, "--name", name], check=True, cwd=ROOT, capture_output=True)
    best = yaml.safe_load((storage / name / "summary.yaml").read_text())["best"]
    return {"best_val_acc": best["best_val_acc"], "selected_acc": best["selected_acc"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="ditto")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--partition", default="dir:0.1")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--keep", type=Path, help="where the sweeps go and stay [default: a temporary folder]")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    storage = args.keep or Path(tempfile.mkdtemp())
    storage.mkdir(parents=True, exist_ok=True)
    sweeps = {s: [sweep(args.method, s, seed, args, storage) for seed in args.seeds] for s in SAMPLERS}
    figures: dict = {
        "setting": {k: getattr(args, k) for k in ("method", "seeds", "trials", "dataset", "partition", "clients")}
        | {"rounds": args.rounds, "tpe_random_start": tpe_startup(args.trials)},
        "sweeps": sweeps,
    }
    for figure in ("best_val_acc", "selected_acc"):
        d = difference(*[[s[figure] for s in sweeps[name]] for name in SAMPLERS], paired=True)
        figures[f"tpe_minus_random {figure}"] = {"mean": d.mean, "low": d.low, "high": d.high, "p": d.p}
        print(f"{figure}: TPE − random {d.points()}, p {d.p:.3f}")
    if args.json:
        provenance.write(args.json, figures)


if __name__ == "__main__":
    main()
