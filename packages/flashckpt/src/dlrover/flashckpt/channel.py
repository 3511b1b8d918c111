"""The local channel between stagers and the node's saver: length-prefixed JSON over a Unix socket.

Frame: a 4-byte big-endian unsigned length ``n`` (at most `MAX_FRAME_BYTES`), then ``n`` bytes of
UTF-8 JSON holding one object with a ``"type"`` string. No pickle: a frame is data, never code.
The socket file lives beside the run's segments (``<shm_dir>/dlrover-fc.<job>.<run>.sock``, mode
0600), so only processes of the same user on the node can connect.

Messages, stager to saver:

=============  =====================================================================
``hello``      ``rank``, ``world_size``, ``pid``: a stager attaches; answered by ``welcome``
``sealed``     ``rank``, ``slot``, ``seq``, ``step``: a snapshot is final in memory
``persist``    ``rank``, ``step``: persist this rank's snapshot of ``step`` to storage
``bye``        ``rank``: the stager detaches cleanly (no persist on failure for it)
``shutdown``   the job ends: finish, remove the run's shared memory, exit
=============  =====================================================================

Saver to stager: ``welcome`` (``saver_pid``), ``holding`` (``rank``, ``step``, ``held``: the saver
reached a persist request and holds the snapshot, or found it need not), ``persisted`` (``rank``,
``step``, ``committed``, ``reason``), ``persist_failed`` (``rank``, ``step``, ``reason``), ``error``
(``reason``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlrover.flashckpt.errors import FlashCkptError

__all__ = ["MAX_FRAME_BYTES", "ChannelError", "listen_owner_only", "recv_message", "send_message", "unix_address"]

MAX_FRAME_BYTES = 1 << 20
_LEN = struct.Struct(">I")
_SUN_PATH_BYTES = 107  # sockaddr_un.sun_path holds 108 bytes, the last one NUL


@contextlib.contextmanager
def unix_address(path: str | Path) -> Iterator[str]:
    """An address to bind or connect a Unix socket at `path`, however long the path is.

    sun_path holds 107 bytes; shared-memory and temp directories can be deeper than that. A path
    that does not fit is reached through an open descriptor of its directory
    (``/proc/self/fd/N/NAME``), which names the same file; the descriptor is closed on exit, once
    the bind or connect is done.
    """
    text = os.fspath(path)
    if len(os.fsencode(text)) <= _SUN_PATH_BYTES:
        yield text
        return
    parent, name = os.path.split(text)
    fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def listen_owner_only(path: str | Path, backlog: int = 64) -> tuple[socket.socket, int]:
    """A Unix socket listening at `path` whose file nobody else could reach at any moment.

    It is bound inside a fresh 0700 directory beside `path`, made 0600 there, set listening, and
    only then renamed over `path` (atomically replacing a socket already there). The process
    umask is left alone: it is process-wide, so narrowing it for the bind would race with every
    other thread creating files and with every process forked meanwhile (a worker started then
    would keep it).

    Returns:
        The listening socket, and the inode of its file (to tell later whether `path` is still it).

    Raises:
        OSError: it cannot be created; nothing is left behind.
    """
    path = Path(path)
    private = Path(tempfile.mkdtemp(prefix=".dlrover-bind-", dir=path.parent))  # created 0700
    staged = private / "s"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with unix_address(staged) as address:
            listener.bind(address)
        os.chmod(staged, 0o600)
        listener.listen(backlog)
        inode = staged.stat().st_ino
        os.replace(staged, path)
    except BaseException:
        listener.close()
        staged.unlink(missing_ok=True)
        raise
    finally:
        with contextlib.suppress(OSError):
            private.rmdir()
    return listener, inode


class ChannelError(FlashCkptError):
    """A frame was malformed, too large, or cut short."""


def send_message(sock: socket.socket, msg: dict[str, Any]) -> None:
    """Send one message.

    Raises:
        ChannelError: the message has no ``type`` or encodes to more than `MAX_FRAME_BYTES`.
        OSError: the peer is gone.
    """
    if not isinstance(msg.get("type"), str):
        raise ChannelError(f"message without a string 'type': {msg!r}")
    data = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(data) > MAX_FRAME_BYTES:
        raise ChannelError(f"message of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            if buf:
                raise ChannelError(f"connection closed inside a frame ({len(buf)} of {n} bytes)")
            return None
        buf += part
    return bytes(buf)


def recv_message(sock: socket.socket) -> dict[str, Any] | None:
    """Receive one message; None when the peer closed the connection between frames.

    Raises:
        ChannelError: the frame is oversized, cut short, not JSON, or has no string ``type``.
    """
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME_BYTES:
        raise ChannelError(f"frame of {n} bytes exceeds {MAX_FRAME_BYTES}")
    body = _recv_exact(sock, n) if n else b""
    if body is None:
        raise ChannelError("connection closed after a frame length")
    try:
        msg = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ChannelError(f"frame is not JSON: {e}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ChannelError(f"frame is not an object with a string 'type': {str(msg)[:200]!r}")
    return msg
