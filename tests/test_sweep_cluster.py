"""Where a sweep's trials run: GPUs and their shares, a cluster joined, unreachable or vanishing, the workers Ray
starts, what a trial's worker imports, the engine a worker's rounds call for."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sweeps import ROOT, TINY, resume_one_at_a_time, sweep_cmd, trials, trials_so_far
from typer.testing import CliRunner

from tuner.cli import app
from tuner.sweep.cluster import OWN_RAY_CONFIG

PLACEMENT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import ray
    from ray.cluster_utils import Cluster
    from tuner.sweep.space_file import load_space
    from tuner.sweep.cluster import Resources
    from tuner.sweep.stages import sweep
    from tuner.cli import app
    from typer.testing import CliRunner

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=2, num_gpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    space = load_space(sys.argv[1], "fedavg")
    sweep(space, Path(sys.argv[2]) / "gpu", Resources(cpus_per_trial=1, gpus_per_trial=0.5, address=cluster.address))
    tuned = CliRunner().invoke(app, [  # a tuned comparison's three stages on the same cluster
        "reproduce", "roster", "--tune", "--method", "fedavg", "--trials", "2", "--seeds", "2", "--rounds", "2",
        "--grace", "1", "--set", "dataset=digits", "--set", "clients=4", "--storage", sys.argv[2],
        "--tuned-dir", str(Path(sys.argv[2]) / "tuned"), "--address", cluster.address, "--gpus-per-trial", "0.5",
    ])
    assert tuned.exit_code == 0, tuned.output
    print(json.dumps({"workers": [w.node_id for w in workers], "head": cluster.head_node.node_id}), flush=True)
    ray.shutdown()
    cluster.shutdown()
""")


@pytest.mark.ray
@pytest.mark.slow
def test_trials_of_a_sweep_and_a_tuned_comparison_land_where_the_gpus_are_and_never_exceed_them(tmp_path):
    space = tmp_path / "gpu.yaml"
    space.write_text(TINY.replace("samples: 3", "samples: 4"))  # two GPUs of two half-GPU trials each
    script = tmp_path / "placement.py"
    script.write_text(PLACEMENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, str(script), str(space), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    nodes = json.loads(res.stdout.strip().splitlines()[-1])
    ts = trials(tmp_path / "gpu" / "search")
    assert len(ts) == 4
    spans = {}
    for t in ts:
        first, last = t["rows"][0], t["rows"][-1]
        assert first["node"] in nodes["workers"] and first["gpu_ids"] != ""  # never on the GPU-less head
        spans.setdefault((first["node"], first["gpu_ids"]), []).append(
            (first["reported_at"] - first["time_total_s"], last["reported_at"])  # Ray's timestamp: whole seconds
        )
    for gpu, intervals in spans.items():  # half a GPU each: at most two trials share one at any moment
        for start, _ in intervals:
            assert sum(s <= start < e for s, e in intervals) <= 2, gpu
    # a tuned comparison spreads its defaults, search and seed reruns over the cluster's GPU nodes alike
    for stage in ("defaults", "search", "seeds"):
        ts = trials(tmp_path / "roster-tuned" / stage)
        assert len(ts) == 2 and (stage == "search" or all(t["rows"][-1]["round"] == 2 for t in ts)), stage  # ASHA
        assert all(t["rows"][0]["node"] in nodes["workers"] and t["rows"][0]["gpu_ids"] != "" for t in ts), stage


@pytest.mark.ray
@pytest.mark.slow
def test_an_unreachable_cluster_is_one_sentence(tmp_path):
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY)
    res = CliRunner().invoke(
        app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path), "--address", "127.0.0.1:1"]
    )
    assert (
        res.exit_code == 2 and "No Ray cluster answers at 127.0.0.1:1" in res.output and "Traceback" not in res.output
    )


@pytest.mark.parametrize("address, system_config", [(None, OWN_RAY_CONFIG), ("ray://head:10001", None)])
def test_the_ray_a_sweep_starts_prestarts_no_workers_and_a_joined_cluster_keeps_its_own_settings(
    monkeypatch, address, system_config
):
    import ray

    from tuner.errors import UserError
    from tuner.sweep.cluster import Resources, start_ray

    asked = {}

    def init(**kwargs):
        asked.update(kwargs)
        raise ConnectionError("stopped here: what start_ray asked of Ray is all this test needs")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever this xdist worker started before
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UserError, match="stopped here"):
        start_ray(Resources(address=address))
    assert asked["_system_config"] == system_config


@pytest.mark.ray
@pytest.mark.slow
def test_a_cluster_that_vanishes_under_a_sweep_is_one_sentence_and_a_sweep_never_joins_a_dead_or_foreign_one(
    tmp_path, spawn
):
    """Someone's `ray start` cluster on the machine, joined with --address, killed mid-sweep (its head node gone):
    one sentence within seconds (Ray itself would end the process a minute later with a log line). The cluster's
    address file stays behind, stale; a sweep without --address starts its own Ray instead of joining it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import secrets

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))} | {
        "PYTHONPATH": str(ROOT)
    }
    env |= {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
    }  # as `ray start` does where a token exists
    head = spawn(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            "--port",
            str(port),
            "--num-cpus",
            "1",
            "--node-ip-address",
            "127.0.0.1",
            "--include-dashboard=false",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    address_file = Path("/tmp/ray/ray_current_cluster")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (address_file.exists() and str(port) in address_file.read_text()):
            assert head.poll() is None, "ray start failed"
            time.sleep(0.2)
        space = tmp_path / "gone.yaml"
        space.write_text(
            TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 30, checkpoint_every: 5").replace(
                "samples: 3", "samples: 2"
            )
        )
        # Ray joins a cluster at an explicit address with its token only when told (RAY_AUTH_MODE); refused, it
        # tries again for 20 s (RAY_gcs_server_port_wait_time_s, its own knob: one try here, the sentence is the same)
        refused_env = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"} | {"RAY_gcs_server_port_wait_time_s": "1"}
        res = subprocess.run(
            sweep_cmd(space, tmp_path, "--address", f"127.0.0.1:{port}"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=refused_env,
            timeout=120,
        )
        assert res.returncode == 2 and "set RAY_AUTH_MODE=token" in res.stderr.splitlines()[-1], res.stdout + res.stderr
        proc = spawn(
            sweep_cmd(space, tmp_path, "--address", f"127.0.0.1:{port}"),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        experiment = tmp_path / "fedavg-gone" / "search"
        while not any(t["rows"] for t in trials_so_far(experiment)):
            assert proc.poll() is None and time.time() < deadline + 120, "the sweep ended before a trial ran"
            time.sleep(0.2)
        os.killpg(head.pid, signal.SIGKILL)  # the head node and everything on it
        head.wait()
        out, _ = proc.communicate(timeout=50)  # before Ray's own minute is up
        last = [line for line in out.splitlines() if line.strip()][-1]
        gcs = re.search(r"joined the Ray cluster at ([\d.]+:\d+): 1 node, 1 CPU, 0 GPUs", out)  # its size: whose it is
        assert gcs and gcs[1].endswith(f":{port}") and proc.returncode == 1 and "Traceback" not in out, out
        assert last.startswith(f"error: The Ray cluster at {gcs[1]} stopped answering") and "--resume" in last, out
        res = resume_one_at_a_time(space, tmp_path, env)
        assert res.returncode == 0 and "joined" not in res.stdout, res.stdout + res.stderr
        assert sorted(t["rows"][-1]["round"] for t in trials(experiment)) == [30, 30]
    finally:
        if address_file.exists() and str(port) in address_file.read_text():
            address_file.unlink()


def test_a_trial_takes_the_measured_share_of_a_gpu_by_default_and_what_it_asks_for_otherwise(monkeypatch):
    import ray

    from tuner.sweep.cluster import TRIALS_PER_GPU, Resources, trial_resources

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16, "GPU": 1})
    assert trial_resources(Resources()) == {"cpu": 1, "gpu": 1 / TRIALS_PER_GPU} and TRIALS_PER_GPU == 2
    assert trial_resources(Resources(gpus_per_trial=1))["gpu"] == 1
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2})
    assert trial_resources(Resources())["gpu"] == 0


def test_a_sweep_on_auto_weighs_compiling_against_the_rounds_a_worker_runs():
    from tuner.engine.compile import CPU_COMPILE_ROUNDS, auto_engine
    from tuner.sweep.cluster import worker_rounds

    cpu, two_cores = {"cpu": 1, "gpu": 0}, {"CPU": 2}
    assert worker_rounds(cpu, 8, 15, None, two_cores) == 60  # the demo: 4 trials of 15 rounds a worker
    assert worker_rounds(cpu, 16, 50, None, two_cores) == 400
    assert worker_rounds(cpu, 16, 50, 16, {"CPU": 16}) == worker_rounds(cpu, 16, 50, 1, two_cores) / 16 == 50
    assert worker_rounds({"cpu": 1, "gpu": 0.5}, 8, 10, None, {"CPU": 16, "GPU": 1}) == 40  # two trials a GPU
    assert auto_engine("cpu", 400, "mlp", "gpfl") == "eager"  # a 16-trial, 50-round sweep: compiling would not repay
    assert auto_engine("cpu", CPU_COMPILE_ROUNDS["mlp"], "mlp", "gpfl") == "compiled"
    assert (
        auto_engine("cpu", CPU_COMPILE_ROUNDS["cnn4"], "cnn4", "gpfl") == "compiled"
        and auto_engine("cpu", 60, "a_users_backbone", "gpfl") == "eager"
    )


def test_a_trial_worker_starts_without_importing_torch():
    """Tune starts a worker for each pending trial, and one that a reused worker's trial overtakes is stopped at the
    end of the stage, which Tune waits on (up to 5 s) while the worker still loads the trainable: its module leaves
    torch and the engine to the trial."""
    code = "import sys, tuner.sweep.trainable; print(sorted({'torch', 'tuner.settings.config'} & set(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
