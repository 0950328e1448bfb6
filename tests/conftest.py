import os
import signal
import subprocess
import tempfile

import pytest

# Partitions cached by the tests (and the subprocesses they start) stay out of the user's cache.
os.environ["TUNER_CACHE"] = tempfile.mkdtemp(prefix="tuner-test-cache-")


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
    so a test that fails midway leaves no sweep writing into a later test's time (or folders)."""
    started = []

    def start(cmd, **kwargs):
        started.append(subprocess.Popen(cmd, start_new_session=True, **kwargs))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
