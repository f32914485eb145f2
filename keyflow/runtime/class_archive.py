"""A class-data-sharing archive of the Spark driver's classes (Java's AppCDS), made by the set-up.

A fresh driver JVM loads and verifies some 15,000 Spark classes before its first job: about
12 CPU-seconds on a 2-core machine, 6.5 with the classes mapped from this archive. Every
``keyflow run`` starts a fresh JVM, so each one starts faster. The archive lives in the
virtual environment, beside the jars it was made from; where it does not match them (other
jars, another JDK) the JVM ignores it and loads classes as usual, silently.

Made with ``python -m keyflow.runtime.class_archive`` (``scripts/bootstrap.sh`` runs it).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ARCHIVE = Path(sys.prefix) / "keyflow-spark.jsa"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a mismatched archive is ignored without a warning


def java_options() -> str:
    """The driver JVM's options that map the archive, or nothing where there is none."""
    return f"-XX:SharedArchiveFile={ARCHIVE} {QUIET}" if ARCHIVE.is_file() else ""


def _train(dump_to: Path) -> None:
    """Start a driver that writes the classes it loaded to ``dump_to`` when it exits. Starting
    Spark and one job is enough: a small keyflow pipeline in the same driver made an archive a
    third larger that started a pipeline no faster."""
    from keyflow.runtime.session import LOG_CONFIG, spark_session

    options = f"-Dlog4j2.configurationFile={LOG_CONFIG} -XX:ArchiveClassesAtExit={dump_to} {QUIET}"
    spark = spark_session({"spark.master": "local[2]", "spark.driver.extraJavaOptions": options})
    spark.range(1_000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
    gateway = spark.sparkContext._gateway  # type: ignore[attr-defined]
    spark.stop()
    process = gateway.proc
    process.stdin.close()  # the driver exits when its stdin closes, and writes the archive then
    process.wait(timeout=120)


def main() -> int:
    """Make the archive (replacing an old one); on failure keyflow runs without it."""
    ARCHIVE.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="keyflow-class-archive-") as work:
        dump_to = Path(work) / "classes.jsa"
        try:
            _train(dump_to)
        except Exception as error:  # the archive only saves time: never fail the set-up for it
            print(f"keyflow: no class archive ({type(error).__name__}: {error}); Spark starts without one")
            return 0
        if dump_to.is_file():
            shutil.move(dump_to, ARCHIVE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
