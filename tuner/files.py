"""Every file the tool writes is written whole or not at all: into a temporary file beside it, then
renamed over it (atomic on POSIX filesystems), so a kill, a full disk or an error mid-write leaves
the previous version in place and never half a file for `tuner report` or a resume to trip over."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temporary file, which then replaces `path`; on any failure it is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: concurrent writers never share one
    try:
        write(tmp)
        os.replace(tmp, path)
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
        raise UserError(f"Cannot write to {what} {folder} ({e.strerror or e}); choose a folder you can write to.") from None


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
