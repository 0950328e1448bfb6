"""What a long sweep meets: damaged results, interrupted writes, impossible resource requests.
Each ends in one sentence and loses nothing already written."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from tuner.cli import app
from tuner.files import write_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
DIGITS = ["--dataset", "digits", "--partition", "iid", "--clients", "4", "--rounds", "2"]


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    return res


def test_an_interrupted_write_leaves_the_previous_file_whole(tmp_path):
    path = tmp_path / "metrics.parquet"
    pd.DataFrame({"round": [1, 2]}).to_parquet(path)

    def killed_mid_write(tmp: Path) -> None:
        tmp.write_bytes(b"PAR1 half a file")
        raise KeyboardInterrupt  # as a kill or Ctrl-C would stop it

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, killed_mid_write)
    assert pd.read_parquet(path)["round"].tolist() == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.parquet"]  # no temporary file left behind
    write_text_atomic(tmp_path / "config.yaml", "rounds: 3\n")
    assert (tmp_path / "config.yaml").read_text() == "rounds: 3\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name in ("good", "damaged"):
        res = invoke("run", "fedavg", *DIGITS, "--out", root / name)
        assert res.exit_code == 0, res.output
    return root


def test_a_report_skips_a_damaged_file_says_which_and_reports_the_rest(two_runs, tmp_path):
    metrics = two_runs / "damaged" / "metrics.parquet"
    metrics.write_bytes(metrics.read_bytes()[:100])  # truncated, as by a kill mid-write or a full disk
    res = runner.invoke(app, ["report", str(two_runs), "--out", str(tmp_path / "report")])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert f"skipped {two_runs / 'damaged'}" in res.output and "1 runs" in res.output
    assert pd.read_parquet(tmp_path / "report" / "runs.parquet")["run"].tolist() == [str(two_runs / "good")]
    (two_runs / "good" / "config.yaml").write_text("method: [unclosed\n")  # nothing readable is left
    res = runner.invoke(app, ["report", str(two_runs), "--out", str(tmp_path / "report")])
    assert res.exit_code == 2 and "No readable runs" in res.output and "Traceback" not in res.output, res.output


def test_a_sweep_trial_whose_last_line_was_cut_keeps_its_rows(tmp_path):
    from tuner.report import _trial_rows

    result = tmp_path / "result.json"
    result.write_text('{"round": 1, "acc": 0.5}\n{"round": 2, "acc": 0.6}\n{"round": 3, "ac')
    assert _trial_rows(result)["round"].tolist() == [1, 2]


@pytest.mark.parametrize("flag, value, words", [
    ("--gpus-per-trial", "-1", "--gpus-per-trial must be 0"),
    ("--gpus-per-trial", "1.5", "whole number of GPUs"),
    ("--cpus-per-trial", "0", "--cpus-per-trial must be positive"),
    ("--max-concurrent", "0", "--max-concurrent must be at least 1"),
])  # fmt: skip
def test_an_impossible_resource_request_is_refused_before_ray_starts(tmp_path, flag, value, words):
    res = invoke("sweep", "gpfl", "--space", ROOT / "search_spaces" / "demo.yaml", "--storage", tmp_path, flag, value)
    assert res.exit_code == 2 and words in res.output, res.output
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.ray
@pytest.mark.slow
def test_more_than_any_node_has_is_one_sentence_not_a_hang(tmp_path):
    cmd = [sys.executable, "-m", "tuner.cli", "sweep", "gpfl", "--space", str(ROOT / "search_spaces" / "demo.yaml"), "--storage", str(tmp_path),
           "--cpus-per-trial", "64"]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)  # it hung for ever before
    assert res.returncode == 2, res.stdout + res.stderr
    assert "No node of the Ray cluster has 64 CPUs" in res.stdout + res.stderr and "Traceback" not in res.stdout + res.stderr
