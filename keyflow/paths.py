"""Paths on any ``pyarrow.fs`` filesystem: URIs pass through, local paths become absolute."""

from __future__ import annotations

import fcntl
import uuid
from pathlib import Path
from typing import IO

import pyarrow as pa
from pyarrow import fs

from keyflow import s3
from keyflow.errors import KeyflowError

OBJECT_STORES = (fs.S3FileSystem, fs.GcsFileSystem)  # an object appears whole when its upload completes


def is_uri(path: str) -> bool:
    return "://" in path


def absolute(path: str | Path) -> str:
    """``path`` as Spark's JVM and Python workers must see it: a URI as given, a local path
    made absolute (they do not share this process's working directory)."""
    return str(path) if is_uri(str(path)) else str(Path(path).absolute())


def filesystem(path: str) -> tuple[fs.FileSystem, str]:
    """The filesystem of ``path`` and the path on it (no trailing slash). ``s3://bucket/path``
    is reached with the ``s3.*`` options (:mod:`keyflow.s3`) unless the URI carries its own
    query (``?endpoint_override=...``)."""
    if path.startswith("s3://") and "?" not in path and "@" not in path.split("/", 3)[2]:  # no user:secret@bucket
        root = path.removeprefix("s3://").rstrip("/")
        return s3.filesystem(s3.S3Settings.from_environment().for_bucket(root.split("/", 1)[0])), root
    if is_uri(path):
        try:
            filesystem_, root = fs.FileSystem.from_uri(path)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as error:
            raise KeyflowError(
                f"{path} is not a location keyflow can open ({error}); give a local path or a URI such as "
                "file:///data/x, s3://bucket/x, gs://bucket/x or hdfs://namenode/x"
            ) from None
        return filesystem_, root.rstrip("/")
    return fs.LocalFileSystem(), absolute(path)


def write_atomically(filesystem_: fs.FileSystem, path: str, data: bytes) -> None:
    """Readers see all of it or nothing: an object store makes an object visible only once its
    upload completes, so it is written in place (a move there is a copy and a delete); other
    filesystems get a temporary name, then an atomic rename."""
    if isinstance(filesystem_, OBJECT_STORES):
        with filesystem_.open_output_stream(path) as stream:
            stream.write(data)
        return
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    with filesystem_.open_output_stream(temporary) as stream:
        stream.write(data)
    filesystem_.move(temporary, path)


def exists(filesystem_: fs.FileSystem, path: str) -> bool:
    return bool(filesystem_.get_file_info(path).type != fs.FileType.NotFound)


def lock_file(path: str, wait: bool) -> IO[str] | None:
    """An exclusive lock on a local file, held until ``unlock`` or the process ends (even by
    SIGKILL); None if ``wait`` is False and another process or handle holds it."""
    handle = open(path, "a+")  # noqa: SIM115 - the caller holds it as long as the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def unlock(handle: IO[str] | None) -> None:
    if handle is not None and not handle.closed:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
