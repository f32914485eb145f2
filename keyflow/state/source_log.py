"""Spark's own log of the streaming sources (offsets, commits, source metadata), kept in the checkpoint.

Spark writes this log through Hadoop's filesystems, which reach local disk and HDFS but not the
object stores keyflow reaches through PyArrow. So for a checkpoint on an object store Spark
writes a working copy on the driver's disk, and keyflow copies what Spark wrote into the
checkpoint's ``source/`` before each commit and back before each run: the checkpoint alone
holds what a restore needs, on any host, as Flink keeps its sources' offsets in its checkpoints.

The copy in the checkpoint may lack Spark's commit entry of the newest batch (Spark writes it
after the batch's commit): Spark then runs that batch again, and keyflow skips it as committed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from pyarrow import fs

from keyflow.state.checkpoint import SOURCE_DIR, Checkpoint

ORDER = ("metadata", "sources", "offsets", "commits")  # Spark's order: an offset entry needs its sources' entries


class SourceLog:
    """Where Spark keeps the source log for ``checkpoint`` (``location``), and its copy. A
    checkpoint on an object store gets a working copy of this run's own (removed by ``close``),
    so no other process or run deletes what the next push would then delete from the checkpoint."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.remote = checkpoint.path(SOURCE_DIR)
        self._copied: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) in the checkpoint
        if checkpoint.on_object_store:
            self.local: Path | None = Path(tempfile.mkdtemp(prefix="keyflow-source-log-")) / SOURCE_DIR
            self.location = str(self.local)
        else:
            self.local, self.location = None, f"{checkpoint.uri.rstrip('/')}/{SOURCE_DIR}"

    def pull(self) -> None:
        """Before a run: the working copy is exactly the checkpoint's (listed once, at start)."""
        if self.local is None:
            return
        shutil.rmtree(self.local, ignore_errors=True)
        self._copied.clear()
        selector = fs.FileSelector(self.remote, recursive=True, allow_not_found=True)
        for info in self.checkpoint.fs.get_file_info(selector):
            if info.type != fs.FileType.File:
                continue
            relative = info.path[len(self.remote) + 1 :]
            target = self.local / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with self.checkpoint.fs.open_input_stream(info.path) as stream:
                target.write_bytes(stream.read())
            self._copied[relative] = _stamp(target)

    def push(self) -> None:
        """Copy what Spark wrote since the last push into the checkpoint, in Spark's own order,
        and remove there what Spark removed (it keeps its last 100 batches); the working copy
        is read, the checkpoint never listed."""
        if self.local is None:
            return
        present = {}
        for directory, _, names in os.walk(self.local):
            for name in names:
                if not name.startswith("."):  # Hadoop's checksums and Spark's temporary files
                    with contextlib.suppress(FileNotFoundError):  # purged by Spark meanwhile
                        path = Path(directory) / name
                        present[str(path.relative_to(self.local))] = _stamp(path)
        for relative, stamp in sorted(present.items(), key=_in_spark_order):
            if self._copied.get(relative) != stamp:
                try:
                    data = (self.local / relative).read_bytes()
                except FileNotFoundError:
                    continue
                with self.checkpoint.fs.open_output_stream(f"{self.remote}/{relative}") as stream:
                    stream.write(data)
                self._copied[relative] = stamp
        for relative in sorted(set(self._copied) - set(present)):
            self.checkpoint.fs.delete_file(f"{self.remote}/{relative}")
            del self._copied[relative]

    def close(self) -> None:
        if self.local is not None:
            shutil.rmtree(self.local.parent, ignore_errors=True)


def _in_spark_order(item: tuple[str, object]) -> tuple[int, str]:
    top = item[0].split("/", 1)[0]
    return (ORDER.index(top) if top in ORDER else len(ORDER), item[0])


def _stamp(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_size, status.st_mtime_ns
