"""The README's main job, run exactly as the README writes it, from a copy of the repository."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
LEFT_BEHIND = (".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", "sweeps", "report", "reproduce", "runs")


def readme_main_job() -> list[str]:
    """The command lines of the README's main-job block, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = text.split("runs the main job:", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_setup_script_runs_the_readme_main_job():
    commands = readme_main_job()
    assert [c.split()[:2] for c in commands] == [["tuner", "sweep"], ["tuner", "report"]]
    setup = [line.strip() for line in (ROOT / "scripts" / "setup.sh").read_text().splitlines()]
    for command in commands:
        assert any(line.startswith(f".venv/bin/{command}") for line in setup), command
    assert "bash scripts/setup.sh" in (ROOT / ".ci" / "run").read_text()


def run_main_job(tmp_path) -> Path:
    """The main job's checkout: .ci/run's fresh clone, where scripts/setup.sh has just run it (MAIN_JOB_RAN_IN
    names it), else a copy of this repository where the README's commands run now, relative paths and all."""
    if os.environ.get("MAIN_JOB_RAN_IN"):
        return Path(os.environ["MAIN_JOB_RAN_IN"])
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
    for command in readme_main_job():  # with the README's relative paths, from the copy as working directory
        args = shlex.split(command)
        res = subprocess.run(
            [sys.executable, "-m", "tuner.cli", *args[1:]], cwd=copy, capture_output=True, text=True, timeout=900
        )
        assert res.returncode == 0, f"{command}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        assert "Traceback" not in res.stdout + res.stderr
    return copy


@pytest.mark.ray
@pytest.mark.slow
def test_readme_main_job_from_a_copy_of_the_repository(tmp_path):
    copy = run_main_job(tmp_path)
    report = copy / "results" / "report"
    runs = pd.read_parquet(report / "runs.parquet")
    trials = runs[runs["stage"] == "search"]
    assert (
        len(trials) == 8 and set(trials["method"]) == {"gpfl"} and trials["experiment"].str.startswith(str(copy)).all()
    )
    assert trials["selected_acc"].notna().all()
    rounds = pd.read_parquet(report / "rounds.parquet")
    assert set(trials["run"]) <= set(rounds["run"])
    best = pd.read_parquet(report / "best.parquet").set_index("sweep")
    assert best.loc["demo", "trials"] == 8 and best.loc["demo", "selected_acc"] == trials["selected_acc"].max()
    assert (report / "sweep-demo.png").read_bytes()[:4] == b"\x89PNG"
    assert (report / "curves-digits-dir0.1-10.png").exists()
    tables = pd.read_parquet(report / "tables.parquet")  # the committed Fashion-MNIST reproduction beside the papers
    assert {"GPFL", "FedPAC"} <= set(tables["paper"]) and tables["ours_mean"].notna().any()
    # the strongest committed evidence: FedPAC Table 1 with the GPU's 200-round runs, as the README quotes it
    agreed = pd.read_parquet(report / "agreement.parquet").set_index(["paper", "table", "column"])
    column = agreed.loc[("FedPAC", "Table1", "FMNIST dominant_s20")]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert column["rounds_max"] == 200 and (
        f"Spearman {column['spearman']:.2f}, mean |Δ| {column['mean_abs_difference']:.2f} points, "
        f"{int(column['within_1'])} of {int(column['methods'])} within a point" in readme
    )


def suite_counts(session: pytest.Session) -> tuple[int, int]:
    """The quick loop's and the whole suite's test counts: this session's own collection where it is the whole suite
    (as in CI: an xdist worker collects every test), else a collection of its own (15 s: every test module imported)."""
    option = session.config.option
    if session.config.args_source == pytest.Config.ArgsSource.TESTPATHS and not (
        option.keyword or option.markexpr or option.deselect
    ):
        return sum(not item.get_closest_marker("slow") for item in session.items), len(session.items)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-n", "0", "-m", "not slow"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    quick, whole = map(int, re.search(r"(\d+)/(\d+) tests collected", out).groups())
    return quick, whole


def test_the_readmes_test_counts_are_the_suites(request):
    quick, whole = suite_counts(request.session)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"the quick loop, {quick} tests in" in readme, f"README: the quick loop has {quick} tests"
    assert f"on a fresh clone, {whole} tests in" in readme, f"README: the whole suite has {whole} tests"


def test_the_readmes_suite_time_holds_the_newest_fresh_clone_timing():
    """README's "N tests in A to B minutes" brackets the newest row of docs/performance.md's Timings (its figure)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    low, high = map(int, re.search(r"on a fresh clone, \d+ tests in (\d+) to (\d+) minutes", readme).groups())
    timings = (ROOT / "docs" / "performance.md").read_text().split("## Timings", 1)[1]
    # the newest row is first
    minutes, seconds = map(int, re.search(r"\| \d+ tests in (\d+) min (\d+) s", timings).groups())
    assert low * 60 <= minutes * 60 + seconds < (high + 1) * 60, (low, high, minutes, seconds)


def test_every_section_the_code_points_to_exists():
    """`docs/X.md, "Section"` in a docstring or comment names a heading of that page (a user follows it)."""
    pointers = [
        (path, doc, section)
        for folder in ("tuner", "algorithms", "examples", "bench")
        for path in (ROOT / folder).rglob("*.py")
        for doc, section in re.findall(r'(docs/[a-z_]+\.md), "([^"]+)"', path.read_text())
    ]
    assert len(pointers) >= 4
    for path, doc, section in pointers:
        headings = [line.lstrip("#").strip() for line in (ROOT / doc).read_text().splitlines() if line.startswith("#")]
        assert any(h.startswith(section) for h in headings), (path, doc, section)
