"""Every file the tool writes is written whole or not at all: into a temporary file beside it, then
renamed over it (atomic on POSIX filesystems), so a kill, a full disk or an error mid-write leaves
the previous version in place and never half a file for `tuner report` or a resume to trip over."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import UserError


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temporary file, which then replaces `path`; on any failure it is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: concurrent writers never share one
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:  # named by the path the user asked for, not the temporary file they never typed
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda p: p.write_text(text))


def ensure_writable(folder: Path, what: str) -> None:
    """A folder results go to, created and written once before any work starts."""
    from tuner.errors import UserError

    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / ".writable", "")
        (folder / ".writable").unlink()
    except OSError as e:
        raise UserError(
            f"Cannot write to {what} {folder} ({e.strerror or e}); choose a folder you can write to."
        ) from None


def unwritable_reason(folder: Path, nbytes: int, keep_as: Path | None = None) -> str | None:
    """Why a file of `nbytes` cannot be written in `folder` now (full, read-only, gone), or None if it can;
    with `keep_as`, the file written stays there under that name (space held for later)."""
    probe = Path(folder) / f".space-probe.{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(bytes(nbytes))
            f.flush()
            os.fsync(f.fileno())  # a disk with delayed allocation reports a full disk here, not at write()
        if keep_as:
            os.replace(probe, keep_as)
        return None
    except OSError as e:
        return e.strerror or str(e)
    finally:
        probe.unlink(missing_ok=True)


LOCK_FILE = ".lock"


@contextmanager
def folder_lock(folder: Path, what: str, change: str):
    """Hold `folder` for this process while it writes there: a second command on the same folder (two sweeps of
    one name, a run resumed twice) is refused in one sentence naming the holder; a lock left by a process that
    is gone (killed) is taken over. `change`: what the user may change instead (an option)."""
    from tuner.errors import UserError

    folder.mkdir(parents=True, exist_ok=True)
    lock, mine = folder / LOCK_FILE, folder / f"{LOCK_FILE}.{os.getpid()}"
    mine.write_text(f"{socket.gethostname()} {os.getpid()}")
    try:
        while True:
            try:
                os.link(mine, lock)  # atomic, and fails where a lock exists: the lock appears whole or not at all
                break
            except FileExistsError:
                holder = lock_holder(folder)
                if holder is None:  # released meanwhile, or left by a process that is gone (killed): take it over
                    lock.unlink(missing_ok=True)
                    continue
                raise UserError(
                    f"{what} {folder} is in use by {holder}; wait for it to end, or {change} "
                    f"(if that process is gone, delete {lock})."
                ) from None
    finally:
        mine.unlink(missing_ok=True)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def lock_holder(folder: Path) -> str | None:
    """Who holds `folder` now ("process 123", "process 123 on node-2"), or None: no lock, or one whose process
    on this machine is gone. A lock from another machine is taken as held (its process cannot be asked)."""
    try:
        host, _, pid = (Path(folder) / LOCK_FILE).read_text().strip().partition(" ")
    except (FileNotFoundError, NotADirectoryError):
        return None
    if host == socket.gethostname():
        return f"process {pid}" if pid.isdigit() and _alive(int(pid)) else None
    return f"process {pid} on {host}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def user_path(path: str | Path) -> Path:
    """A path as a user typed it, made absolute (`~` expanded) before it reaches Ray, pyarrow or a trial,
    whose working directory is not the user's."""
    return Path(path).expanduser().resolve()


def read_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML file holding one mapping; every way it can be wrong is one sentence naming the file."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{what} {p} does not exist.")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{what} {p} is not valid YAML{where}; fix its syntax.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{what} {p} must hold a mapping of name: value pairs.")
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    data = read_mapping(path, "Config file")
    hp = data.pop("hparams", None) or {}
    if not isinstance(hp, dict):
        raise UserError(f"Config file {path}: 'hparams' must be a mapping.")
    return {**data, **hp}
