"""Where a run's checkpoints go, in a form another process can open.

The node's saver runs in another process (a detached saver, or the ``dlrover-run`` agent), so it
cannot be handed a `Storage` object: it gets a `StorageLocation` and opens the storage itself.
A location is a POSIX directory (an absolute path, with `PosixStorage`'s write settings that
differ from their defaults as its options) or an fsspec URL, ``<protocol>://<root>``, with the
filesystem's keyword options as a JSON object (``fs.storage_options``: endpoint, credentials,
client settings). The protocol picks an implementation fsspec registered under
that name (``s3`` -> s3fs); nothing is imported by a name the data chooses, and nothing is
unpickled.

The options may hold credentials: they travel only over the owner-only Unix sockets of the
saver host and in the detached saver's environment (readable by its user alone), never on a
command line, and `StorageLocation`'s repr leaves them out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import attrs

from dlrover.common import ConfigError
from dlrover.flashckpt.errors import FlashCkptError
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.storage.fsspec_store import FsspecStorage
from dlrover.flashckpt.storage.posix import POSIX_DEFAULTS, PosixStorage, check_posix_settings

__all__ = ["STORAGE_OPTIONS_ENV_VAR", "StorageLocation"]

STORAGE_OPTIONS_ENV_VAR = "DLROVER_FLASHCKPT_STORAGE_OPTIONS"
"""A detached saver's storage options (a JSON object), passed in its environment."""

_MAX_OPTIONS_BYTES = 64 << 10


@attrs.frozen
class StorageLocation:
    """A checkpoint directory or object-store prefix another process can open.

    Attributes:
        url: an absolute POSIX path, or ``<protocol>://<root>`` (e.g. ``s3://bucket/jobs/j1``).
        options: for a URL, the fsspec filesystem's keyword options (JSON-compatible values); for
            a POSIX path, `PosixStorage`'s write settings that differ from their defaults
            (``direct_io``, ``writeback_window_bytes``, ``direct_buffer_bytes``).

    Raises:
        FlashCkptError: a relative path, a URL without a root, options a POSIX path does not
            take, or options that are not a JSON object.
    """

    url: str
    options: Mapping[str, Any] = attrs.field(factory=dict, repr=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.url, str) or "\0" in self.url:
            raise FlashCkptError(f"a storage location must be a string, got {self.url!r}")
        if not isinstance(self.options, Mapping):
            raise FlashCkptError(f"storage options must be a JSON object, got {type(self.options).__name__}")
        try:
            encoded = json.dumps(dict(self.options), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise FlashCkptError(f"storage options of {self.url!r} are not JSON-compatible: {e}") from None
        if len(encoded) > _MAX_OPTIONS_BYTES:
            raise FlashCkptError(f"storage options of {self.url!r} exceed {_MAX_OPTIONS_BYTES} bytes")
        if self.is_posix:
            if not os.path.isabs(self.url):
                raise FlashCkptError(f"a storage directory must be an absolute path, got {self.url!r}")
            unknown = sorted(set(self.options) - set(POSIX_DEFAULTS))
            if unknown:
                raise FlashCkptError(
                    f"a POSIX storage directory takes only the options {sorted(POSIX_DEFAULTS)}, got {unknown}"
                )
            try:
                check_posix_settings(**{**POSIX_DEFAULTS, **self.options})
            except ConfigError as e:
                raise FlashCkptError(f"storage options of {self.url!r}: {e}") from None
        elif not self.root:
            raise FlashCkptError(f"storage URL {self.url!r} names no bucket or path after '://'")

    @property
    def is_posix(self) -> bool:
        """Whether this is a local directory (no ``<protocol>://``)."""
        return "://" not in self.url

    @property
    def protocol(self) -> str:
        """The fsspec protocol of a URL (``file`` for a POSIX path)."""
        return self.url.split("://", 1)[0] if not self.is_posix else "file"

    @property
    def root(self) -> str:
        """The path within the filesystem."""
        return self.url.split("://", 1)[1].rstrip("/") if not self.is_posix else self.url

    def open(self) -> Storage:
        """The storage this location names.

        Raises:
            FlashCkptError: the protocol is unknown to fsspec or its implementation is not
                installed, or the options do not fit it.
            OSError: a POSIX directory cannot be made.
        """
        if self.is_posix:
            return PosixStorage(self.url, **dict(self.options))
        try:
            import fsspec
        except ImportError:
            raise FlashCkptError(f"storage {self.url!r} needs fsspec: pip install dlrover-flashckpt[s3]") from None
        try:
            fs = fsspec.filesystem(self.protocol, **dict(self.options))
        except (ImportError, ValueError, TypeError) as e:
            raise FlashCkptError(f"cannot open storage {self.url!r}: {e}") from None
        return FsspecStorage(fs, self.root)

    @classmethod
    def of(cls, storage: Storage) -> StorageLocation:
        """The location of a `PosixStorage` or `FsspecStorage`.

        Raises:
            FlashCkptError: another kind of storage (an in-memory one lives in this process
                only), or a filesystem whose options are not JSON-compatible.
        """
        if isinstance(storage, PosixStorage):
            return cls(os.path.abspath(storage.root), storage.options)
        if isinstance(storage, FsspecStorage):
            protocol = storage.fs.protocol
            name = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
            if name in ("file", "local"):
                return cls(os.path.abspath(storage.root))
            return cls(f"{name}://{storage.root}", dict(getattr(storage.fs, "storage_options", {})))
        raise FlashCkptError(
            f"a {type(storage).__name__} cannot be opened by another process (the node's saver): "
            "use PosixStorage or FsspecStorage, or saver='none'"
        )

    def to_message(self) -> dict[str, Any]:
        """The JSON form: ``{"url": ..., "options": {...}}``."""
        return {"url": self.url, "options": dict(self.options)}

    @classmethod
    def from_message(cls, doc: object) -> StorageLocation:
        """Read the JSON form.

        Raises:
            FlashCkptError: it is not one.
        """
        if not isinstance(doc, Mapping) or not isinstance(doc.get("url"), str):
            raise FlashCkptError(f"a storage location needs a string 'url', got a {type(doc).__name__}")
        return cls(doc["url"], doc.get("options") or {})
