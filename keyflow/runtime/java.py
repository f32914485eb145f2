"""Check for Java 17+ before Spark starts, so users see a fix instead of a JVM stack.

Standard library only: the Makefile runs this file before any dependency is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

MIN_JAVA = 17
INSTALL_HINT = (
    "install a Java 17+ runtime (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) "
    "and put it on PATH or set JAVA_HOME"
)


class JavaNotFoundError(RuntimeError):
    """No usable Java runtime for Spark."""


def java_executable() -> str:
    """The ``java`` Spark will run: ``$JAVA_HOME/bin/java`` if set, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        where = f"JAVA_HOME={java_home}" if java_home else "PATH"
        raise JavaNotFoundError(
            f"no java executable found via {where}; keyflow runs on Spark, which needs Java {MIN_JAVA}+: {INSTALL_HINT}"
        )
    return candidate


def java_major_version(executable: str) -> int:
    """Major version from ``java -version`` (``1.8.0_x`` is 8, ``17.0.15`` is 17)."""
    result = subprocess.run([executable, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        raise JavaNotFoundError(
            f"could not read the version of {executable} "
            f"(`java -version` said: {result.stderr.strip()!r}); {INSTALL_HINT}"
        )
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> str:
    """Return the java executable, or raise with the fix if it is missing or too old."""
    executable = java_executable()
    major = java_major_version(executable)
    if major < MIN_JAVA:
        raise JavaNotFoundError(f"{executable} is Java {major}; keyflow needs Java {MIN_JAVA} or newer: {INSTALL_HINT}")
    return executable


if __name__ == "__main__":
    try:
        executable = require_java()
        print(f"java: {executable} (Java {java_major_version(executable)})")
    except JavaNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
