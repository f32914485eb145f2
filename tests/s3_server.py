"""A real S3-compatible server for tests: moto in server mode (from PyPI, pinned), on loopback.

moto keeps objects in memory, so the server lives as long as the tests that use it; its
access log (one line per request) tells which requests a run sent, e.g. that a micro-batch
listed nothing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pyarrow import fs

from keyflow.runtime.standalone import free_port

ACCESS_KEY, SECRET_KEY, REGION = "keyflow-test", "keyflow-test-secret", "us-east-1"
LISTING = re.compile(r'"GET /[^/ ?]+/?\?[^"]*list-type=2')  # ListObjectsV2


class S3Server:
    """``S3Server(directory)`` serves S3 at ``endpoint`` until ``close()``; ``pause``/``resume``
    stop and continue the server process (requests hang, as on a stalled store)."""

    def __init__(self, directory: Path, host: str = "127.0.0.1") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "moto.log"
        self.endpoint = f"http://{host}:{free_port()}"
        port = self.endpoint.rsplit(":", 1)[1]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).with_name("moto_server")), "-H", host, "-p", port],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.close()
                    raise RuntimeError(f"moto_server did not start:\n{self.log_path.read_text()}") from None
                time.sleep(0.2)

    def config(self, **extra: object) -> dict[str, object]:
        """The pipeline options that reach this server."""
        return {"s3.endpoint": self.endpoint, "s3.access-key": ACCESS_KEY, "s3.secret-key": SECRET_KEY,
                "s3.endpoint.region": REGION, **extra}  # fmt: skip

    def environment(self) -> dict[str, str]:
        """The same, as the AWS SDK's environment variables (for processes given no s3.* options)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}  # fmt: skip

    def filesystem(self) -> fs.S3FileSystem:
        host = self.endpoint.removeprefix("http://")
        return fs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION, endpoint_override=host,
                               scheme="http", allow_bucket_creation=True)  # fmt: skip

    def bucket(self, name: str) -> str:
        self.filesystem().create_dir(name)
        return f"s3://{name}"

    def requests(self) -> list[str]:
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if '"' in line]

    def pause(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
