"""Before a streaming run: can this plan run on this checkpoint, and from which version?

A new checkpoint gets the plan file of its first run. An existing one must be restorable
by the plan (same pipeline, K, hash, operators' state by uid), and Spark's own source log
must describe the same micro-batches as the state manifests; output committed but not yet
published is published, and anything written after the newest commit is removed.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass

from pyarrow import fs

from keyflow.config import CHECKPOINTS_NUM_RETAINED, IGNORE_UNCLAIMED_STATE, MAX_PARALLELISM
from keyflow.connectors.base import CommitsPartitions, StagesInCheckpoint, StreamingSink, is_unbounded
from keyflow.errors import CheckpointError, PlanError, RestoreError
from keyflow.plan.compile import CompiledPlan
from keyflow.plan.nodes import SourceNode, stream_sources
from keyflow.plan.restore import check_restorable
from keyflow.plan.uids import ambiguous_keyed
from keyflow.runtime.streaming.commit import publish
from keyflow.state.checkpoint import LOCK_FILE, SOURCE_DIR, STAGING_DIR, Checkpoint
from keyflow.state.integrity import check_before_restore, retain
from keyflow.state.manifests import Manifest
from keyflow.state.plan_file import PlanFile, read_plan_file, write_plan_file


@dataclass(frozen=True)
class Restored:
    """Where a run starts: its plan (with the checkpoint's K), the plan file, the newest
    committed version (None: no micro-batch committed yet)."""

    plan: CompiledPlan
    plan_file: PlanFile
    manifest: Manifest | None
    retained: tuple[Manifest, ...] = ()  # the versions kept, oldest first (the last is ``manifest``)


def streaming_sources(plan: CompiledPlan) -> tuple[SourceNode, ...]:
    """The unbounded sources a streaming run reads, in the order of their uids: one Spark query
    reads them all, and its checkpoint keeps each source's offsets by position. A bounded
    source may only be a lookup join's table (read whole at every micro-batch)."""
    sources = [node for node in stream_sources(plan.nodes, plan.roots) if isinstance(node, SourceNode)]
    bounded = [node.name for node in sources if not is_unbounded(node.source)]
    if not sources or bounded:
        raise PlanError(
            "a streaming run (run(checkpoint=...)) reads unbounded sources only, e.g. "
            "datagen(rows_per_second=...), files(..., watch=True) or log(...), and bounded ones only as the table of "
            "a lookup_join(...); "
            + (f"bounded: {bounded} of {[node.name for node in sources]}" if bounded else "this pipeline has none")
        )
    names = [node.name for node in plan.sources if node.explicit_uid is None]  # lookup tables' too
    unnamed = [node.name for node in sources if node.explicit_uid is None and names.count(node.name) > 1]
    if unnamed:
        raise PlanError(
            f"sources {sorted(set(unnamed))} have the same name and no uid, so their derived uids follow the order "
            "they are created in (swapping them would swap their offsets and watermarks); give each source of a "
            "streaming run that has another of its name (a second stream, or a lookup table) a uid: "
            "p.source(..., uid='orders')"
        )
    if len(sources) > 1:
        pre_keyed = [node.name for node in sources if plan.pre_keyed_by(node.id)]
        if pre_keyed:
            raise PlanError(
                f"source {pre_keyed[0]!r} is read pre-keyed (reinterpret_as_keyed) in a streaming run of "
                f"{len(sources)} sources; that is not supported yet: use key_by(...) on it"
            )
    return tuple(sorted(sources, key=lambda node: plan.uid(node.id)))


def restore(plan: CompiledPlan, checkpoint: Checkpoint) -> Restored:
    """Start a new checkpoint, or check and prepare an existing one for ``plan``."""
    for label, sink in plan.outputs().values():
        if not isinstance(sink, StreamingSink):
            raise PlanError(
                f"{label} ({sink!r}) cannot take part in a streaming run: it has no stage/publish for exactly-once "
                "output; use parquet(...), json(...), csv(...), console() or blackhole()"
            )
    for uid, (_, sink) in plan.outputs().items():
        if isinstance(sink, StagesInCheckpoint):
            sink.stage_in(f"{checkpoint.uri.rstrip('/')}/{STAGING_DIR}/{uid.replace('/', '_')}")
    for group in ambiguous_keyed(list(plan.nodes.values())):
        raise PlanError(
            f"keyed operators {[node.name for node in group]} have the same name and keys, so their derived uids "
            f"cannot tell their state apart (built in another order, they would swap state); give each one "
            ".uid('...') before running with a checkpoint"
        )
    check_before_restore(checkpoint)  # nothing on disk changes before this passes
    saved = read_plan_file(checkpoint)
    if saved is None:
        _check_empty(checkpoint)
        return _start(plan, checkpoint)
    if (
        saved.graph.name == plan.graph.name
        and not checkpoint.manifests.versions()
        and not checkpoint.source_batches("commits")
    ):
        # Nothing was ever committed (the first run failed or was killed): no state or output
        # to keep, so the pipeline starts over, also when it was corrected in between.
        checkpoint.fs.delete_dir_contents(checkpoint.path(SOURCE_DIR), missing_dir_ok=True)
        return _start(plan, checkpoint)
    # K is the checkpoint's: state lives in that many key groups.
    current = plan.with_config({MAX_PARALLELISM.key: saved.graph.max_parallelism})
    check_restorable(
        saved.graph,
        current.graph,
        plan.config.get(MAX_PARALLELISM),
        plan.config.get(IGNORE_UNCLAIMED_STATE),
        checkpoint.uri,
    )
    try:
        manifest = checkpoint.manifests.latest()
    except CheckpointError as error:
        raise RestoreError(f"{error}; restore with that keyflow version or use a new checkpoint") from None
    committed = manifest.version if manifest else -1
    _check_source_offsets(checkpoint, committed)
    if manifest is not None:
        publish(current, manifest)  # a crash may have come between the commit and the moves
    checkpoint.state_files.discard_after(committed if manifest else None)
    retain(checkpoint, plan.config.get(CHECKPOINTS_NUM_RETAINED))  # the one listing: files of no version go too
    pending = {entry["uid"]: entry.get("pending", []) for entry in manifest.sinks} if manifest else {}
    for uid, (_, sink) in current.outputs().items():
        sink.discard_after(committed)  # output of batches after the checkpoint (e.g. restored from a copy)
        if isinstance(sink, CommitsPartitions):
            sink.withdraw_commits([entry["partition"] for entry in pending.get(uid, [])])
    return Restored(current, saved, manifest, _readable(checkpoint, manifest))


def _readable(checkpoint: Checkpoint, newest: Manifest | None) -> tuple[Manifest, ...]:
    """The versions retention kept, oldest first, that can be read (the runtime drops them in
    turn as it commits; an unreadable one is left to the next start's retention)."""
    if newest is None:
        return ()
    kept = []
    for version in checkpoint.manifests.versions():
        if version < newest.version:
            with contextlib.suppress(CheckpointError):
                kept.append(checkpoint.manifests.read(version))
    return (*kept, newest)


def _start(plan: CompiledPlan, checkpoint: Checkpoint) -> Restored:
    """A checkpoint's first run: its plan file written, output of any earlier run removed."""
    plan_file = PlanFile(uuid.uuid4().hex, plan.graph)
    write_plan_file(checkpoint, plan_file)
    for _, sink in plan.outputs().values():
        sink.reset()
    checkpoint.state_files.discard_after(None)
    return Restored(plan, plan_file, None)


def _check_empty(checkpoint: Checkpoint) -> None:
    selector = fs.FileSelector(checkpoint.root, allow_not_found=True)
    if any(info.base_name != LOCK_FILE for info in checkpoint.fs.get_file_info(selector)):
        raise CheckpointError(
            f"{checkpoint.uri} is not empty and has no keyflow plan.json, so it is not a keyflow "
            "checkpoint; give an empty or new directory"
        )


def _check_source_offsets(checkpoint: Checkpoint, committed: int) -> None:
    """Spark's source log and the state must describe the same batches: every batch Spark
    committed has a manifest, and the newest manifest's batch is in Spark's offset log
    (its commit may be missing: a crash between the two commits replays it)."""
    consumed = max(checkpoint.source_batches("commits"), default=-1)
    planned = max(checkpoint.source_batches("offsets"), default=-1)
    if consumed > committed:
        fix = (
            f"roll back to version {committed} with 'keyflow checkpoints {checkpoint.uri} --rollback {committed} "
            "--apply' (the input after it is replayed), restore the missing manifests"
            if committed >= 0
            else "restore the missing manifests"
        )
        raise RestoreError(
            f"checkpoint {checkpoint.uri}: the source has consumed batch {consumed} but the newest state manifest is "
            f"version {committed}; manifests were deleted. {fix[0].upper()}{fix[1:]}, or start over with a new "
            "checkpoint directory"
        )
    if planned < committed:
        raise RestoreError(
            f"checkpoint {checkpoint.uri}: the state is at micro-batch {committed} but Spark's source "
            f"checkpoint ({checkpoint.path(SOURCE_DIR)}) only knows batches up to {planned}; it was "
            "deleted or replaced, and new input would be skipped. Restore it, or start over with a new "
            "checkpoint directory"
        )


def fixed_by_first_run(checkpoint: Checkpoint, plan_file: PlanFile, **facts: object) -> PlanFile:
    """Record facts the first run learns (source schema, key types) if not recorded yet."""
    missing = {name: value for name, value in facts.items() if not getattr(plan_file, name)}
    if not missing:
        return plan_file
    updated = plan_file.with_facts(**missing)
    write_plan_file(checkpoint, updated)
    return updated


def check_source_schemas(checkpoint: Checkpoint, plan_file: PlanFile, schemas: dict[str, tuple[str, str]]) -> PlanFile:
    """The sources and their columns are fixed by the first run (an inferred schema could
    drift; Spark's checkpoint keeps offsets by source position); ``schemas``: each source's
    name and schema by uid."""
    recorded = _schemas_text(schemas)
    plan_file = fixed_by_first_run(checkpoint, plan_file, source_schema=recorded)
    if plan_file.source_schema == recorded:
        return plan_file
    before = _schemas_of(plan_file.source_schema or "", list(schemas))
    if set(before) != set(schemas):
        raise RestoreError(
            f"the pipeline now reads sources {sorted(schemas)} (uids) but checkpoint {checkpoint.uri} was started with "
            f"{sorted(before)}; adding, removing or renaming a source of a streaming run needs a new checkpoint "
            "(Spark's own checkpoint tracks each source's offsets by position)"
        )
    uid = next(uid for uid in schemas if before[uid] != schemas[uid][1])
    name, schema = schemas[uid]
    raise RestoreError(
        f"source {name!r} now reads {schema} but checkpoint {checkpoint.uri} was started with {before[uid]}; give "
        "the source that schema explicitly (files(..., schema=...)) or start a new checkpoint"
    )


def _schemas_text(schemas: dict[str, tuple[str, str]]) -> str:
    """One source: its schema (as checkpoints of one source always recorded it); several: a
    JSON object of each source's schema by uid."""
    if len(schemas) == 1:
        return next(iter(schemas.values()))[1]
    return json.dumps({uid: schema for uid, (_, schema) in sorted(schemas.items())})


def _schemas_of(text: str, uids: list[str]) -> dict[str, str]:
    """What :func:`_schemas_text` recorded, by uid (one source: under the only uid asked for)."""
    if text.startswith("{"):
        found: dict[str, str] = json.loads(text)
        return found
    return {uids[0]: text} if len(uids) == 1 else {"(one source)": text}


def check_key_types(
    checkpoint: Checkpoint, plan_file: PlanFile, plan: CompiledPlan, current: dict[str, dict[str, str]]
) -> PlanFile:
    """Key types are part of the state's identity (they decide the hash): the first
    micro-batch records them, every restore must match them (by operator uid)."""
    plan_file = fixed_by_first_run(checkpoint, plan_file, key_types=current)
    names = {uid: node.name for uid, node in plan.keyed_nodes().items()}
    for uid, types in current.items():
        if plan_file.key_types.get(uid, types) != types:
            raise RestoreError(
                f"operator {names[uid]!r}: key columns are now {types} but checkpoint "
                f"{checkpoint.uri} holds state keyed by {plan_file.key_types[uid]}; the same keys would hash to "
                "other key groups. Cast the keys back to those types, or start a new checkpoint"
            )
    return plan_file
