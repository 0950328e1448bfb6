"""What a killed sweep leaves for --resume: Ray Tune's writes into the sweep's folder are whole or absent, and a saved
state cut short by an older sweep's kill is refused in one sentence, an error file cut short dropped."""

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.sweep.recovery import drop_damaged_errors, refuse_damaged_state
from tuner.sweep.storage import PARTIAL

ROOT = Path(__file__).resolve().parents[1]

KILLED_MID_WRITE = """
import os, signal, sys
from pyarrow import fs
from tuner.sweep.storage import whole_file_storage
storage = whole_file_storage() if sys.argv[1] == "whole" else fs.LocalFileSystem()
out = storage.open_output_stream(sys.argv[2])
out.write(b"new " * 1000)  # the first half of the new state, reaching the file before the kill
out.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("storage", ["whole", "local"])
def test_a_state_file_written_by_a_process_killed_mid_write_is_the_one_before(tmp_path, storage):
    """How Ray Tune uploads its state (pyarrow's output stream into the storage); pyarrow's own local file system
    writes in place and is shown leaving the file cut, which is what the test would see without whole files."""
    state = tmp_path / "experiment_state.json"
    state.write_bytes(b"old " * 2000)
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, storage, str(state)], cwd=ROOT)
    assert killed.returncode == -9
    if storage == "whole":
        assert state.read_bytes() == b"old " * 2000
        assert [p.name.startswith(f".{state.name}{PARTIAL}") for p in tmp_path.iterdir() if p != state] == [True]
    else:
        assert state.read_bytes() == b"new " * 1000


def test_a_file_written_whole_replaces_its_destination_and_leaves_no_partial(tmp_path):
    from tuner.sweep.storage import whole_file_storage

    storage, state = whole_file_storage(), tmp_path / "tuner.pkl"
    state.write_bytes(b"old")
    with storage.open_output_stream(str(state)) as out:
        out.write(b"new state")
    storage.copy_file(str(state), str(tmp_path / "copy.pkl"))
    assert state.read_bytes() == (tmp_path / "copy.pkl").read_bytes() == b"new state"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.pkl", "tuner.pkl"]
    assert pickle.loads(pickle.dumps(storage)).equals(storage)  # Ray hands it to each trial's worker


@pytest.fixture
def tiny_disk(tmp_path):
    """A file system of 64 KiB of its own."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root with CAP_SYS_ADMIN")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_file_that_fills_the_disk_mid_write_fails_and_leaves_the_one_before(tiny_disk):
    """A filling disk first writes part of a chunk, then fails: the part is not taken for the whole."""
    from tuner.sweep.storage import whole_file_storage

    state = tiny_disk / "simulation.pt"
    state.write_bytes(b"old")
    with pytest.raises(OSError, match="No space left"):
        with whole_file_storage().open_output_stream(str(state)) as out:
            out.write(b"x" * 2**20)
    assert state.read_bytes() == b"old" and [p.name for p in tiny_disk.iterdir()] == ["simulation.pt"]


def _saved_stage(path: Path) -> dict[str, Path]:
    """A stage's saved state as Ray Tune leaves it: a JSON snapshot and three pickles."""
    files = {
        "snapshot": path / "experiment_state-2026-11-29_02-43-47.json",
        "tuner": path / "tuner.pkl",
        "search": path / "search_gen_state-2026-11-29_02-43-47.json",
        "searcher": path / "searcher-state-2026-11-29_02-43-47.pkl",
    }
    files["snapshot"].write_text('{"trial_data": [], "runner_data": {}}')
    for name in ("tuner", "search", "searcher"):
        files[name].write_bytes(pickle.dumps({"state of": name, "payload": list(range(100))}))
    return files


@pytest.mark.parametrize("cut", ["snapshot", "tuner", "search", "searcher"])
@pytest.mark.parametrize("left", [0, 0.5])
def test_resume_refuses_a_saved_state_cut_short_in_one_sentence(tmp_path, cut, left):
    files = _saved_stage(tmp_path)
    refuse_damaged_state(tmp_path)  # whole: nothing to say
    whole = files[cut].read_bytes()
    files[cut].write_bytes(whole[: int(len(whole) * left)])
    with pytest.raises(UserError, match=re.escape(f"Cannot resume: {files[cut]} is cut short")) as e:
        refuse_damaged_state(tmp_path)
    assert ". " not in str(e.value) and "starts anew" in str(e.value)  # one sentence


def test_a_pickled_trial_error_cut_short_is_dropped_before_resume(tmp_path):
    cut, whole = tmp_path / "trial_a" / "error.pkl", tmp_path / "trial_b" / "error.pkl"
    for f in (cut, whole):
        f.parent.mkdir()
        (f.parent / "error.txt").write_text("Failure # 1\nOSError: No space left on device\n")
    cut.write_bytes(pickle.dumps(OSError("No space left on device"))[:7])  # as a full disk or a kill leaves it
    whole.write_bytes(pickle.dumps(OSError("No space left on device")))
    drop_damaged_errors(tmp_path)
    assert not cut.exists() and whole.exists()  # Tune then reads trial_a's error from its error.txt
    assert (cut.parent / "error.txt").exists()
