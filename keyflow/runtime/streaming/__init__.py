"""Streaming: the compiled plan run per micro-batch by Structured Streaming's ``foreachBatch``,
with keyed state and file sinks exactly once.

| module | its one job |
|---|---|
| ``job`` | the running job's handle: start, status, rescale at batch boundaries, stop |
| ``restore`` | checks before a run: the checkpoint matches the plan, Spark's offsets match the state |
| ``commit`` | one micro-batch, committed (the commit protocol) |
| ``interrupt`` | run until done or Ctrl-C |
| ``faults`` | crash-test fault points |
| ``results`` | what a run reports |
"""

from keyflow.runtime.streaming.faults import FAULT_ENV
from keyflow.runtime.streaming.interrupt import run_streaming
from keyflow.runtime.streaming.job import StreamingJob
from keyflow.runtime.streaming.results import BatchMetrics, StreamingResult

__all__ = ["FAULT_ENV", "BatchMetrics", "StreamingJob", "StreamingResult", "run_streaming"]
