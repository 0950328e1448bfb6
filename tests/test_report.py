"""`tuner report`: runs and sweeps collected, the papers' tables rebuilt with mean ± std over seeds."""

import json
import os

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app
from tuner.settings.config import RunConfig, apply_settings

PAT = {"dataset": "fmnist", "partition": "pat:2", "clients": 20, "backbone": "cnn4", "rounds": 3}


def rows(accs, val=None):
    out = []
    for i, a in enumerate(accs):
        r = {"round": i + 1, "acc": a, "acc_std": 0.01, "acc_cv": 0.02, "train_loss": 1.0, "time_s": 2.0}
        if val:
            r["val_acc"] = val[i]
        out.append(r)
    return out


def write_run(path, method, accs, val=None, **settings):
    cfg = apply_settings(RunConfig(method=method), {**PAT, **settings}, "test").resolved()
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(cfg.to_yaml())
    pd.DataFrame(rows(accs, val)).to_parquet(path / "metrics.parquet")


def write_experiment(path, stage, settings, trials, select="test"):
    path.mkdir(parents=True)
    (path / "experiment.yaml").write_text(yaml.safe_dump({"stage": stage, "select": select, "settings": settings}))
    for i, (params, result_rows) in enumerate(trials):
        d = path / f"federated_trial_{i}"
        d.mkdir()
        (d / "params.json").write_text(json.dumps(params))
        (d / "result.json").write_text("\n".join(json.dumps(r) for r in result_rows) + "\n")


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    write_run(root / "runs" / "fedper", "fedper", [0.90, 0.95, 0.94])
    write_run(root / "runs" / "gpfl-lam0.1", "gpfl", [0.70, 0.80, 0.79], lam=0.1)
    write_run(
        root / "runs" / "digits",
        "fedavg",
        [0.5, 0.6, 0.7],
        dataset="digits",
        backbone="mlp",
        partition="iid",
        clients=4,
    )
    base = {"method": "gpfl", **PAT}
    resumed = rows([0.85, 0.88]) + rows([0.85, 0.88, 0.89])  # a trial resumed from round 1 repeats rounds
    write_experiment(
        root / "sweeps" / "gpfl" / "search",
        "search",
        base,
        [({"lam": 0.01}, resumed), ({"lam": 1.0}, rows([0.6, 0.7, 0.75]))],
    )
    write_experiment(
        root / "sweeps" / "gpfl" / "seeds",
        "seeds",
        base,
        [({"lam": 0.01, "seed": 1}, rows([0.8, 0.9, 0.85])), ({"lam": 0.01, "seed": 2}, rows([0.8, 0.92, 0.9]))],
    )
    return root


def test_report_rebuilds_the_papers_table(results, tmp_path):
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", str(results), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "7 runs (0 failed)" in res.output and "GPFL Table1" in res.output
    runs = pd.read_parquet(out / "runs.parquet")
    assert len(runs) == 7 and runs["selected_acc"].notna().all()
    per_round = pd.read_parquet(out / "rounds.parquet")
    assert len(per_round) == 3 * 7  # the resumed trial's repeated rounds counted once
    tables = pd.read_parquet(out / "tables.parquet")
    cell = tables[
        (tables["table"] == "Table1") & (tables["paper"] == "GPFL") & (tables["column"] == "FMNIST pathological")
    ].set_index("method")
    # GPFL: the seed reruns (92 and 90) stand for it, not the search trials or the worse lam=0.1 run
    assert cell.loc["GPFL", "ours_mean"] == pytest.approx(91.0) and cell.loc["GPFL", "ours_std"] == pytest.approx(1.0)
    assert cell.loc["GPFL", "seeds"] == 2 and cell.loc["GPFL", "paper_mean"] == 99.85
    assert cell.loc["GPFL", "difference"] == pytest.approx(91.0 - 99.85)
    assert cell.loc["FedPer", "ours_mean"] == pytest.approx(95.0) and cell.loc["FedPer", "seeds"] == 1
    # the paper's rows stay, ours blank
    assert cell.loc["Ditto", "seeds"] == 0 and cell.loc["Ditto", "paper_mean"] == 99.44
    assert "Digits" not in set(tables["column"].str.split().str[0])  # no paper reports digits
    md = (out / "tables.md").read_text()
    assert "### GPFL Table1" in md and "91.00 ± 1.00 (n=2, 3 r)" in md and "Ours: best test round." in md
    assert "\\begin{tabular}" in (out / "tables.tex").read_text()
    assert list(out.glob("curves-fmnist-pat2-20.png")) and list(out.glob("sweep-gpfl.png"))


def test_a_report_stopped_midway_leaves_the_last_one_as_it_was(results, tmp_path, monkeypatch):
    import tuner.report.write

    out = tmp_path / "report"
    assert CliRunner().invoke(app, ["report", str(results), "--out", str(out)]).exit_code == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    write_run(results / "runs" / "late", "fedper", [0.5, 0.6, 0.7])  # a run the next report would add

    def ctrl_c(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(tuner.report.write, "plot_sweeps", ctrl_c)  # the last step: every table is made by then
    res = CliRunner().invoke(app, ["report", str(results), "--out", str(out)])
    assert res.exit_code == 130 and "Stopped (Ctrl-C)" in res.output and "Traceback" not in res.output, res.output
    assert {
        f.name: f.read_bytes() for f in out.iterdir()
    } == before  # nothing half-written, no new file, no staging folder


def test_a_sweep_still_running_is_reported_as_running_not_as_stopped_early(tmp_path):
    import os
    import socket

    from tuner.files import LOCK_FILE

    sweep = tmp_path / "sweeps" / "gpfl"
    write_experiment(
        sweep / "search",
        "search",
        {"method": "gpfl", **PAT, "rounds": 5},
        [({"lam": 0.01}, rows([0.85, 0.88])), ({"lam": 1.0}, rows([0.6] * 5))],
    )
    (sweep / LOCK_FILE).write_text(f"{socket.gethostname()} {os.getpid()}")  # as the sweep's own process holds it
    res = CliRunner().invoke(app, ["report", str(sweep), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0 and f"sweep {sweep} is running (process {os.getpid()}): 1 trials unfinished" in " ".join(
        res.output.split()
    ), res.output
    best = pd.read_parquet(tmp_path / "r" / "best.parquet").iloc[0]
    assert best["stopped_early"] == 0 and best["running"].startswith("running")
    (sweep / LOCK_FILE).unlink()  # the sweep ended: its unfinished trial was stopped early
    assert CliRunner().invoke(app, ["report", str(sweep), "--out", str(tmp_path / "r")]).exit_code == 0
    assert pd.read_parquet(tmp_path / "r" / "best.parquet").iloc[0]["stopped_early"] == 1


def test_best_configuration_stands_in_when_there_are_no_seed_reruns(results, tmp_path):
    import shutil

    shutil.rmtree(results / "sweeps" / "gpfl" / "seeds")
    CliRunner().invoke(app, ["report", str(results), "--out", str(tmp_path / "r")])
    tables = pd.read_parquet(tmp_path / "r" / "tables.parquet")
    gpfl = tables[
        (tables["paper"] == "GPFL")
        & (tables["table"] == "Table1")
        & (tables["column"] == "FMNIST pathological")
        & (tables["method"] == "GPFL")
    ]
    assert gpfl["ours_mean"].item() == pytest.approx(89.0)  # the lam=0.01 trial beats lam=1 and lam=0.1


def test_a_round_lost_from_result_json_comes_back_from_the_trials_checkpoint(tmp_path):
    """Ray Tune restarting a trial whose worker was killed copies the storage's result.json, a snapshot behind,
    over its own: the soak test saw a trial's file hold rounds 1 and 3. Its checkpoint's rounds file holds round 2."""
    from tuner.settings.schedule import ROUNDS_FILE, write_rounds

    experiment = tmp_path / "sweep" / "search"
    reported = rows([0.5, 0.6, 0.7])
    write_experiment(experiment, "search", {"method": "fedavg", **PAT}, [({"lr": 0.05}, [reported[0], reported[2]])])
    checkpoint = experiment / "federated_trial_0" / "checkpoint_000001"
    checkpoint.mkdir()
    write_rounds(
        checkpoint / ROUNDS_FILE,
        reported[:2],
        [{"round": r, "trial": "federated_trial_0", "lr": 0.05} for r in (1, 2)],
        ["lr"],
    )
    res = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    per_round = pd.read_parquet(tmp_path / "r" / "rounds.parquet")
    assert list(per_round["round"]) == [1, 2, 3] and list(per_round["acc"]) == [0.5, 0.6, 0.7]
    assert "trial" not in per_round  # who ran a round is a population's schedule, not a column of every sweep
    assert pd.read_parquet(tmp_path / "r" / "runs.parquet")["time_s"].item() == 6.0  # the lost round's time counted


def test_validation_selection_reports_test_accuracy_at_the_best_validation_round(tmp_path):
    write_run(tmp_path / "runs" / "a", "fedper", [0.90, 0.95, 0.94], val=[0.9, 0.8, 0.99], val_frac=0.1)
    res = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "r"), "--select", "val"])
    assert res.exit_code == 0, res.output
    assert "best validation round" in res.output
    runs = pd.read_parquet(tmp_path / "r" / "runs.parquet")
    assert runs["selected_acc"].item() == 0.94 and runs["best_acc"].item() == 0.95 and runs["best_round"].item() == 3


def test_a_sweep_selecting_by_validation_is_ranked_by_validation_not_by_its_test_figures(tmp_path):
    """The demo's own case: the trial with the best test figure is not the one validation chose; and of two
    trials with equal validation accuracy, the one that reached it in an earlier round."""
    base = {
        "method": "fedavg",
        "dataset": "digits",
        "partition": "iid",
        "clients": 4,
        "backbone": "mlp",
        "rounds": 3,
        "val_frac": 0.1,
    }
    trials = [
        ({"lr": 0.01}, rows([0.90, 0.97, 0.96], val=[0.80, 0.85, 0.84])),  # best test, worse validation
        ({"lr": 0.02}, rows([0.90, 0.93, 0.94], val=[0.80, 0.90, 0.90])),  # best validation, reached at round 2
        ({"lr": 0.03}, rows([0.90, 0.92, 0.95], val=[0.80, 0.85, 0.90])),
    ]  # the same validation, at round 3
    write_experiment(tmp_path / "sweep" / "search", "search", base, trials, select="val")
    res = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    best = pd.read_parquet(tmp_path / "r" / "best.parquet").iloc[0]
    assert best["config"] == "lr=0.02" and best["selected_by"] == "val"
    assert (best["val_acc"], best["val_round"], best["selected_acc"], best["best_round"]) == (0.90, 2, 0.93, 2)
    runs = pd.read_parquet(tmp_path / "r" / "runs.parquet").set_index("lr")
    assert (
        runs.loc[0.03, "val_round"] == 3
        and runs.loc[0.03, "selected_acc"] == 0.95
        and runs.loc[0.01, "val_acc"] == 0.85
    )
    # under the papers' rule the same trials rank by their test figures
    CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "t"), "--select", "test"])
    best = pd.read_parquet(tmp_path / "t" / "best.parquet").iloc[0]
    assert best["config"] == "lr=0.01" and best["selected_by"] == "test" and best["selected_acc"] == 0.97


def test_report_mistakes(tmp_path):
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "does not exist" in res.output
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "No readable runs" in res.output


def test_a_report_of_a_sweep_that_has_not_reported_a_round_says_it_is_running_and_how_far_it_got(tmp_path):
    from tuner.files import folder_lock

    sweeps = tmp_path / "sweeps"
    trial = sweeps / "demo" / "search" / "federated_trial_0001"
    trial.mkdir(parents=True)
    (trial / "params.json").write_text('{"lr": 0.01}')  # started: no result yet
    # held, as by the running sweep (this process)
    with folder_lock(sweeps / "demo", "The sweep", "choose another --name"):
        res = CliRunner().invoke(app, ["report", str(sweeps), "--out", str(tmp_path / "r")])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "No readable runs" not in said, said
    assert (
        f"No run under {sweeps} has finished a round yet: {sweeps / 'demo'} is still running (process "
        f"{os.getpid()}; 1 trial started)" in said
    )
    # once it has stopped: what is there
    res = CliRunner().invoke(app, ["report", str(sweeps), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "No readable runs" in res.output


def test_a_sweep_no_paper_reports_still_gets_its_tables_plots_and_best_configuration(tmp_path):
    base = {"method": "fedavg", "dataset": "digits", "partition": "iid", "clients": 4, "backbone": "mlp", "rounds": 3}
    sweep = tmp_path / "mine"
    write_experiment(
        sweep / "search",
        "search",
        base,
        [({"lr": 0.01}, rows([0.5, 0.6, 0.7])), ({"lr": 0.1}, rows([0.6, 0.8, 0.75])), ({"lr": 0.3}, rows([0.4]))],
    )
    write_experiment(
        sweep / "seeds",
        "seeds",
        base,
        [({"lr": 0.1, "seed": 1}, rows([0.7, 0.8, 0.9])), ({"lr": 0.1, "seed": 2}, rows([0.6, 0.7, 0.7]))],
    )
    res = CliRunner().invoke(app, ["report", str(sweep), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "None of these runs is in a setting of the papers' tables" in " ".join(res.output.split())
    assert not (tmp_path / "r" / "tables.parquet").exists()
    best = pd.read_parquet(tmp_path / "r" / "best.parquet").iloc[0]
    assert (best["sweep"], best["trials"], best["stopped_early"], best["config"]) == ("mine", 3, 1, "lr=0.1")
    assert best["selected_acc"] == 0.8 and best["best_round"] == 2
    assert best["seeds"] == 2 and best["seeds_mean"] == pytest.approx(0.8) and best["seeds_std"] == pytest.approx(0.1)
    assert "lr=0.1" in (tmp_path / "r" / "best.md").read_text()
    assert (tmp_path / "r" / "sweep-mine.png").exists() and (tmp_path / "r" / "curves-digits-iid-4.png").exists()


def test_each_table_reports_its_own_metric(results, tmp_path):
    pac = {"partition": "pac:20", "backbone": "pac_cnn"}
    write_run(results / "runs" / "fedpac", "fedpac", [0.80, 0.90, 0.85], **pac)
    res = CliRunner().invoke(app, ["report", str(results), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    tables = pd.read_parquet(tmp_path / "r" / "tables.parquet")
    fedpac = tables[
        (tables["paper"] == "FedPAC")
        & (tables["table"] == "Table1")
        & (tables["method"] == "FedPAC")
        & (tables["seeds"] > 0)
    ].iloc[0]
    # FedPAC: final test accuracy
    assert fedpac["ours_mean"] == pytest.approx(85.0) and fedpac["reported"] == "final round"
    fedper = tables[
        (tables["paper"] == "GPFL") & (tables["method"] == "FedPer") & (tables["column"] == "FMNIST pathological")
    ].iloc[0]
    # GPFL: the best round
    assert fedper["ours_mean"] == pytest.approx(95.0) and fedper["reported"] == "best test round"
    runs = pd.read_parquet(tmp_path / "r" / "runs.parquet").set_index("method")
    assert (runs.loc["fedpac", "best_acc"], runs.loc["fedpac", "final_acc"]) == (0.90, 0.85)
    md = (tmp_path / "r" / "tables.md").read_text()
    assert "### FedPAC Table1\n\nOurs: final round." in md


def test_a_run_in_a_papers_setting_whose_method_the_table_lacks_is_reported_without_a_row(tmp_path):
    # Per-FedAvg on FedPAC's pac:20 setting: FedPAC's Table 1 has that column but no Per-FedAvg row.
    root = tmp_path / "runs"
    write_run(
        root / "pac-per-fedavg",
        "per-fedavg",
        [0.6, 0.8, 0.85],
        partition="pac:20",
        backbone="pac_cnn",
        protocol="fedpac",
    )
    res = CliRunner().invoke(app, ["report", str(root), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r" / "curves-fmnist-pac20-20.png").exists()
    runs = pd.read_parquet(tmp_path / "r" / "runs.parquet")
    assert list(runs["method"]) == ["per-fedavg"]


def test_baselines_no_paper_ran_sit_beside_a_main_table_and_the_replication_names_its_fedpac(tmp_path):
    root = tmp_path / "results"
    write_run(root / "gpfl", "gpfl", [0.7, 0.8, 0.9])
    write_run(root / "lg-fedavg", "lg-fedavg", [0.6, 0.7, 0.8])  # not in GPFL's Table 1: an extra row there
    write_run(root / "gpfl-nopci", "gpfl-nopci", [0.5, 0.6, 0.7])  # an ablation: its own table only
    write_run(root / "fedpac", "fedpac", [0.8, 0.85, 0.9], partition="pac:20", backbone="pac_cnn")
    out = tmp_path / "report"
    assert CliRunner().invoke(app, ["report", str(root), "--out", str(out)]).exit_code == 0
    tables = pd.read_parquet(out / "tables.parquet")
    gpfl1 = tables[
        (tables["paper"] == "GPFL") & (tables["table"] == "Table1") & (tables["column"] == "FMNIST pathological")
    ].set_index("method")
    assert gpfl1.loc["LG-FedAvg", "ours_mean"] == pytest.approx(80.0) and pd.isna(gpfl1.loc["LG-FedAvg", "paper_mean"])
    assert "GPFL-noPCI" not in gpfl1.index
    replication = tables[tables["paper"] == "FedPAC-replication"]
    ours = replication[replication["seeds"] > 0]
    # final round
    assert set(ours["method"]) == {"FedPAC-replicated"} and ours["ours_mean"].iloc[0] == pytest.approx(90.0)
    fedpac1 = tables[(tables["paper"] == "FedPAC") & (tables["table"] == "Table1") & (tables["seeds"] > 0)]
    assert set(fedpac1["method"]) == {"FedPAC"}


def test_a_table_row_stands_for_the_form_that_produced_it_and_the_default_form_sits_beside_it(tmp_path):
    from tuner.experiments.reproduce import cells

    root = tmp_path / "results"
    write_run(root / "php-pfllib", "fedphp-pfllib", [0.7, 0.8, 0.9])  # PFLlib's form: what GPFL's FedPHP row ran
    write_run(root / "php", "fedphp", [0.6, 0.7, 0.75])
    assert CliRunner().invoke(app, ["report", str(root), "--out", str(tmp_path / "report")]).exit_code == 0
    tables = pd.read_parquet(tmp_path / "report" / "tables.parquet")
    gpfl1 = tables[
        (tables["paper"] == "GPFL") & (tables["table"] == "Table1") & (tables["column"] == "FMNIST pathological")
    ].set_index("method")
    assert gpfl1.loc["FedPHP", "ours_mean"] == pytest.approx(90.0) and gpfl1.loc["FedPHP", "paper_mean"] == 99.3
    assert gpfl1.loc["FedPHP (paper's form)", "ours_mean"] == pytest.approx(75.0) and pd.isna(
        gpfl1.loc["FedPHP (paper's form)", "paper_mean"]
    )
    methods = {c["method"] for c in cells("gpfl-table1", methods=None)[0]} | {
        c["method"] for c in cells("fedcp-table2")[0]
    }
    assert "fedphp-pfllib" in methods and "fedphp" not in methods  # tuner reproduce runs the form behind the numbers
    assert "pfedme-official" in methods and "pfedme" not in methods  # PFLlib of early 2023 predicted with w_i
    fedpac = {c["method"] for c in cells("fedpac-table1", methods=None)[0]}
    assert {"pfedme", "knn-per-logits", "apfl-outputs"} <= fedpac and not {"pfedme-official", "knn-per"} & fedpac


def test_agreement_per_column_is_spearman_of_the_ranks_mean_abs_difference_and_points_within_one():
    from tuner.report.tables import agreement, agreement_line

    t = pd.DataFrame(
        {
            "paper": "FedPAC",
            "table": "Table1",
            "column": "FMNIST dominant_s20",
            "method": list("abcde"),
            "ours_mean": [90.0, 85.0, 88.0, 70.0, 80.0],
            "paper_mean": [91.0, 86.5, 86.0, float("nan"), 79.0],
            "seeds": [1, 1, 1, 1, 0],
            "rounds": [200, 200, 150, 200, 0],
        }
    )
    t["difference"] = t["ours_mean"] - t["paper_mean"]
    a = agreement(t).iloc[0]  # only a, b, c have both figures (d: no published number; e: not run)
    assert (a["methods"], a["within_1"], a["rounds_min"], a["rounds_max"]) == (3, 1, 150, 200)
    assert a["mean_abs_difference"] == pytest.approx((1.0 + 1.5 + 2.0) / 3)
    assert a["spearman"] == pytest.approx(0.5)  # ranks (3, 1, 2) against (3, 2, 1): 1 − 6·2 / (3·8)
    assert (
        agreement_line(next(agreement(t).itertuples()))
        == "FMNIST dominant_s20: 3 methods, Spearman 0.50, mean |Δ| 1.50, 1 within 1 point; runs of 150 to 200 rounds"
    )


def test_latex_tables_escape_what_latex_reads_as_commands():
    from tuner.report.tables import render

    t = pd.DataFrame(
        {
            "paper": "FedPAC",
            "table": "Table1",
            "column": "FMNIST dominant_s20",
            "method": ["Fed&Mine 50%", "FedAvg"],
            "ours_mean": [90.0, 85.0],
            "ours_std": [0.1, 0.2],
            "seeds": [1, 1],
            "rounds": [200, 200],
            "paper_mean": [float("nan"), 85.28],
            "reported": "final round",
        }
    )
    t["difference"] = t["ours_mean"] - t["paper_mean"]
    latex = render(t, "latex")
    assert r"Fed\&Mine 50\%" in latex and r"dominant\_s20" in latex and r"$\pm$" in latex
    assert "Fed&Mine" not in latex and r"\\_" not in latex  # nothing left raw, nothing escaped twice


def test_a_curve_figure_of_30_methods_keeps_its_legend_off_the_axes_and_all_of_it_in_the_image():
    """The main job's figure of 23 methods had its legend over the curves and its title cut by the image's edge."""
    import numpy as np

    from tuner.report.plots import curves_figure

    curves = [
        (f"Method-{i:02d} ({90 - i:.2f})", (90 - i) / 100, np.arange(1, 21), np.linspace(10, 90 - i, 20))
        for i in range(30)
    ]
    fig = curves_figure(curves[::-1], "fmnist pac:20, 20 clients")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert not legend.overlaps(axes)
    # what savefig(bbox_inches="tight") writes, in pixels
    kept = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)
    shown = [
        label
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim()))
        for label, at in zip(axis.get_ticklabels(), axis.get_ticklocs(), strict=True)
        if lo <= at <= hi
    ]
    for artist in [ax.get_legend(), ax.title, ax.xaxis.label, ax.yaxis.label, *shown]:
        box = artist.get_window_extent(renderer)
        assert kept.x0 - 1 <= box.x0 and box.x1 <= kept.x1 + 1 and kept.y0 - 1 <= box.y0 and box.y1 <= kept.y1 + 1, (
            artist
        )
    assert all(float(t).is_integer() for t in ax.get_xticks())  # no round 2.5
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == [
        "Method-00 (90.00)",
        "Method-01 (89.00)",
    ]  # best first


def test_a_sweep_figure_puts_a_log_searched_setting_on_a_log_axis_and_stars_the_chosen_trial():
    from tuner.report.plots import sweep_figure

    fig = sweep_figure({"lr": [0.001, 0.01, 0.1], "mu": [0.1, 0.5, 0.9]}, [70.0, 85.0, 80.0], 1, ["lr"], "sweep s")
    lr, mu = fig.axes
    assert lr.get_xscale() == "log" and mu.get_xscale() == "linear"
    star = [c for c in lr.collections if c.get_label() == "chosen"][0]
    assert star.get_offsets().tolist() == [[0.01, 85.0]]
