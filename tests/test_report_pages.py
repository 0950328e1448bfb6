"""The figures the pages quote are what `tuner report` prints of the committed runs: the reproduction page's tables,
the H100 table, the agreement figures, the curves beside PFLlib's."""

import re

import pandas as pd
import pytest


def test_the_reproduction_pages_table_is_what_the_report_prints_of_the_committed_runs():
    from pathlib import Path

    from tuner.report.runs import find_runs, summarize
    from tuner.report.tables import paper_cell, paper_tables
    from tuner.settings.papers import load_tables

    root = Path(__file__).resolve().parents[1]
    runs, _ = find_runs([root / "results" / "reproduction"])
    summaries = pd.DataFrame([summarize(r, None) for r in runs]).assign(cell=[paper_cell(r["config"]) for r in runs])
    tables = paper_tables(summaries, load_tables())
    columns = {"dir:0.1": "FMNIST practical β=0.1", "pat:2": "FMNIST pathological", "pac:20": "FMNIST dominant_s20"}
    page = (root / "docs" / "reproduction.md").read_text()
    rows = [
        line.strip("|").split("|")
        for line in page.splitlines()
        if line.startswith(("| GPFL Table1 |", "| FedPAC Table"))
    ]
    # the main table: paper table, setting, method, rounds, ours, paper, difference
    rows = [r for r in rows if len(r) == 7]
    assert len(rows) > 40
    for paper_table, partition, method, rounds, ours, *_ in (map(str.strip, r) for r in rows):
        paper, table = paper_table.split()
        hit = tables[
            (tables["paper"] == paper)
            & (tables["table"] == table)
            & (tables["column"] == columns[partition])
            & (tables["method"] == method.strip("*"))
        ]
        assert len(hit) == 1, (paper_table, partition, method)
        assert f"{hit['ours_mean'].iloc[0]:.2f}" == ours.strip("*") and hit["rounds"].iloc[0] == int(rounds), (
            paper_table,
            partition,
            method,
        )


def test_the_h100_table_on_the_reproduction_page_and_in_the_readme_is_what_the_report_prints_of_the_committed_runs():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def fedpac_table1(folder):
        t = committed_paper_tables(folder)
        return t[
            (t["paper"] == "FedPAC")
            & (t["table"] == "Table1")
            & (t["column"] == "FMNIST dominant_s20")
            & (t["seeds"] > 0)
        ].set_index("method")

    gpu, cpu = fedpac_table1("gpu/fedpac-table1-fmnist-h100"), fedpac_table1("reproduction")
    page = (
        (root / "docs" / "reproduction.md")
        .read_text()
        .split("## FedPAC Table 1 at 200 rounds, on an H100")[1]
        .split("\n## ")[0]
    )
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in page.splitlines()
        if line.startswith("| ") and "---" not in line
    ][1:]
    assert len(rows) == len(gpu) == 23
    published = lambda v: "—" if pd.isna(v) else f"{v:.2f}"  # noqa: E731  (a form the paper did not run has no number)
    for method, rounds, ours, paper, _ in rows:
        assert (
            f"{gpu.loc[method, 'ours_mean']:.2f}",
            gpu.loc[method, "rounds"],
            published(gpu.loc[method, "paper_mean"]),
        ) == (ours, int(rounds), paper)
    readme = (root / "README.md").read_text().split("## Results so far")[1].split("\n## ")[0]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in readme.splitlines()
        if line.startswith("| ") and "---" not in line
    ][1:]
    assert {r[0] for r in rows} >= set(gpu.index) and len(rows) == len(cpu)  # a form the H100 has not run yet: "—"
    for method, on_cpu, on_gpu, _ in rows:
        assert on_cpu == f"{cpu.loc[method, 'ours_mean']:.2f}" and cpu.loc[method, "rounds"] == 8
        assert on_gpu == (
            f"{gpu.loc[method, 'ours_mean']:.2f} ({gpu.loc[method, 'rounds']})" if method in gpu.index else "—"
        )


def committed_paper_tables(folder: str) -> pd.DataFrame:
    """The papers' tables `tuner report` makes of the committed runs under results/FOLDER."""
    from pathlib import Path

    from tuner.report.runs import find_runs, summarize
    from tuner.report.tables import paper_cell, paper_tables
    from tuner.settings.papers import load_tables

    runs, unreadable = find_runs([Path(__file__).resolve().parents[1] / "results" / folder])
    assert not unreadable
    summaries = pd.DataFrame([summarize(r, None) for r in runs]).assign(cell=[paper_cell(r["config"]) for r in runs])
    return paper_tables(summaries, load_tables())


def test_the_agreement_figures_on_the_pages_are_what_the_report_computes_of_the_committed_runs():
    from pathlib import Path

    from tuner.report.tables import agreement, agreement_line

    root = Path(__file__).resolve().parents[1]
    flat = lambda path: " ".join((root / path).read_text().split())  # noqa: E731
    page, readme = flat("docs/reproduction.md"), flat("README.md")
    lines = lambda t: {  # noqa: E731
        (a.table, a.column): agreement_line(a) for a in agreement(t).itertuples() if a.paper in ("FedPAC", "GPFL")
    }
    cpu, gpu = committed_paper_tables("reproduction"), committed_paper_tables("gpu/fedpac-table1-fmnist-h100")
    quoted = [
        lines(cpu)["Table1", "FMNIST dominant_s20"],
        lines(cpu)["Table1", "FMNIST practical β=0.1"],
        lines(gpu)["Table1", "FMNIST dominant_s20"],
    ]
    finished = gpu[(gpu["paper"] == "FedPAC") & (gpu["table"] == "Table1") & (gpu["rounds"] == 200)]
    done = next(agreement(finished).itertuples())
    quoted.append(agreement_line(done))
    for line in quoted:
        assert line in page, line
    assert (
        f"The {done.methods} runs that reached 200 rounds in the table's own forms agree with the paper: "
        f"Spearman {done.spearman:.2f}, "
        f"mean |Δ| {done.mean_abs_difference:.2f} points, {done.within_1} within 1 point"
    ) in readme


def test_fedavg_follows_pfllibs_own_curve_on_pfllibs_own_partition_within_2_points():
    """A committed comparison (docs/reproduction.md, "Against PFLlib itself"): PFLlib's FedAvg on the Fashion-MNIST
    Dir(0.1) folder its own generator wrote, and ours on that folder read as a natural partition, 20 rounds."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "results" / "pfllib-compare"
    pfllib = pd.read_csv(root / "pfllib.csv")
    theirs = pfllib[pfllib["method"] == "fedavg"].set_index("round")["acc"]
    ours = pd.read_parquet(root / "ours-fedavg" / "metrics.parquet").set_index("round")["acc"]
    assert list(ours.index) == list(range(1, 21))
    assert (100 * (ours - theirs.loc[1:20])).abs().max() <= 2.0


def test_the_gpfl_comparison_with_pfllib_on_the_page_is_the_committed_curves():
    """docs/reproduction.md's GPFL-PFLlib table against PFLlib's runs is read from results/pfllib-compare, and
    the comparison it states holds there: the mean of ours within 2 points (1.6 at most) of the mean of
    PFLlib's full runs from round 4 to 20, and inside the range of PFLlib's own runs in rounds 1-3."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pfllib = pd.read_csv(root / "results" / "pfllib-compare" / "pfllib.csv")
    gpfl = pfllib[pfllib["method"] == "gpfl"].pivot(index="round", columns="run", values="acc") * 100
    seeds = [
        pd.read_parquet(root / "results" / "pfllib-compare" / run / "metrics.parquet").set_index("round")["acc"] * 100
        for run in ("ours-gpfl-pfllib", "ours-gpfl-pfllib-s1")
    ]
    theirs, ours = gpfl[[3, 4, 5]].mean(axis=1), (seeds[0] + seeds[1]) / 2
    page = (root / "docs" / "reproduction.md").read_text()
    rows = {
        line.split("|")[1].strip(): line.split("|")[2:-1]
        for line in page.splitlines()
        if line.strip().startswith(("| PFLlib, ", "| ours, "))
    }
    header = next(line for line in page.splitlines() if line.strip().startswith("| round | 1 | 2 |"))
    rounds = [int(r) for r in header.split("|")[2:-1]]
    curves = {f"PFLlib, run {r}": gpfl[r] for r in range(1, 6)} | {
        "PFLlib, mean of runs 3-5": theirs,
        "ours, seed 0": seeds[0],
        "ours, seed 1": seeds[1],
        "ours, mean": ours,
    }
    for label, curve in curves.items():
        assert [c.strip() for c in rows[label]] == [
            f"{curve[r]:.2f}" if r in curve and pd.notna(curve[r]) else "" for r in rounds
        ], label
    assert max(abs(ours[r] - theirs[r]) for r in range(4, 21)) <= 1.6 + 1e-9
    assert all(gpfl.loc[r].min() <= ours[r] <= gpfl.loc[r].max() for r in (1, 2, 3))


def test_the_reference_forms_tables_on_the_reproduction_page_are_the_committed_runs():
    """Every row of the section's tables, from results/forms: the best round and the tenth rounds (best round's test
    accuracy, the papers' figure for GPFL and FedCP), and the final round for FedPAC's optimizer."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "reproduction.md").read_text().split("## Reference forms, measured")[1].split("\n## ")[0]
    acc = lambda name: (  # noqa: E731
        pd.read_parquet(root / "results" / "forms" / name / "metrics.parquet").set_index("round")["acc"] * 100
    )
    published = {"dir": "97.81", "pat": "99.85"}
    for split in ("dir", "pat"):
        for first, second, paper in (
            (f"{split}-gpfl-paper", f"{split}-gpfl-pfllib", published[split]),
            (f"{split}-fedcp-softmax", f"{split}-fedcp-gumbel", ""),
        ):
            a, b = acc(first), acc(second)
            best = " | ".join(f"{c.max():.2f} ({c.idxmax()})" for c in (a, b))
            tenths = " | ".join(" / ".join(f"{c[r]:.1f}" for r in (10, 20, 30, 40, 50)) for c in (a, b))
            tail = f" | {paper} |" if paper else " |"
            assert f"| best round (round) | {best}{tail}" in page, (first, best)
            assert f"| round 10 / 20 / 30 / 40 / 50 | {tenths} |" + (" |" if paper else "") in page, (first, tenths)
    for method, paper in (("FedAvg", "85.28"), ("FedPer", "87.43")):
        final = [f"{acc(f'pac-{method.lower()}-{form}').iloc[-1]:.2f}" for form in ("momentum", "plain")]
        assert f"| {method} | {final[0]} | {final[1]} | {paper} |" in page, method


B30, GPU, BEFORE = "baselines30", "gpu/fedpac-table1-fmnist-h100", "before-34"
THIRTY_ROUND_TABLES = {  # the reproduction page's 30-round tables: (section, {row label: what the row was read from})
    "## Baselines over 30 rounds": {
        ("Local-only",): f"{B30}/pac-local",
        ("FedAvg",): f"{B30}/pac-fedavg",
        ("Per-FedAvg",): f"{B30}/pac-per-fedavg",
        ("FedFomo",): f"{B30}/pac-fedfomo",
        ("kNN-Per",): f"{BEFORE}/pac-knn-per",
        ("pFedHN",): f"{BEFORE}/pac-pfedhn",
        ("SCAFFOLD",): f"{B30}/pac-scaffold",
        ("FedPHP",): f"{B30}/pac-fedphp",
    },
    "## The last deviations, measured": {
        ("Local-only", ""): f"{B30}/pac-local",
        ("FedAvg", ""): f"{B30}/pac-fedavg",
        ("APFL", "paper's form (H100, unchanged)"): f"{GPU}/pac-apfl",
        ("APFL", "`apfl-outputs`, the table's"): f"{B30}/pac-apfl-outputs",
        ("FedAvg-FT", "before (H100)"): f"{GPU}/pac-fedavg_ft",
        ("FedAvg-FT", "now"): f"{B30}/pac-fedavg_ft",
        ("pFedMe", "before (H100)"): f"{GPU}/pac-pfedme",
        ("pFedMe", "now"): f"{B30}/pac-pfedme",
        ("Ditto", "before (H100)"): f"{GPU}/pac-ditto",
        ("Ditto", "now"): f"{B30}/pac-ditto",
        ("kNN-Per", "before"): f"{BEFORE}/pac-knn-per",
        ("kNN-Per", "now"): f"{B30}/pac-knn-per",
        ("pFedHN", "before"): f"{BEFORE}/pac-pfedhn",
        ("pFedHN", "now"): f"{B30}/pac-pfedhn",
        ("FedEM-FT-M3", "before (H100)"): f"{GPU}/pac-fedem-ft-m3",
        ("FedEM-FT-M3", "now"): f"{B30}/pac-fedem-ft-m3",
    },
    "## The last forms, second round": {
        ("Local-only", "FedPAC's split"): f"{B30}/pac-local",
        ("FedAvg", "FedPAC's split"): f"{B30}/pac-fedavg",
        ("pFedMe", "the paper's: θ_i predicts"): f"{B30}/pac-pfedme",
        ("pFedMe", "`pfedme-official`: w_i as trained predicts"): f"{B30}/pac-pfedme-official",
        ("kNN-Per", "the paper's: probabilities mixed, λ rule"): f"{B30}/pac-knn-per",
        ("kNN-Per", "`knn-per-logits`, the table's: λ rule (ours)"): f"{B30}/knn-per-lambda.csv:acc_rule",
        ("kNN-Per", "`knn-per-logits` with λ = 0.5 fixed"): f"{B30}/knn-per-lambda.csv:acc_lambda_0.5",
        ("FedEM-FT-M3", "before: π_i mixes the tuned components"): f"{B30}/pac-fedem-ft-m3",
        ("FedEM-FT-M3", "now: uniform 1/M, the authors' tuned ensemble"): f"{B30}/pac-fedem-ft-m3-uniform",
        ("Local-only", "digits `dir:0.1`, 10 clients"): f"{B30}/digits-dir0.1/local",
        ("FedAvg", "digits `dir:0.1`, 10 clients"): f"{B30}/digits-dir0.1/fedavg",
        ("FedPHP-PFLlib", "before: μ(R+1)/T"): f"{B30}/digits-dir0.1/fedphp-pfllib-before",
        ("FedPHP-PFLlib", "now: μR/T, R the rounds done"): f"{B30}/digits-dir0.1/fedphp-pfllib",
    },
}


@pytest.mark.parametrize("section", THIRTY_ROUND_TABLES)
def test_the_30_round_tables_on_the_reproduction_page_are_the_committed_runs(section):
    """Each cell r<N> is the run's test accuracy at round N, "best" the best round up to the table's last round
    (or up to the round the run reached, said as "(≤ N)"), "—" a round the run did not reach."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "reproduction.md").read_text().split(section)[1].split("\n## ")[0]
    tables = [
        [
            [c.strip() for c in line.strip().strip("|").split("|")]
            for line in block.splitlines()
            if not re.fullmatch(r"\|[\s:|-]+\|", line.strip())
        ]
        for block in re.findall(r"(?:^\|.*\n)+", text, flags=re.M)
    ]
    header, *rows = next(t for t in tables if "r1" in t[0])  # the section's table of rounds
    rounds = [int(h[1:]) for h in header if re.fullmatch(r"r\d+", h)]
    first = header.index(f"r{rounds[0]}")
    sources = THIRTY_ROUND_TABLES[section]
    assert {tuple(r[:first]) for r in rows} == set(sources)
    for row in rows:
        where = sources[tuple(row[:first])]
        if ":" in where:  # a bench's CSV: one column of accuracies by round
            path, column = where.split(":")
            acc = pd.read_csv(root / "results" / path).set_index("round")[column] * 100
        else:
            acc = pd.read_parquet(root / "results" / where / "metrics.parquet").set_index("round")["acc"] * 100
        cells = row[first : first + len(rounds)]
        assert cells == [f"{acc[r]:.2f}" if r in acc.index else "—" for r in rounds], (row[:first], where)
        reached = max(r for r in rounds if r in acc.index)
        best = f"{acc.loc[:reached].max():.2f}" + ("" if reached == rounds[-1] else f" (≤ {reached})")
        assert row[first + len(rounds)] == best, (row[:first], where)
