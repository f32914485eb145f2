"""Paths on any ``pyarrow.fs`` filesystem: URIs pass through, local paths become absolute."""

from __future__ import annotations

from pathlib import Path

from pyarrow import fs


def filesystem(path: str) -> tuple[fs.FileSystem, str]:
    """The filesystem of ``path`` and the path on it (no trailing slash)."""
    if "://" in path:
        filesystem_, root = fs.FileSystem.from_uri(path)
        return filesystem_, root.rstrip("/")
    return fs.LocalFileSystem(), str(Path(path).absolute())


def exists(filesystem_: fs.FileSystem, path: str) -> bool:
    return filesystem_.get_file_info(path).type != fs.FileType.NotFound
