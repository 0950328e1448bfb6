"""The CLI end to end, and every user mistake: one sentence, a non-zero exit, no traceback."""

import pandas as pd
import pytest
import yaml
from cli_runs import invoke, runner

from tuner.cli import app

DIGITS = ["--dataset", "digits", "--partition", "iid", "--clients", "4"]


def test_run_writes_metrics_and_a_rerunnable_config(tmp_path):
    res = invoke(
        "run",
        "fedprox",
        *DIGITS,
        "--rounds",
        "3",
        "--out",
        str(tmp_path),
        "--set",
        "mu=0.1",
        "--set",
        "lr=0.05",
        "--set",
        "val_frac=0.2",
    )
    assert res.exit_code == 0, res.output
    assert "best accuracy" in res.output
    m = pd.read_parquet(tmp_path / "metrics.parquet")
    assert list(m["round"]) == [1, 2, 3]
    for col in ("acc", "best_acc", "train_loss", "time_s", "val_acc", "acc_std", "acc_cv", "acc_client_mean"):
        assert col in m and m[col].notna().all(), col
    cfg = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (
        cfg["method"] == "fedprox" and cfg["hparams"] == {"mu": 0.1} and cfg["lr"] == 0.05 and cfg["backbone"] == "mlp"
    )
    rerun = invoke("run", "fedprox", "--config", str(tmp_path / "config.yaml"), "--out", str(tmp_path / "again"))
    assert rerun.exit_code == 0, rerun.output
    again = pd.read_parquet(tmp_path / "again" / "metrics.parquet")
    pd.testing.assert_series_equal(m["acc"], again["acc"])


def test_eval_gap_and_join_range(tmp_path):
    res = invoke(
        "run",
        "fedavg",
        *DIGITS,
        "--rounds",
        "4",
        "--out",
        str(tmp_path),
        "--set",
        "eval_gap=2",
        "--set",
        "join_ratio=0.5-1",
    )
    assert res.exit_code == 0, res.output
    m = pd.read_parquet(tmp_path / "metrics.parquet")
    assert m["acc"].isna().tolist() == [True, False, True, False]
    assert m["clients"].between(2, 4).all()


def test_help_explains_every_option():
    res = invoke("run", "--help")
    assert res.exit_code == 0
    for option in ("--dataset", "--partition", "--clients", "--rounds", "--out", "--set", "--config", "--resume"):
        assert option in res.output


def test_every_default_a_help_text_names_is_shown_not_taken_for_markup():
    """Rich reads `[default: 20]` as a style tag and drops it; each help text escapes it, and it is shown."""
    import typer.main

    commands, checked = typer.main.get_command(app).commands, 0
    for name in ("run", "sweep", "reproduce", "report", "data"):
        said = " ".join(invoke(name, "--help").output.replace("│", " ").split())
        for param in commands[name].params:
            help_text = getattr(param, "help", None) or ""
            if "[default:" in help_text:
                shown = help_text.split("[default:")[1].split("]")[0]
                assert f"[default: {' '.join(shown.split())[:12]}" in said, (name, param.name)
                checked += 1
    assert checked >= 10


def test_diverging_run_stops_clearly_and_keeps_its_rows(tmp_path, monkeypatch):
    from tuner.engine.executor_kinds import VectorizedExecutor

    train, calls = VectorizedExecutor.train, []

    def diverge_in_round_3(self, *args):
        calls.append(1)
        losses = train(self, *args)
        return losses * float("nan") if len(calls) == 3 else losses

    monkeypatch.setattr(VectorizedExecutor, "train", diverge_in_round_3)
    res = invoke("run", "fedavg", *DIGITS, "--rounds", "5", "--out", str(tmp_path))
    assert res.exit_code == 3, res.output
    assert "diverged in round 3" in res.output and "lower the learning rate" in res.output
    assert list(pd.read_parquet(tmp_path / "metrics.parquet")["round"]) == [1, 2]
    real = invoke("run", "fedavg", *DIGITS, "--rounds", "2", "--out", str(tmp_path / "real"), "--set", "lr=1e6")
    assert real.exit_code == 3 and "diverged" in real.output
    # a method's own step sizes named with their values: pFedMe's λ and personal learning rate diverge it too
    pfedme = invoke("run", "pfedme", *DIGITS, "--rounds", "1", "--out", str(tmp_path / "p"), "--set", "lam=1e6")
    said = " ".join(pfedme.output.split())
    assert pfedme.exit_code == 3 and "lower the learning rate (lr=0.005) or the step its own settings" in said, said
    assert "lam=1e+06" in said


def test_resume_refuses_another_method(tmp_path):
    assert invoke("run", "fedavg", *DIGITS, "--rounds", "1", "--out", str(tmp_path)).exit_code == 0
    res = invoke("run", "fedper", "--resume", "--out", str(tmp_path), "--rounds", "2")
    assert res.exit_code == 2 and "holds a fedavg run" in res.output
    res = invoke("run", "fedavg", "--resume", "--out", str(tmp_path / "nothing"))
    assert res.exit_code == 2 and "no config.yaml" in res.output


def test_data_show_draws_the_partition(tmp_path):
    png = tmp_path / "p.png"
    res = invoke("data", "show", "--dataset", "digits", "--partition", "pat:2", "--clients", "5", "--out", str(png))
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "classes" in res.output and "top class" in res.output


def test_methods_lists_every_variant_with_its_hyperparameters():
    res = runner.invoke(app, ["methods"], env={"COLUMNS": "250"})
    assert res.exit_code == 0
    for name in ("fedavg", "gpfl-nocov", "fedcp-nocpn-nogfm-nogh", "fedpac-protoweights"):
        assert name in res.output
    assert "combine=qp" in res.output and "lam=0.01" in res.output


def test_methods_names_each_methods_paper_and_the_code_it_follows():
    from algorithms import METHODS

    missing = [name for name, cls in METHODS.items() if not (cls.paper and cls.source)]
    assert not missing
    res = runner.invoke(app, ["methods"], env={"COLUMNS": "300"})
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:]]
        for line in res.output.splitlines()
        if line.startswith("│")
    }
    assert rows["gpfl-pfllib"][1:3] == ["Zhang et al., ICCV 2023", "PFLlib clientgpfl.py"]
    assert rows["fedcac"][1:3] == ["Wu et al., ICCV 2023", "PFLlib clientcac.py; the authors' configs"]
    assert rows["gpfl-nocov"][1] == "Zhang et al., ICCV 2023"  # a variant: its family's paper


@pytest.mark.slow
def test_sigterm_keeps_the_rows_and_says_how_to_resume(tmp_path, spawn):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    # eager: 100000 rounds would have `auto` compile first (the Ctrl-C test below stops a run that compiles)
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "run",
        "fedavg",
        *DIGITS,
        "--rounds",
        "100000",
        "--out",
        str(out),
        "--set",
        "checkpoint_every=1",
        "--set",
        "engine=eager",
    ]
    proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not out.joinpath("metrics.parquet").exists():  # the event, not a time: a round is done and written
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended or never wrote a round"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    rows = pd.read_parquet(out / "metrics.parquet")
    assert len(rows) >= 1 and list(rows["round"]) == list(range(1, len(rows) + 1))
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))  # no half-written file left


def test_ctrl_c_ends_a_run_at_its_rounds_end_with_a_checkpoint_so_the_advised_resume_works(tmp_path, spawn):
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "run",
        "fedavg",
        *DIGITS,
        "--rounds",
        "100000",
        "--out",
        str(out),
        "--set",
        "checkpoint_every=100000",
    ]
    proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not out.joinpath("config.yaml").exists():  # written once the run is built, just before its first round
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended or never started"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal delivers Ctrl-C: to the whole process group
    # the run stops at its first round's end, which compiles first (100000 rounds: `auto` compiles), a minute or
    # more on a busy 2-core machine: waited for as long as the start was
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    # none of the periodic ones: the one at the stop
    saved = int(re.search(r"checkpoint of round (\d+)", stderr).group(1))
    assert f"tuner run fedavg --resume --out {out}" in " ".join(stderr.split())
    res = runner.invoke(app, ["run", "fedavg", "--resume", "--rounds", str(saved + 2), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert list(pd.read_parquet(out / "metrics.parquet")["round"]) == list(range(1, saved + 3))


def test_ctrl_c_while_the_command_starts_is_one_line_and_130(spawn):
    """`tuner` spends its first seconds importing torch: a Ctrl-C then is one line, not a traceback. The signal
    goes once torch's library is mapped into the process (its import under way), not after a fixed wait."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    proc = spawn(
        [sys.executable, "-c", "import tuner; tuner.main()", "methods"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the command ended before torch was imported"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.strip() == "Stopped (Ctrl-C) while starting; nothing was run or written.", stderr


@pytest.fixture(params=["relative", "home"])
def where(request, tmp_path, monkeypatch):
    """Paths as a user types them: relative to the working directory, or under `~`; returns (prefix, folder
    it means)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return ("", work) if request.param == "relative" else ("~/", home)


def test_path_flags_of_run_report_and_data_show(where):
    prefix, folder = where
    (folder / "cfg.yaml").write_text("dataset: digits\npartition: iid\nclients: 4\nrounds: 2\n")
    res = invoke("run", "fedavg", "--config", f"{prefix}cfg.yaml", "--out", f"{prefix}runs/a")
    assert res.exit_code == 0, res.output
    res = invoke("run", "fedavg", "--resume", "--out", f"{prefix}runs/a", "--rounds", "3")
    assert res.exit_code == 0, res.output
    assert list(pd.read_parquet(folder / "runs" / "a" / "metrics.parquet")["round"]) == [1, 2, 3]
    res = invoke("report", f"{prefix}runs", "--out", f"{prefix}report")
    assert res.exit_code == 0, res.output
    assert pd.read_parquet(folder / "report" / "runs.parquet")["rounds_run"].tolist() == [3]
    res = invoke(
        "data", "show", "--dataset", "digits", "--partition", "iid", "--clients", "4", "--out", f"{prefix}p.png"
    )
    assert res.exit_code == 0 and (folder / "p.png").exists(), res.output
    res = invoke(
        "run", "fedavg", *DIGITS, "--rounds", "1", "--set", f"data_dir={prefix}data", "--out", f"{prefix}runs/b"
    )
    assert res.exit_code == 0 and yaml.safe_load((folder / "runs" / "b" / "config.yaml").read_text())[
        "data_dir"
    ] == str(folder / "data")


def test_more_clients_than_batches_is_one_sentence(tmp_path):
    res = invoke(
        "run",
        "fedavg",
        "--dataset",
        "digits",
        "--partition",
        "iid",
        "--clients",
        "5000",
        "--rounds",
        "1",
        "--out",
        str(tmp_path),
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert (
        "5000 clients have no test sample and would never be scored" in res.output and "use fewer clients" in res.output
    )


def test_seeds_write_each_run_as_it_would_alone_and_resume_continues_or_starts_each(tmp_path):
    """--seeds 0,1 packs the two into one program and writes seed-0 and seed-1, each the run `--set seed=N` writes
    alone; --resume with one seed more continues the two (a pack) and starts the third (alone, at another round)."""
    join = ["--set", "join_ratio=0.5"]  # the seed draws the cohort too
    res = invoke("run", "fedavg", *DIGITS, *join, "--rounds", "2", "--seeds", "0,1", "--out", str(tmp_path / "s"))
    assert res.exit_code == 0, res.output
    alone = invoke("run", "fedavg", *DIGITS, *join, "--rounds", "2", "--set", "seed=1", "--out", str(tmp_path / "a"))
    assert alone.exit_code == 0, alone.output
    figures = ["round", "clients", "train_loss", "acc", "acc_std", "best_acc"]
    seeded = [pd.read_parquet(tmp_path / "s" / f"seed-{s}" / "metrics.parquet")[figures] for s in (0, 1)]
    pd.testing.assert_frame_equal(seeded[1], pd.read_parquet(tmp_path / "a" / "metrics.parquet")[figures])
    assert not seeded[0]["train_loss"].equals(seeded[1]["train_loss"])  # the seeds ran apart
    assert yaml.safe_load((tmp_path / "s" / "seed-1" / "config.yaml").read_text())["seed"] == 1
    assert all(set(pd.read_parquet(tmp_path / "s" / f"seed-{s}" / "metrics.parquet")["pack"]) == {2} for s in (0, 1))

    more = invoke("run", "fedavg", "--seeds", "0,1,2", "--resume", "--rounds", "3", "--out", str(tmp_path / "s"))
    assert more.exit_code == 0, more.output
    for s in (0, 1, 2):
        assert list(pd.read_parquet(tmp_path / "s" / f"seed-{s}" / "metrics.parquet")["round"]) == [1, 2, 3], s
    assert "pack" not in pd.read_parquet(tmp_path / "s" / "seed-2" / "metrics.parquet")  # alone: the others at round 2
    done = invoke("run", "fedavg", "--seeds", "0,1,2", "--resume", "--rounds", "3", "--out", str(tmp_path / "s"))
    assert done.exit_code == 0 and "seed 2:" in done.output and "has run its 3 rounds" in done.output


def test_seeds_of_a_method_that_cannot_be_packed_say_why_and_run_one_after_another(tmp_path):
    res = invoke("run", "pfedhn", *DIGITS, "--rounds", "1", "--seeds", "0,1", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "pFedHN's runs cannot be packed: its clients train one after another" in said
    assert "the seeds run one after another" in said
    assert all((tmp_path / f"seed-{s}" / "checkpoint.pt").exists() for s in (0, 1))


@pytest.mark.parametrize(
    "args, sentence",
    [
        (["--seeds", "0,0"], "--seeds takes each seed once and none below 0, not '0,0'."),
        (["--seeds", "a,1"], "--seeds takes whole numbers separated by commas (0,1,2), not 'a,1'."),
        (["--seeds", "0,1", "--set", "seed=3"], "--seeds sets each run's seed; drop --set seed=... or --seeds."),
    ],
)
def test_seeds_mistakes_are_one_sentence(tmp_path, args, sentence):
    res = invoke("run", "fedavg", *DIGITS, "--rounds", "1", *args, "--out", str(tmp_path))
    assert res.exit_code == 2 and sentence in " ".join(res.output.split()) and "Traceback" not in res.output
