#!/usr/bin/env bash
# Create .venv with Python 3.11+ and the pinned dependencies; check Java 17+ first.
set -euo pipefail
cd "$(dirname "$0")/.."

python=""
for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 \
     && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    python=$(command -v "$candidate"); break
  fi
done
if [ -z "$python" ]; then
  echo "error: keyflow needs Python 3.11+ (none of python3.11..python3.13/python3 is 3.11+); install python3.11 or set PYTHON=/path/to/python" >&2
  exit 1
fi

"$python" keyflow/runtime/java.py

if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $python"
  "$python" -m venv .venv
fi
# Bytecode is compiled once here, on all cores, instead of by pip one file at a time. It must
# exist: where PYTHONDONTWRITEBYTECODE is set (CI machines) Python never caches what it compiles,
# and every Spark Python worker, data source runner and `keyflow run` would compile pandas,
# pyarrow and pyspark from source again (~2.5 s of CPU per process). Their tests are skipped.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -r requirements.lock
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile --no-deps --no-build-isolation -e .
.venv/bin/python -m compileall -q -j 0 -x '/tests?/' .venv/lib/python*/site-packages >/dev/null
# Spark's classes, archived for the driver JVM (keyflow/runtime/class_archive.py): each keyflow
# run starts Spark in about half the CPU time. Made with the C1 compiler alone: it is done sooner.
JDK_JAVA_OPTIONS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" .venv/bin/python -m keyflow.runtime.class_archive 2>/dev/null
touch .venv/.installed
