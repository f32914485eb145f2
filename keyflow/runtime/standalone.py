"""A Spark standalone cluster on this machine (loopback), from the PySpark distribution.

For trying cluster behaviour without a cluster — executors that come and go under the
adaptive scheduler (examples/autoscale.py) — and for the tests that check it. Master and
workers are separate JVMs, each in its own process group, so stopping a worker takes its
executors with it, like a lost node, and ``close()`` leaves no process behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyspark

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


class StandaloneCluster:
    """``StandaloneCluster(dir)`` starts a master (``.url``); ``add_worker``/``stop_worker``; ``close``.
    Logs go to ``dir/<name>.out``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"spark://{LOOPBACK}:{self.port}"
        self.env = {**os.environ, "SPARK_LOCAL_IP": LOOPBACK, "SPARK_LOG_DIR": str(directory / "logs")}
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(self.port),
                    "--webui-port", str(free_port()))  # fmt: skip
        self._wait_for_port(self.port)

    def add_worker(self, name: str, cores: int = 1) -> None:
        self._start(name, "org.apache.spark.deploy.worker.Worker", self.url, "--cores", str(cores),
                    "--memory", "1g", "--host", LOOPBACK, "--webui-port", str(free_port()),
                    "--work-dir", str(self.directory / name))  # fmt: skip

    def stop_worker(self, name: str) -> None:
        """Like a lost node: the worker and its executors die at once (SIGKILL to the process
        group; a SIGTERM'd worker may still launch a replacement executor while it shuts down)."""
        process = self._processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)

    def close(self) -> None:
        for name in list(self._processes):
            process = self._processes.pop(name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.out").read_text(errors="replace")

    def _start(self, name: str, *arguments: str) -> None:
        with open(self.directory / f"{name}.out", "wb") as output:
            self._processes[name] = subprocess.Popen(
                [str(SPARK_CLASS), *arguments], env=self.env, stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def _wait_for_port(self, port: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex((LOOPBACK, port)) == 0:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"the Spark master did not listen on {port} within {timeout} s:\n{self.log('master')}")
