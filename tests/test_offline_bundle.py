"""scripts/offline-bundle.sh: on a connected machine, the wheels and datasets a machine without internet needs;
there, pip installs from the bundle alone. Tried on a small bundle (one wheel built here, pip kept off the
network), and with Fashion-MNIST where Debian's copy is installed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


def bundle(tmp_path: Path, *args: str, local: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(local)}  # the wheel index: a folder here
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "offline-bundle.sh"), str(tmp_path / "bundle"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def local_index(tmp_path) -> Path:
    """A wheel index of one pure-Python package, built here without the network."""
    src = tmp_path / "tinydep"
    (src / "tinydep").mkdir(parents=True)
    (src / "tinydep" / "__init__.py").write_text("ANSWER = 42\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinydep"\nversion = "1.0"\n'
    )
    local = tmp_path / "index"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-w",
            str(local),
            str(src),
        ],
        check=True,
    )
    return local


def test_a_bundle_installs_on_a_machine_without_internet(tmp_path, local_index):
    (tmp_path / "req.txt").write_text("tinydep\n")
    res = bundle(
        tmp_path, "--requirements", str(tmp_path / "req.txt"), "--data", "none", "--python", "3.12", local=local_index
    )
    assert res.returncode == 0, res.stdout + res.stderr
    wheels = tmp_path / "bundle" / "wheels"
    assert [w.name for w in wheels.glob("*.whl")] == ["tinydep-1.0-py3-none-any.whl"]
    assert (
        f"PIP_NO_INDEX=1 PIP_FIND_LINKS={wheels} bash scripts/setup.sh"
        in (tmp_path / "bundle" / "README.txt").read_text()
    )
    venv = tmp_path / "node"  # the other machine: pip sees the bundle and nothing else
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(wheels),
            "tinydep",
        ],
        check=True,
    )
    assert (
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import tinydep; print(tinydep.ANSWER)"],
            capture_output=True,
            text=True,
        ).stdout
        == "42\n"
    )


def test_the_projects_own_requirements_are_bundled_with_its_test_extra_and_build_backend(tmp_path, local_index):
    # the index here lacks them: the script fails, as it must
    res = bundle(tmp_path, "--data", "none", local=local_index)
    requirements = (tmp_path / "bundle" / "requirements.txt").read_text().split()
    assert {
        "torch==2.14.1",
        "torchvision==0.29.1",
        "ray[tune]==2.60.*",
        "pydantic>=2",
        "pytest>=8,<9.2",
        "pytest-xdist>=3.5",
        "setuptools>=68",
        "pip",
    } <= set(requirements)
    assert res.returncode != 0 and "Done" not in res.stdout


def test_a_mistyped_option_prints_the_usage(tmp_path):
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "offline-bundle.sh"), str(tmp_path / "b"), "--pyhton", "3.12"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "--python      the other machine's Python" in res.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    not DEBIAN_FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (scripts/install.sh installs it)"
)
def test_a_bundle_carries_fashion_mnist_that_a_run_reads_from_it(tmp_path, local_index):
    (tmp_path / "req.txt").write_text("tinydep\n")
    res = bundle(tmp_path, "--requirements", str(tmp_path / "req.txt"), "--data", "fmnist", local=local_index)
    assert res.returncode == 0 and "fmnist: 70000 samples" in res.stdout, res.stdout + res.stderr
    from tuner.data.datasets import load_dataset

    assert len(load_dataset("fmnist", tmp_path / "bundle" / "data", download=False).y) == 70000
