"""PFLlib's roster on the pages: docs/methods.md's and README.md's tables and figures are the committed runs
(results/roster-digits, results/roster-fmnist, results/roster-fmnist-resnet18)."""

import json
from pathlib import Path

import pandas as pd
import yaml

from algorithms import METHODS

ROOT = Path(__file__).resolve().parents[1]


def methods_page_table(heading: str) -> tuple[str, list[list[str]]]:
    """docs/methods.md from `heading` on, and the rows of the first table after it, cells stripped."""
    page = (ROOT / "docs" / "methods.md").read_text()
    section = page[page.index(heading) :]
    table = next(block for block in section.split("\n\n") if block.startswith("| method |"))
    return section, [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]


def test_the_roster_table_on_the_methods_page_is_the_committed_runs():
    _, rows = methods_page_table("PFLlib's roster against its neighbours")
    by_title = {cls.title: name for name, cls in METHODS.items()}
    assert len(rows) == 21 and {r[0] for r in rows} >= {"FedALA", "FedCross", "FedKD", "FedGen", "APPLE"}
    for title, *cells in rows:
        name = by_title[title]
        run = (
            ROOT / "results" / ("baselines30/digits-dir0.1" if name in ("local", "fedavg") else "roster-digits") / name
        )
        acc = pd.read_parquet(run / "metrics.parquet").set_index("round")["acc"] * 100
        assert [float(c) for c in cells] == [round(acc[r], 2) for r in (1, 5, 10, 20, 30)] + [round(acc.max(), 2)], (
            title
        )


def test_the_fashion_mnist_roster_table_is_the_committed_runs_of_every_method():
    section, rows = methods_page_table("PFLlib's roster on Fashion-MNIST")
    runs = ROOT / "results" / "roster-fmnist"
    by_title = {cls.title: name for name, cls in METHODS.items()}
    shown = [by_title[r[0]] for r in rows]
    for name, (_, *cells, device) in zip(shown, rows, strict=True):
        run = pd.read_parquet(runs / name / "metrics.parquet").set_index("round")
        assert run.index.max() == 30, name
        acc = run["acc"] * 100
        assert [float(c) for c in cells] == [round(acc[r], 2) for r in (1, 10, 30)] + [round(acc.max(), 2)], name
        config = yaml.safe_load((runs / name / "config.yaml").read_text())
        assert (config["method"], config["rounds"], config["partition"], config["clients"]) == (name, 30, "dir:0.1", 20)
        assert config["device"].split(":")[0] == device, name
    assert shown[:2] == ["local", "fedavg"] and len(set(shown)) == len(shown)
    assert set(shown) == {n for n, m in METHODS.items() if m.origin == "roster" and not m.family} - {"fedbn"} | {
        "local",
        "fedavg",
    }  # every roster method
    assert "FedBN is not in the table" in section
    # the page's CPU-against-GPU statement for FedAvg
    cpu, gpu = (
        pd.read_parquet(ROOT / "results" / f / "metrics.parquet").set_index("round")["acc"] * 100
        for f in ("roster-fmnist/fedavg", "roster-fmnist-cuda/fedavg")
    )
    assert round((cpu - gpu).abs().max(), 2) <= 0.09 and "within 0.09 points of its CPU row" in section


def test_fedbns_resnet18_row_is_its_committed_runs_beside_fedavg_and_local_only_on_that_backbone():
    """FedBN's row, on ResNet-18 (cnn4 has no batch norm): the methods page's table, its sentences and README's line,
    each figure from the three runs that shared one H200."""
    section, rows = methods_page_table("FedBN on ResNet-18")
    section = " ".join(section.split())
    runs = ROOT / "results" / "roster-fmnist-resnet18"
    by_title = {cls.title: name for name, cls in METHODS.items()}
    acc, times = {}, []
    for title, *cells, device in rows:
        name = by_title[title]
        run = pd.read_parquet(runs / name / "metrics.parquet").set_index("round")
        config = yaml.safe_load((runs / name / "config.yaml").read_text())
        assert (config["method"], config["partition"], config["clients"], config["backbone"], config["seed"]) == (
            name,
            "dir:0.1",
            20,
            "resnet18",
            0,
        )
        assert (
            config["device"].split(":")[0] == device == "cuda"
            and run.index.max() == 12
            and set(run["engine"]) == {"eager"}
        )
        acc[name] = run["acc"] * 100
        times.append(run["time_s"].median())
        assert [float(c) for c in cells] == [round(acc[name][r], 2) for r in (1, 5, 10, 12)] + [
            round(acc[name].max(), 2)
        ], name
    assert [by_title[r[0]] for r in rows] == ["local", "fedavg", "fedbn"]
    fedbn, fedavg = acc["fedbn"], acc["fedavg"]
    early = pd.concat([fedbn, fedavg]).loc[[1, 2, 3, 4]]
    assert (
        f"between {early.min():.2f} and {early.max():.2f}" in section
        and f"at {acc['local'][1]:.2f} after round 1" in section
    )
    assert (
        f"leads FedAvg in {(fedbn > fedavg).sum()} of the 12 rounds and by {fedbn[12] - fedavg[12]:.2f} "
        "points at round 12" in section
    )
    assert f"a median of {min(times):.1f} to {max(times):.1f} s a round" in section
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"FedBN {fedbn[12]:.2f}, FedAvg {fedavg[12]:.2f}, Local-only {acc['local'][12]:.2f} at round 12" in readme


def test_the_h100_rosters_timings_on_the_pages_are_its_committed_runs():
    """The thirteen runs that shared one H100 with a FedAvg run: each run's median round and the slowest run's whole
    time bound what the pages say of them (no figure of the GPU's use was kept, so none is written)."""
    folders = [
        d
        for d in (ROOT / "results" / "roster-fmnist").iterdir()
        if yaml.safe_load((d / "config.yaml").read_text())["device"].startswith("cuda")
    ]
    # FedAvg beside them, and FedALA's H100 run before its rerun
    folders += sorted((ROOT / "results" / "roster-fmnist-cuda").iterdir())
    fedavg = ROOT / "results" / "roster-fmnist-cuda" / "fedavg"
    times = {d: pd.read_parquet(d / "metrics.parquet")["time_s"] for d in folders}
    assert len(times) == 14
    medians = [t.median() for t in times.values()]
    slowest = max(times, key=lambda d: times[d].sum())
    rate = sum(len(t) for t in times.values()) / times[slowest].sum()
    said = (
        f"a median of {min(medians):.1f} to {max(medians):.1f} s a round each while they shared it (their "
        "`time_s`); the slowest, "
        f"FedGen, took {times[slowest].sum():.0f} s for its 30 rounds, so the fourteen ran at most {rate:.2f} "
        "rounds/s together"
    )
    assert slowest.name == "fedgen"
    for page in ("README.md", "docs/methods.md"):
        assert said in " ".join((ROOT / page).read_text().split()), page
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    assert (
        f"ran a median of {min(medians):.1f} to {max(medians):.1f} s a round each (FedAvg "
        f"{times[fedavg].median():.1f} s" in performance
    )
    assert (
        f"FedGen, took {times[slowest].sum():.0f} s for its 30 rounds, so together they ran at most {rate:.2f} rounds/s"
        in performance
    )
    assert "% busy" not in performance and "GPU use" not in performance


def test_the_server_optimizers_curves_on_the_methods_page_are_their_committed_runs():
    runs = ROOT / "results" / "baselines30" / "digits-dir0.1"
    page = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    for name, title in (("local", "Local-only"), ("fedavg", "FedAvg"), ("fedadam", "FedAdam"), ("fedyogi", "FedYogi")):
        acc = pd.read_parquet(runs / name / "metrics.parquet").set_index("round")["acc"] * 100
        assert f"{title} " + " / ".join(f"{acc[r]:.1f}" for r in (1, 5, 10, 15, 20)) in page, name


def test_the_fedpac_server_figures_on_the_methods_page_are_the_committed_bench_output():
    page = (ROOT / "docs" / "methods.md").read_text()
    for clients in (20, 100):
        f = json.loads((ROOT / "results" / "bench" / f"fedpac-server-{clients}.json").read_text())["figures"]
        assert f["clients"] == clients and f["features"] == 512 and f["classes"] == 10
        assert f"| {clients} | {f['first round s']:.2f} s | {f['later rounds median s']:.3f} s |" in page


def test_the_digits_curves_the_methods_page_quotes_beside_its_table_are_committed_runs():
    """The reference form of FedLC, APPLE at ten times the lr and FedAS's ablations beside FedPer, on the digits split
    of the table (results/roster-digits/)."""
    page = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    acc = lambda name: (  # noqa: E731
        pd.read_parquet(ROOT / "results" / "roster-digits" / name / "metrics.parquet").set_index("round")["acc"] * 100
    )
    at = lambda name, rounds: " / ".join(f"{acc(name)[r]:.2f}" for r in rounds)  # noqa: E731
    assert (
        "`fedlc-pfllib` (PFLlib's form: the federation's counts calibrate every client) reads "
        f"{at('fedlc-pfllib', (1, 5, 10, 20, 30))}" in page
    )
    assert f"it reads {at('apple-lr0.05', (5, 10, 20, 30))} at rounds 5 / 10 / 20 / 30" in page
    assert yaml.safe_load((ROOT / "results/roster-digits/apple-lr0.05/config.yaml").read_text())["lr"] == 0.05
    assert (
        f"`fedas-nopa` {at('fedas-nopa', (10, 30))}, `fedas-nocs` {at('fedas-nocs', (10, 30))} (FedPer, the "
        "same sharing without "
        f"either, {at('fedper', (10, 30))})"
    ) in page


def test_what_the_methods_page_says_of_the_personal_models_below_local_only_is_their_committed_runs():
    runs = ROOT / "results" / "roster-fmnist"
    acc = lambda name: pd.read_parquet(runs / name / "metrics.parquet").set_index("round")["acc"] * 100  # noqa: E731
    gaps = {name: acc("local") - acc(name) for name in ("fml", "fedkd", "fedgc", "fedas", "fedala")}
    every = pd.concat(gaps.values())
    at30 = [g[30] for g in gaps.values()]
    page = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    assert (every > 0).all()
    assert (
        f"run below Local-only in every round (by {every.min():.2f} to {every.max():.2f} points; {min(at30):.2f} to "
        f"{max(at30):.2f} at round 30)"
    ) in page
    assert f"FedALA's round 1 ({acc('fedala')[1]:.2f}) is lower than its" in page


def test_the_swing_the_methods_page_quotes_of_fedgh_is_its_committed_run():
    acc = (
        pd.read_parquet(ROOT / "results" / "roster-fmnist" / "fedgh" / "metrics.parquet").set_index("round")["acc"]
        * 100
    )
    late = acc[acc.index >= 10]
    step = late.diff().abs()
    page = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    assert step.idxmax() == 17
    assert (
        f"after round 10 the accuracy moves by up to {step.max():.2f} points from one round to the next "
        f"({acc[16]:.2f} at round 16, "
        f"{acc[17]:.2f} at round 17; {acc[29]:.2f} at round 29, {acc[30]:.2f} at round 30)"
    ) in page
