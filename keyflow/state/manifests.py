"""The manifest log: one sealed manifest per committed version, written last and atomically
(the commit point). A version is what its manifest lists; nothing else is read on restore.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pyarrow import fs

from keyflow.errors import CheckpointError, DamagedFileError, KeyflowError
from keyflow.state.assignment import StateFile
from keyflow.state.seal import UnsealedError, seal, unseal

if TYPE_CHECKING:
    from keyflow.state.checkpoint import Checkpoint

FORMAT_VERSION = 3  # 3: state files' footer checksums; 2: sealed manifests with checksums; 1: nothing to check


@dataclass
class Manifest:
    """What one committed version consists of."""

    version: int
    parallelism: int
    max_parallelism: int
    operators: dict[str, list[StateFile]]
    sinks: list[dict[str, Any]] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    # A pre-keyed source: {"splits": [key group of each split],
    #                      "index": {uid: [[index file, rows, bytes, checksum]]}}
    pre_keyed: dict[str, Any] = field(default_factory=dict)
    checkpoint_id: str = ""  # plan.json's: a manifest copied from another checkpoint is told apart
    plan: dict[str, Any] = field(default_factory=dict)  # plan.json's content at commit, to restore a lost one
    # By source uid: the watermark after this version and each split's progress (SourceWatermark)
    watermarks: dict[str, Any] = field(default_factory=dict)

    def files(self) -> list[str]:
        """Every file of the checkpoint this version needs: state files and split indexes."""
        return list(self.needed())

    def needed(self) -> dict[str, tuple[int | None, str | None]]:
        """Every file this version needs, with its size and checksum (None: not recorded, as in
        format 1)."""
        needed: dict[str, tuple[int | None, str | None]] = {
            f.path: (f.bytes, f.checksum) for files in self.operators.values() for f in files
        }
        for files in self.pre_keyed.get("index", {}).values():
            for path, _, *recorded in files:
                needed[path] = (recorded[0], recorded[1]) if recorded else (None, None)
        return needed

    def to_json(self) -> str:
        return seal({"format_version": FORMAT_VERSION, **asdict(self)})

    @staticmethod
    def from_json(text: str, relative: str) -> Manifest:
        """Raises DamagedFileError (torn, altered, of another version) or CheckpointError (format)."""
        try:
            data = unseal(text, sealed=False)
            format_version = data.pop("format_version", None)
            if format_version not in (1, 2, FORMAT_VERSION):
                raise CheckpointError(
                    f"{relative} has format {format_version}, which this keyflow does not read: it was written by "
                    "another keyflow version; run the pipeline with that version"
                )
            if format_version != 1:
                unseal(text)  # this format carries a checksum: its absence is damage
            data["operators"] = {uid: [StateFile(**f) for f in files] for uid, files in data["operators"].items()}
            manifest = Manifest(**data)
        except UnsealedError as damage:
            raise DamagedFileError(relative, damage.problem) from None
        except KeyflowError:
            raise  # another format: not damage (a rollback would not help)
        except (TypeError, KeyError, AttributeError, ValueError) as error:
            raise DamagedFileError(relative, f"is not a keyflow manifest ({type(error).__name__}: {error})") from None
        if relative != manifest_path(manifest.version):
            raise DamagedFileError(relative, f"holds version {manifest.version}: it was copied or renamed")
        return manifest


def manifest_path(version: int) -> str:
    return f"manifests/{version:010d}.json"


class ManifestLog:
    """The committed versions of a checkpoint, oldest first."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint

    def versions(self) -> list[int]:
        selector = fs.FileSelector(self.checkpoint.path("manifests"), allow_not_found=True)
        names = [info.base_name for info in self.checkpoint.fs.get_file_info(selector)]
        return sorted(int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit())

    def read(self, version: int) -> Manifest:
        relative = manifest_path(version)
        try:
            text = self.checkpoint.read_text(relative)
        except FileNotFoundError:
            raise DamagedFileError(relative, "is missing") from None
        except UnicodeDecodeError:
            raise DamagedFileError(relative, "was altered: it is not text") from None
        return Manifest.from_json(text, relative)

    def _present(self, relative: str) -> bool:
        """Whether the object exists, by reading it: an object store's file info of a missing
        key also lists the prefix (it might be a directory)."""
        try:
            with self.checkpoint.fs.open_input_stream(self.checkpoint.path(relative)):
                return True
        except FileNotFoundError:
            return False

    def latest(self) -> Manifest | None:
        versions = self.versions()
        return self.read(versions[-1]) if versions else None

    def check_uncommitted(self, version: int) -> None:
        """On an object store (no lock): refuse to commit ``version`` if its manifest exists,
        i.e. another job committed it while this one ran it."""
        if self.checkpoint.on_object_store and self._present(manifest_path(version)):
            raise CheckpointError(
                f"version {version} of checkpoint {self.checkpoint.uri} was committed by another job while this one "
                "ran it; run one job per checkpoint (stop the other one), then run this pipeline again"
            )

    def commit(self, manifest: Manifest) -> None:
        """Write the version's manifest: one object under the version's own name, written last."""
        self.checkpoint.write_atomically(manifest_path(manifest.version), manifest.to_json().encode())
