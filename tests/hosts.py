"""Several "hosts" on this one machine, for tests that run a Spark standalone cluster across hosts
and inflict faults on them: cut a host off the network, freeze it, or power it off.

Each host is a network namespace with its own IPv4 address (``eth0``, 10.a.b.c/24) plugged into a
bridge. The bridge lives in a namespace of its own (the "switch") rather than in the machine's:
no link is added to the root namespace, the machine's firewall cannot drop bridged traffic
(br_netfilter with a FORWARD DROP policy, as Docker sets it), and deleting the namespaces deletes
every link with them. The hosts have no route off the switch, so two Networks never see each other.

Names carry the creating process's pid (``kf<pid>-<n>`` for the switch, ``kf<pid>-<n>-<host>`` per
host): two pytest-xdist workers don't clash, and what a process killed with SIGKILL left (no
``close``, no atexit; its JVMs still running in their own sessions) is swept by the next Network.
Needs root and iproute2; no tc or iptables.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pyspark

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
MOTO_SERVER = Path(sys.executable).parent / "moto_server"
NETNS_DIR = Path("/run/netns")  # where `ip netns add` pins a namespace by name
NAMESPACE = re.compile(r"kf(\d+)-(\d+)(-[a-z0-9-]+)?")
HOST_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,14}")  # also the switch port's name: at most 15 characters
# Every host has an address and ports of its own, so the ports are fixed.
MASTER_PORT, MASTER_UI_PORT, WORKER_UI_PORT, S3_PORT = 7077, 8080, 8081, 9000
# A TCP connect from inside a namespace, retried until it succeeds (exit 0) or the deadline passes (exit 1).
PROBE = """
import socket, sys, time
address, port, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while (left := deadline - time.monotonic()) > 0:
    try:
        socket.create_connection((address, port), timeout=min(left, 1.0)).close()
        sys.exit(0)
    except OSError:
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
sys.exit(1)
"""

_numbers = itertools.count(1)
_open: set[Network] = set()  # this process's Networks: closed at exit, and told apart from leftovers


class Network:
    """A switch and the hosts plugged into it (``add_host``). ``close`` — or leaving the ``with``
    block, also after an exception — kills every process on every host and deletes the namespaces."""

    def __init__(self) -> None:
        _sweep()
        pid, number = os.getpid(), next(_numbers)
        self.switch = f"kf{pid}-{number}"
        self.subnet = f"10.{200 + pid % 50}.{number % 256}"  # only for telling Networks apart in logs
        self.hosts: list[Host] = []
        self.namespaces: list[str] = []
        self._closed = False
        _open.add(self)
        try:
            self._add_namespace(self.switch)
            # STP off and no forward delay: a port forwards as soon as it is up (also after reconnect).
            _ip("-n", self.switch, "link", "add", "switch", "type", "bridge", "stp_state", "0", "forward_delay", "0")
            _ip("-n", self.switch, "link", "set", "switch", "up")
        except BaseException:
            self.close()
            raise

    def add_host(self, name: str) -> Host:
        """A new host at the next address (.2, .3, ...), its ``eth0`` on the switch, ``lo`` up."""
        if not HOST_NAME.fullmatch(name) or any(host.name == name for host in self.hosts):
            raise ValueError(f"host names are unique, [a-z0-9-], at most 15 characters: {name!r}")
        if len(self.hosts) >= 253:
            raise ValueError(f"a /24 has no address left for {name!r}")
        host = Host(self, name, f"{self.subnet}.{len(self.hosts) + 2}")
        self.hosts.append(host)
        self._add_namespace(host.namespace)
        switch, inside = ("-n", self.switch, "link"), ("-n", host.namespace)
        # Created with its ends already in place, so no half-made veth is ever left in the root namespace.
        _ip(*switch, "add", "name", name, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
        _ip(*switch, "set", "dev", name, "master", "switch", "up")
        _ip(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "dev", "eth0", "up")
        _ip(*inside, "link", "set", "dev", "lo", "up")
        return host

    def close(self) -> None:
        """Kill every process on every host, wait for them, delete the namespaces (and so the links).
        Idempotent; every step runs even if one fails."""
        if self._closed:
            return
        self._closed = True
        with contextlib.ExitStack() as cleanup:  # runs the callbacks last-in first-out: the kills first
            cleanup.callback(_open.discard, self)
            for namespace in self.namespaces:
                cleanup.callback(_delete_namespace, namespace)
            for host in self.hosts:
                cleanup.callback(host.kill)

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _add_namespace(self, namespace: str) -> None:
        self.namespaces.append(namespace)  # before creating it: close deletes it even if a later step fails
        _ip("netns", "add", namespace)


class Host:
    """One machine of a Network, at ``address``. What ``popen`` starts there, and whatever that
    starts in turn (executors, Python workers), lives and dies with the host."""

    def __init__(self, network: Network, name: str, address: str) -> None:
        self.network = network
        self.name = name
        self.address = address
        self.namespace = f"{network.switch}-{name}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def popen(
        self,
        argv: Sequence[str | os.PathLike[str]],
        env: Mapping[str, str] | None = None,
        *,
        log: Path,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host, in a session of its own, stdout and stderr to ``log``. The
        environment is the caller's plus ``env``, with SPARK_LOCAL_IP and SPARK_LOCAL_HOSTNAME set
        to the host's address (as a real host's name would resolve; nothing does a DNS lookup)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        local = {"SPARK_LOCAL_IP": self.address, "SPARK_LOCAL_HOSTNAME": self.address}
        with open(log, "wb") as output:
            process = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, *map(str, argv)],
                env={**os.environ, **local, **(env or {})},
                cwd=cwd,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def kill(self) -> None:
        """Power loss: every process on the host dies at once (SIGKILL), and is waited for. Every process
        in the namespace, not only the process groups ``popen`` started: PySpark's Python daemons
        leave their executor's group."""
        _kill_all(self.namespace, self.processes)
        self.processes.clear()

    def pause(self) -> None:
        """Freeze every process on the host (SIGSTOP): a host that hangs but keeps its connections.
        Returns once all of them are stopped (a signal takes effect a moment after it is sent)."""
        _signal_all(self.namespace, self.processes, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while running := [pid for pid in _pids_in(self.namespace, self.processes) if _state(pid) in "RSD"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes {running} in {self.namespace} did not stop within 10 s")
            time.sleep(0.01)

    def resume(self) -> None:
        """Undo ``pause`` (SIGCONT)."""
        _signal_all(self.namespace, self.processes, signal.SIGCONT)

    def disconnect(self) -> None:
        """Pull the cable: the switch's port goes down, so nothing passes either way. The host keeps
        its address and routes (its eth0 only loses carrier): connects time out rather than fail at once."""
        _ip("-n", self.network.switch, "link", "set", "dev", self.name, "down")

    def reconnect(self) -> None:
        """Plug the cable back in; the port forwards at once (no STP)."""
        _ip("-n", self.network.switch, "link", "set", "dev", self.name, "up")

    def reaches(self, address: str, port: int, timeout: float = 5.0) -> bool:
        """Whether a TCP connect from this host to ``address:port`` succeeds within ``timeout`` seconds,
        retrying meanwhile (a server may still be starting). The machine's own namespace has no
        address on the switch, so the probe runs here."""
        probe = [sys.executable, "-I", "-c", PROBE, address, str(port), str(timeout)]
        done = subprocess.run(["ip", "netns", "exec", self.namespace, *probe], timeout=timeout + 30, check=False)
        return done.returncode == 0

    def start_s3(self, directory: Path) -> str:
        """moto_server on this host (log in ``directory``); returns its endpoint, ``http://<address>:<port>``."""
        log = directory / "moto.out"
        self.popen([MOTO_SERVER, "-H", self.address, "-p", str(S3_PORT)], log=log, cwd=directory)
        if not self.reaches(self.address, S3_PORT, timeout=60):
            raise TimeoutError(f"moto_server did not listen on {self.address}:{S3_PORT}:\n{_tail(log)}")
        return f"http://{self.address}:{S3_PORT}"

    def start_spark_master(self, directory: Path, worker_timeout_s: int = 8) -> str:
        """A Spark standalone master on this host, ready (elected leader); returns its URL. A worker
        that sends no heartbeat for ``worker_timeout_s`` seconds is declared lost (Spark's default: 60),
        so a cut or killed worker host shows within seconds. Log: ``directory/master.out``."""
        log = directory / "master.out"
        process = self.popen(
            [SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", self.address,
             "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)],
            env=_spark_env(directory, "SPARK_MASTER_OPTS", worker_timeout_s),
            log=log,
        )  # fmt: skip
        wait_for_log(log, "I have been elected leader", process)
        return f"spark://{self.address}:{MASTER_PORT}"

    def start_spark_worker(
        self,
        master_url: str,
        directory: Path,
        cores: int = 1,
        memory: str = "1g",
        worker_timeout_s: int = 8,
    ) -> None:
        """A Spark standalone worker on this host (work dir and log ``worker.out`` in ``directory``).
        ``worker_timeout_s`` must be the master's: a worker heartbeats every quarter of it, and with
        Spark's default (every 15 s) a master expecting one within 8 s would drop it over and over.
        Returns once the master registered it."""
        log = directory / "worker.out"
        process = self.popen(
            [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", master_url, "--host", self.address,
             "--cores", str(cores), "--memory", memory, "--webui-port", str(WORKER_UI_PORT),
             "--work-dir", str(directory / "work")],
            env=_spark_env(directory, "SPARK_WORKER_OPTS", worker_timeout_s),
            log=log,
        )  # fmt: skip
        wait_for_log(log, "Successfully registered with master", process)


def wait_for_log(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Wait until ``text`` appears in ``log``; fail early, with the log, if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode} before logging {text!r}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not logged within {timeout} s:\n{_tail(log)}")
        time.sleep(0.2)


def _spark_env(directory: Path, options: str, worker_timeout_s: int) -> dict[str, str]:
    return {"SPARK_LOG_DIR": str(directory / "logs"), options: f"-Dspark.worker.timeout={worker_timeout_s}"}


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


def _ip(*arguments: str) -> None:
    done = subprocess.run(["ip", *arguments], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(arguments)}: {done.stderr.strip()}")


def _pids_in(namespace: str, children: Sequence[subprocess.Popen[bytes]] = ()) -> set[int]:
    """Every live process in ``namespace``, whoever started it (what ``ip netns pids`` prints), and
    those of our ``children`` not reaped yet: ``ip netns exec`` runs a moment before it enters it."""
    pids = {child.pid for child in children if child.poll() is None}  # unreaped: the pid is still theirs
    try:
        pinned = os.stat(NETNS_DIR / namespace)
    except FileNotFoundError:
        return pids
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile, or a zombie (no namespaces any more)
                found = os.stat(f"/proc/{entry.name}/ns/net")
                if (found.st_dev, found.st_ino) == (pinned.st_dev, pinned.st_ino):
                    pids.add(int(entry.name))
    return pids


def _signal_all(namespace: str, children: Sequence[subprocess.Popen[bytes]], signum: int) -> None:
    """Signal every process in ``namespace`` and our ``children``; again until a pass finds none new
    (one may have forked)."""
    signalled: set[int] = set()
    while fresh := _pids_in(namespace, children) - signalled:
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        signalled |= fresh


def _state(pid: int) -> str:
    """A process's state letter: R, S, D while it may run; T when stopped; X once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def _kill_all(namespace: str, children: Sequence[subprocess.Popen[bytes]] = (), timeout: float = 30) -> None:
    """SIGKILL everything in ``namespace`` until nothing is left, reaping our own ``children``."""
    deadline = time.monotonic() + timeout
    while pids := _pids_in(namespace, children):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {sorted(pids)} in {namespace} survived SIGKILL for {timeout} s")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    for child in children:
        child.wait(timeout=timeout)


def _delete_namespace(namespace: str) -> None:
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)  # already gone: fine


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _sweep() -> None:
    """Remove what Networks of dead processes left, killing what still runs there. A name with this
    process's pid that no open Network owns is a leftover too: pids repeat in a fresh container."""
    owned = {namespace for network in _open for namespace in network.namespaces}
    for namespace in sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.exists() else []:
        match = NAMESPACE.fullmatch(namespace)
        if match and namespace not in owned and (int(match[1]) == os.getpid() or not _alive(int(match[1]))):
            _kill_all(namespace)
            _delete_namespace(namespace)


@atexit.register
def _close_all() -> None:
    """A safety net for Networks a test forgot to close (not for SIGKILL: ``_sweep`` handles that)."""
    for network in list(_open):
        network.close()
