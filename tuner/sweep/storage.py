"""The sweep's folder as Ray Tune writes it: every file appears whole or not at all.

Ray Tune copies its experiment state (tuner.pkl, the experiment and searcher snapshots, every half second or so) and
each trial's checkpoint from a staging folder into the storage with pyarrow, writing into the file in place. A sweep
killed mid-copy (SIGKILL, a lost node, power) left a file cut short, and --resume then failed: an empty tuner.pkl
ended the command in a bare "Aborted.", a cut experiment snapshot made Ray Tune start the experiment again from
nothing. Here each file is written under a hidden name beside its place and renamed over it once whole (a rename
within a folder is atomic), so a kill leaves the file before it or none.
"""

from __future__ import annotations

import io
import os
import uuid

import pyarrow as pa
from pyarrow import fs

PARTIAL = ".partial-"  # a file being written is `.<name>.partial-<id>` beside it; a kill leaves it, hidden


class _ReplacedWhenClosed(io.FileIO):
    """Written under a hidden name; closed after every write succeeded, it replaces its destination. No fsync: a
    killed process leaves what it wrote in the page cache, and the rename is what makes the file whole or absent."""

    def __init__(self, path: str):
        head, name = os.path.split(path)
        self.path, self.failed = path, False
        super().__init__(os.path.join(head, f".{name}{PARTIAL}{uuid.uuid4().hex[:8]}"), "wb")

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        """All of `b`: a raw write may write part of it (a disk filling up does, then fails the next)."""
        data, done = memoryview(b).cast("B"), 0
        try:
            while done < len(data):
                done += super().write(data[done:])
        except BaseException:
            self.failed = True  # a full disk mid-file: the destination keeps what it had
            raise
        return done

    def close(self) -> None:
        if self.closed:
            return
        partial = self.name
        super().close()
        if self.failed:
            os.unlink(partial)
        else:
            os.replace(partial, self.path)


class WholeFiles(fs.FileSystemHandler):
    """The local file system, but a file opened for writing replaces its destination only when closed whole."""

    def __init__(self) -> None:
        self.local = fs.LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WholeFiles)

    def __reduce__(self) -> tuple[type, tuple]:  # Ray hands the storage to every trial's worker
        return WholeFiles, ()

    def get_type_name(self) -> str:
        return "whole-files"

    def normalize_path(self, path: str) -> str:
        return self.local.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[fs.FileInfo]:
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector: fs.FileSelector) -> list[fs.FileInfo]:
        return self.local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to empty the root of the file system")

    def delete_file(self, path: str) -> None:
        self.local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with self.local.open_input_stream(src) as source, self.open_output_stream(dest, None) as out:
            while chunk := source.read(2**20):
                out.write(chunk)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: object) -> pa.NativeFile:
        return pa.PythonFile(_ReplacedWhenClosed(path), mode="w")

    def open_append_stream(self, path: str, metadata: object) -> pa.NativeFile:
        raise OSError(f"{path}: appending is not written whole; Ray Tune's storage never appends")


def whole_file_storage() -> fs.FileSystem:
    """The storage handed to Ray Tune for a sweep's folder."""
    return fs.PyFileSystem(WholeFiles())
