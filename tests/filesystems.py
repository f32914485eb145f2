"""A filesystem wrapper for tests and benchmarks that measure what a restore reads."""

from __future__ import annotations

import pyarrow as pa
from pyarrow import fs


class CountingFiles:
    """A filesystem that counts the bytes read from the files it opens."""

    def __init__(self, inner: fs.FileSystem) -> None:
        self.inner, self.read = inner, 0

    def open_input_file(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(_Counted(self, self.inner.open_input_file(path)), mode="r")

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class _Counted:
    def __init__(self, counter: CountingFiles, handle: pa.NativeFile) -> None:
        self.counter, self.handle = counter, handle
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size if size >= 0 else None)
        self.counter.read += len(data)
        return bytes(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.handle.seek(offset, whence))

    def tell(self) -> int:
        return int(self.handle.tell())

    def close(self) -> None:
        self.closed = True
        self.handle.close()
