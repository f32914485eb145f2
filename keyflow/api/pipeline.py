"""``Pipeline``: the entry point users write against. It collects plan nodes, compiles
them (``keyflow.plan``) and hands the compiled plan to the runtime."""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keyflow.api.stream import Stream, check_parallelism_option
from keyflow.changelog import DELETED, OP
from keyflow.config import Config, load_yaml
from keyflow.connectors.base import Source
from keyflow.errors import PlanError
from keyflow.plan import nodes
from keyflow.plan.compile import CompiledPlan, compile_plan
from keyflow.plan.graph import JobGraph
from keyflow.plan.uids import check_uid

if TYPE_CHECKING:
    import pyarrow as pa

    from keyflow.runtime.executor import RunResult
    from keyflow.runtime.streaming import BatchMetrics, StreamingJob, StreamingResult
    from keyflow.sql.planner import Catalog

_overrides: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("keyflow_overrides", default=None)


@contextmanager
def config_overrides(values: Mapping[str, Any]) -> Iterator[None]:
    """Configuration that wins over what a pipeline file sets (the CLI's ``--conf``)."""
    token = _overrides.set(dict(values))
    try:
        yield
    finally:
        _overrides.reset(token)


class Pipeline:
    """A dataflow of sources, operators and sinks, run on Spark.

    ``config`` is a mapping or a YAML file path of options (see docs/configuration.md);
    ``parallelism`` is shorthand for ``parallelism.default``.
    """

    def __init__(self, parallelism: int | None = None, config: Mapping[str, Any] | str | Path | None = None) -> None:
        values = load_yaml(config) if isinstance(config, (str, Path)) else dict(config or {})
        if parallelism is not None:
            values["parallelism.default"] = check_parallelism_option(parallelism, "pipeline")
        self.config = Config(values).merged(_overrides.get())
        self._nodes: dict[int, nodes.Node] = {}
        self._sinks: list[int] = []
        self._catalog: Catalog | None = None

    def source(
        self, source: Any, parallelism: int | None = None, name: str | None = None, uid: str | None = None
    ) -> Stream:
        """A stream reading ``source``; ``parallelism`` is the source's own (``scan.parallelism``)."""
        if not isinstance(source, Source):
            raise PlanError(f"{source!r} is not a source; use datagen(...), files(...) or log(...)")
        label = name or f"source: {source.describe().get('connector', 'source')}"
        checked = check_parallelism_option(parallelism, f"source {label!r}")
        node_id = self.add(
            nodes.SourceNode, (), label, checked, explicit_uid=None if uid is None else check_uid(uid), source=source
        )
        if getattr(source, "changelog_mode", "insert") != "insert" and getattr(source, "primary_key", ()):
            node_id = self._normalized(node_id, source, label, checked)
        return Stream(self, node_id)

    def _normalized(self, node_id: int, source: Any, label: str, parallelism: int | None) -> int:
        """A changelog source with a primary key, normalized by it (Flink's ChangelogNormalize):
        rows are routed by the key's key group and its previous row lives in keyed state."""
        keys = tuple(source.primary_key)
        if source.changelog_mode == "all":
            # As Flink's ChangelogNormalize: -U and -D delete the key; a +U after -U (the newest) upserts it.
            deleted = f"{OP} IN ('-U', '-D')"
        else:
            values = [name for name in source.schema.names if name not in keys]
            deleted = " AND ".join(f"`{name}` IS NULL" for name in values) or "false"
        node_id = self.add(
            nodes.WithColumnsNode, (node_id,), f"row kind {label}", parallelism, columns={DELETED: deleted}
        )
        return self.add(
            nodes.NormalizeNode, (node_id,), f"normalize {label}", None, keys=keys, mode=source.changelog_mode
        )

    def add(
        self, kind: type[nodes.Node], inputs: tuple[int, ...], name: str, parallelism: int | None, **fields: Any
    ) -> int:
        """Add an operator; its id is its position in creation order."""
        node_id = len(self._nodes) + 1
        self._nodes[node_id] = kind(node_id, inputs, name, parallelism, **fields)
        return node_id

    @property
    def operators(self) -> Mapping[int, nodes.Node]:
        """Every operator added so far, by id."""
        return self._nodes

    def set_option(self, key: str, value: Any) -> None:
        """Set one configuration option (SQL's ``SET``); ``--conf`` given to the CLI still wins."""
        self.config = self.config.merged({key: value}).merged(_overrides.get())

    def sql(self, text: str) -> Stream | None:
        """Run SQL statements on this pipeline (see docs/sql.md): ``CREATE TABLE`` declares
        tables, ``INSERT INTO`` adds sinks, ``SET`` sets options, ``EXPLAIN`` prints a plan.
        A final bare ``SELECT`` returns its stream, to go on with the Python API."""
        from keyflow.sql.planner import plan_script

        planned = plan_script(self, text)
        for explained in planned.explained:
            print(explained)
        return planned.stream

    def create_temporary_view(self, name: str, stream: Stream) -> None:
        """Make ``stream`` readable in SQL as ``FROM name``."""
        if not isinstance(name, str) or not name.isidentifier():
            raise PlanError(f"view name {name!r} must be an identifier such as 'clicks'")
        if name in self.catalog.tables or name in self.catalog.views:
            raise PlanError(f"a table or view named {name!r} exists already; choose another name")
        self.catalog.views[name] = stream.node_id

    @property
    def catalog(self) -> Catalog:
        """The tables and views SQL statements of this pipeline know."""
        if self._catalog is None:
            from keyflow.sql.planner import Catalog

            self._catalog = Catalog()
        return self._catalog

    def node(self, node_id: int) -> nodes.Node:
        return self._nodes[node_id]

    def replace(self, node_id: int, **changes: Any) -> None:
        """Change an operator's settings (nodes are immutable: this swaps in a new one)."""
        self._nodes[node_id] = dataclasses.replace(self._nodes[node_id], **changes)

    def add_sink(self, node_id: int) -> None:
        self._sinks.append(node_id)

    def compile(self) -> CompiledPlan:
        """What runs: every sink and what it depends on, compiled."""
        if not self._sinks:
            raise PlanError("the pipeline has no sink; end a stream with .sink(parquet('out/...')) or use .to_arrow()")
        return compile_plan(self._nodes, tuple(self._sinks), self.config)

    def plan(self) -> JobGraph:
        """The job graph: vertices with parallelism and max parallelism, edges with partitioners.

        Without sinks (streams only collected with ``to_arrow``/``to_pandas``), the plan of
        every stream nothing else reads."""
        if self._sinks:
            return self.compile().graph
        consumed = {input_id for node in self._nodes.values() for input_id in node.inputs}
        ends = tuple(node_id for node_id in self._nodes if node_id not in consumed)
        if not ends:
            raise PlanError("the pipeline is empty; start with p.source(datagen(...)) or p.source(files(...))")
        return compile_plan(self._nodes, ends, self.config).graph

    def run(
        self,
        checkpoint: str | None = None,
        available_now: bool = False,
        on_batch: Callable[[BatchMetrics], None] | None = None,
    ) -> RunResult | StreamingResult:
        """Run every sink. Bounded sources: one batch job. An unbounded source: a streaming
        job with exactly-once state and sinks in ``checkpoint`` (or ``state.checkpoints.dir``)
        that runs until interrupted, or with ``available_now`` until the data there now is done;
        ``on_batch`` is called with each committed micro-batch's metrics."""
        plan = self.compile()
        if checkpoint is None and self.config["state.checkpoints.dir"] is None and not self.is_streaming():
            from keyflow.runtime.executor import run_batch

            return run_batch(plan)
        from keyflow.runtime.streaming import run_streaming

        return run_streaming(plan, self._checkpoint(checkpoint), available_now, on_batch)

    def start(
        self, checkpoint: str | None = None, on_batch: Callable[[BatchMetrics], None] | None = None
    ) -> StreamingJob:
        """Start a streaming run and return its handle (status, last batch, rescale, stop)."""
        from keyflow.runtime.streaming import StreamingJob

        plan = self.compile()
        return StreamingJob(plan, self._checkpoint(checkpoint), False, on_batch)

    def _checkpoint(self, checkpoint: str | None) -> str:
        """The checkpoint to run with: the argument, else ``state.checkpoints.dir``."""
        checkpoint = checkpoint or self.config["state.checkpoints.dir"]
        if checkpoint is None:
            raise PlanError(
                "this pipeline reads an unbounded source, so it needs a checkpoint directory: "
                "run(checkpoint='ckpt/my-pipeline') or --checkpoint DIR or state.checkpoints.dir"
            )
        if not isinstance(checkpoint, str) or not checkpoint.strip():
            raise PlanError(f"checkpoint={checkpoint!r} is not a directory path or URI")
        return str(checkpoint)

    def is_streaming(self) -> bool:
        """Whether the pipeline reads an unbounded source (so it runs as a stream)."""
        needed = nodes.upstream(self._nodes, self._sinks)
        return any(getattr(node.source, "unbounded", False) for node in needed if isinstance(node, nodes.SourceNode))

    def collect(self, node_id: int) -> pa.Table:
        """Run the plan up to the operator ``node_id`` and return its rows."""
        from keyflow.runtime.executor import collect

        return collect(compile_plan(self._nodes, (node_id,), self.config))
