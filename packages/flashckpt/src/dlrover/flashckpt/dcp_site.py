"""Where DCP writes and reads a step of a sharded checkpoint: in place, or through a local staging copy.

``torch.distributed.checkpoint`` writes and reads files with its public ``FileSystemWriter`` and
``FileSystemReader``, which take a local directory. (Its fsspec writer lives in a private module,
and we use only public torch APIs.) So:

* **POSIX storage** (`PosixDcpSite`, the default): DCP works in ``<root>/<step>/`` directly, every
  rank sees every file, and nothing is copied. This is the path sharded checkpoints always took.
* **Any other `Storage`** (`StagedDcpSite`: S3 through `FsspecStorage`, the in-memory fake):

  - persist: DCP writes this rank's part of the step into a private local staging directory
    (``dlrover-fc-dcp-<pid>-...`` under `StagingConfig.parent_dir`, default the system temp dir);
    the rank then checksums and uploads the files it owns (`dcp_store.checksum_owners`, each file
    by exactly one rank, among those holding it) to ``<step>/<name>`` through the `Storage`, and
    writes its done marker; the commit (manifest, tracker) is the same as for POSIX.
  - load: DCP may ask any rank for any file, so every rank needs the whole step on local disk.
    The ranks on one host that stage under the same parent directory (`StagedDcpSite.node_key`)
    share one copy: the lowest of them makes the staging directory, each downloads a share of the
    files into it, checking each one's size and CRC-32 against the manifest as it arrives (before
    DCP reads a byte), then DCP on each reads the whole copy. A node downloads the step once,
    whatever its number of ranks.

  The staging directory is removed when the persist or load ends, whether it succeeded or not; one
  left by a process killed meanwhile is removed by the next checkpointer that stages under the
  same parent (`dlrover.common.remove_dead_owners`).

The price of an object store: local disk for the staging copy (this rank's shard of one step while
persisting; the whole checkpoint, once per node, while loading), and one extra pass over the bytes
(written locally, then read back as they are uploaded; downloaded, then read by DCP). Files are
moved a chunk at a time (`StagingConfig.chunk_bytes`), never held whole in memory.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

import attrs

from dlrover.common import ConfigError, owned_temp_dir, remove_dead_owners
from dlrover.flashckpt.ckpt_format import step_dir
from dlrover.flashckpt.dcp_store import FileSum, checksum_file, dcp_files, dcp_names, verify_file
from dlrover.flashckpt.dcp_transfer import StagingConfig, download_file, upload_file
from dlrover.flashckpt.errors import LayoutError
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.storage.posix import PosixStorage

__all__ = ["STAGING_PREFIX", "DcpSite", "NodeShare", "PosixDcpSite", "StagedDcpSite", "dcp_site", "node_share"]

STAGING_PREFIX = "dlrover-fc-dcp-"


class DcpSite(Protocol):
    """How the sharded checkpointer gets a step's DCP files to and from its storage."""

    @property
    def storage(self) -> Storage:
        """Where the checkpoint lives."""
        ...

    @property
    def shared(self) -> bool:
        """Every rank sees every file of a step in the directory DCP uses."""
        ...

    @property
    def sync_files(self) -> bool:
        """DCP must fsync what it writes (the files it writes are the durable copy)."""
        ...

    def where(self, step: int, name: str = "") -> str:
        """A step's directory, or one of its files, as messages name it."""
        ...

    def writing(self, step: int) -> AbstractContextManager[Path]:
        """The directory DCP writes `step` into, for the length of the block."""
        ...

    def publish(self, step: int, local: Path, names: list[str]) -> dict[str, FileSum]:
        """Make this rank's files of `step` durable in storage; returns their sizes and CRC-32s.

        Raises:
            StorageError: a file cannot be read or stored.
        """
        ...

    def listed(self, step: int) -> list[str]:
        """DCP's files of `step` as the storage holds them now.

        Raises:
            StorageError: the step cannot be listed.
        """
        ...

    def reading(self, step: int) -> AbstractContextManager[Path]:
        """The directory DCP reads `step` from, for the length of the block.

        Raises:
            OSError: a staging directory cannot be made.
        """
        ...

    def fetch(self, step: int, local: Path, name: str, expected: FileSum) -> None:
        """Make file `name` of `step` readable in `local`, checked against `expected`.

        Raises:
            ChecksumError: the file is missing or does not match (the message names it).
            StorageError: it cannot be read.
            LayoutError: the name is not a plain file name.
        """
        ...


class PosixDcpSite:
    """DCP works in the storage's own step directory; nothing is copied.

    Args:
        storage: the POSIX checkpoint directory.
    """

    shared = True
    sync_files = True

    def __init__(self, storage: PosixStorage) -> None:
        self.storage = storage
        self.root = storage.root

    def where(self, step: int, name: str = "") -> str:
        """See `DcpSite.where`."""
        return str(self.root / step_dir(step) / name)

    @contextmanager
    def writing(self, step: int) -> Iterator[Path]:
        """See `DcpSite.writing`."""
        yield self.root / step_dir(step)

    def publish(self, step: int, local: Path, names: list[str]) -> dict[str, FileSum]:
        """Checksums the files (already in place: DCP wrote them there)."""
        return {n: checksum_file(local / n) for n in names}

    def listed(self, step: int) -> list[str]:
        """See `DcpSite.listed`."""
        return dcp_files(self.root / step_dir(step))

    @contextmanager
    def reading(self, step: int) -> Iterator[Path]:
        """See `DcpSite.reading`."""
        yield self.root / step_dir(step)

    def fetch(self, step: int, local: Path, name: str, expected: FileSum) -> None:
        """Verifies the file in place (see `dcp_store.verify_file`)."""
        verify_file(local / _plain_name(name), expected)


class StagedDcpSite:
    """DCP works in a local staging directory; files are streamed to and from `storage`.

    A persist stages in a directory of this rank's own; a load in one the ranks of a node share
    (`NodeShare`: its leader makes it with `reading`, the others find it with `joined`).

    Removes, at construction, staging directories under the parent that processes now gone left
    behind (killed mid-persist).

    Args:
        storage: any `Storage` (an object store through `FsspecStorage`, the in-memory fake).
        config: where to stage and how much to move per storage call.

    Raises:
        ConfigError: the staging parent directory does not exist.
    """

    shared = False
    # The staged copy is thrown away once uploaded: fsyncing it would only slow the persist.
    sync_files = False

    def __init__(self, storage: Storage, config: StagingConfig) -> None:
        if config.parent_dir is not None and not os.path.isdir(config.parent_dir):
            raise ConfigError(f"staging parent_dir {config.parent_dir!r} is not an existing directory")
        self.storage = storage
        self.config = config
        root = getattr(storage, "root", None)
        self._label = str(root) if isinstance(root, str | os.PathLike) else f"<{type(storage).__name__}>"
        remove_dead_owners(STAGING_PREFIX, config.parent_dir)

    def where(self, step: int, name: str = "") -> str:
        """See `DcpSite.where`."""
        return f"{self._label}/{step_dir(step)}" + (f"/{name}" if name else "")

    def _staging(self) -> AbstractContextManager[Path]:
        return owned_temp_dir(STAGING_PREFIX, self.config.parent_dir)

    def writing(self, step: int) -> AbstractContextManager[Path]:
        """A new private staging directory, removed when the block ends (see `DcpSite.writing`)."""
        return self._staging()

    def publish(self, step: int, local: Path, names: list[str]) -> dict[str, FileSum]:
        """Uploads each file to ``<step>/<name>``, checksumming it as it is read."""
        return {
            n: upload_file(self.storage, local / n, f"{step_dir(step)}/{n}", self.config.chunk_bytes) for n in names
        }

    def listed(self, step: int) -> list[str]:
        """See `DcpSite.listed`."""
        return dcp_names(self.storage.list_dir(step_dir(step)))

    def reading(self, step: int) -> AbstractContextManager[Path]:
        """A new staging directory (0700, this process's), removed when the block ends (see `DcpSite.reading`)."""
        return self._staging()

    def node_key(self) -> bytes:
        """Equal for two processes exactly when they stage in the same directory as the same user.

        The host's boot id and the staging parent's device and inode name the directory itself,
        whatever path a container mounts it at; the user id is there because staging directories
        are private (0700). Where they cannot be read the key is unique: the process shares
        with nobody.
        """
        parent = self.config.parent_dir or tempfile.gettempdir()
        try:
            boot = Path(_BOOT_ID).read_text(encoding="ascii").strip()
            st = os.stat(parent)
        except (OSError, UnicodeDecodeError):
            return f"alone:{uuid.uuid4()}".encode()
        return f"{boot}:{st.st_dev}:{st.st_ino}:{os.getuid()}".encode()

    def joined(self, name: str) -> Path:
        """The staging directory `name` that a process with the same `node_key` made.

        Raises:
            LayoutError: `name` is not a plain file name.
        """
        return Path(self.config.parent_dir or tempfile.gettempdir()) / _plain_name(name)

    def fetch(self, step: int, local: Path, name: str, expected: FileSum) -> None:
        """Downloads the file into `local`, verifying it as it arrives (see `download_file`)."""
        plain = _plain_name(name)
        download_file(self.storage, f"{step_dir(step)}/{plain}", local / plain, expected, self.config.chunk_bytes)


_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@attrs.frozen
class NodeShare:
    """How one rank shares a load's staging copy with the ranks of its node.

    Attributes:
        leader: the rank that makes (and removes) the node's staging directory.
        index: this rank's position among the node's ranks (0 for the leader).
        size: how many ranks the node has; file ``i`` of a step is fetched by the rank whose
            ``index`` is ``i % size``.
    """

    leader: int
    index: int
    size: int


def node_share(keys: Sequence[bytes], rank: int) -> NodeShare:
    """`rank`'s share, given every rank's `StagedDcpSite.node_key` (by rank). Pure."""
    mates = [r for r, key in enumerate(keys) if key == keys[rank]]
    return NodeShare(mates[0], mates.index(rank), len(mates))


def _plain_name(name: str) -> str:
    """`name` if it is one path component; a manifest must not send a file outside the step."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise LayoutError(f"the manifest names {name!r}, which is not a file name inside the step")
    return name


def dcp_site(storage: Storage, staging: StagingConfig | None = None) -> DcpSite:
    """The site for `storage`: in place for `PosixStorage`, staged for anything else.

    Raises:
        ConfigError: `storage` does not implement `Storage`, or the staging parent is missing.
    """
    if isinstance(storage, PosixStorage):
        return PosixDcpSite(storage)
    if not isinstance(storage, Storage):
        raise ConfigError(f"storage must implement the Storage protocol, got {type(storage).__name__}")
    return StagedDcpSite(storage, staging or StagingConfig())
