"""Run a streaming job in the foreground until its data is done or the user presses Ctrl-C."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from keyflow.plan.compile import CompiledPlan
from keyflow.runtime.streaming.job import StreamingJob
from keyflow.runtime.streaming.results import BatchMetrics, StreamingResult


def run_streaming(
    plan: CompiledPlan,
    checkpoint: str,
    available_now: bool,
    on_batch: Callable[[BatchMetrics], None] | None = None,
) -> StreamingResult:
    """Run until the available data is processed (``available_now``) or until interrupted.

    Ctrl-C stops the query from another thread (PySpark's own handler would interrupt a py4j
    call half-way and print its tracebacks); a second Ctrl-C leaves at once (the process's
    end releases the checkpoint; the cancelled micro-batch reruns on restart)."""
    job = StreamingJob(plan, checkpoint, available_now, on_batch)
    previous, stopping = None, threading.Event()
    if threading.current_thread() is threading.main_thread():

        def interrupt(signum: int, frame: Any) -> None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            stopping.set()
            threading.Thread(target=job.stop, name="keyflow-stop", daemon=True).start()

        previous = signal.signal(signal.SIGINT, interrupt)
    try:
        job.await_termination()
    except KeyboardInterrupt:
        if stopping.is_set():
            raise
    except BaseException:
        job.stop()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    job.stop()
    return job.result
