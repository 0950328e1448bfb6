import os
import signal
import subprocess
import tempfile

import pytest

# Partitions cached by the tests (and the subprocesses they start) stay out of the user's cache.
os.environ["TUNER_CACHE"] = tempfile.mkdtemp(prefix="tuner-test-cache-")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker is one of the machine's cores: a second torch thread per worker (or per subprocess it
    # starts) would wait on the other worker's core at every barrier.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.pop("COLUMNS", None)  # xdist's workers set 80, which the CLI's console would keep for the session


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Tests that start Ray first, in their order otherwise. They are the longest (a minute or two each, on about
    one core: Ray's start, the trial workers' imports, the waits for a kill or a checkpoint), and `--dist
    loadgroup` hands tests to the xdist workers two or three at a time in this order: both workers begin on them,
    and the short tests fill their waits and end the run together (a long test started last would keep one
    worker busy while the other had nothing left).
    Each starts Ray of its own (`address="local"`, ports the OS gives), so two run side by side."""
    items.sort(key=lambda item: not item.get_closest_marker("ray"))


@pytest.fixture(autouse=True, scope="session")
def tiny_batchnorm_backbone():
    """The tests' small BatchNorm backbone (simulations.tiny_batchnorm), known by name in every test."""
    from simulations import tiny_batchnorm

    from tuner.models import BACKBONES

    BACKBONES["tiny_batchnorm"] = tiny_batchnorm
    yield
    del BACKBONES["tiny_batchnorm"]


@pytest.fixture
def spawn():
    """subprocess.Popen in a process group of its own, stopped with its children at teardown if still running,
    so a test that fails midway leaves no sweep writing into a later test's time (or folders). The child gets
    Ctrl-C's default action, as a terminal's foreground job does: pytest started in the background (`cmd &`)
    ignores SIGINT, and children inherit that."""
    started = []

    def start(cmd, **kwargs):
        default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
        started.append(subprocess.Popen(cmd, start_new_session=True, preexec_fn=default_sigint, **kwargs))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def compiling_fails(monkeypatch):
    """Every program fails to compile under every Inductor configuration, as Inductor's do where it cannot compile
    (on a GPU, a scheduler assertion): a run goes on eager, and a check of the compiled path must then fail."""
    import torch._dynamo.exc

    import tuner.engine.compile

    def failing(fn, device, config):
        def program(*args):
            raise torch._dynamo.exc.InternalTorchDynamoError(
                "forced: this program cannot be compiled\nthe cause, on a later line"
            )

        return program

    monkeypatch.setattr(tuner.engine.compile, "compile_program", failing)


@pytest.fixture(scope="module")
def ray_local():
    """Ray for this module's sweeps, one trial at a time: a stage's trials share one worker (reuse_actors), which
    starts and imports torch once (~5 s of CPU a worker), while the suite's other xdist worker keeps the second core.
    Configured as a sweep starts its own (tuner/sweep/cluster.py)."""
    import ray

    from tuner.sweep.cluster import OWN_RAY_CONFIG

    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        _system_config=OWN_RAY_CONFIG,
    )
    yield
    ray.shutdown()
