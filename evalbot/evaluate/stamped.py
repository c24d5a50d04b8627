"""The engine's stdout as a channel the kernel timestamps: a Unix SOCK_SEQPACKET socket pair.

Each write() the engine makes on its stdout is one message, and the kernel stamps it as it is queued
(SO_TIMESTAMPNS), so a line's arrival time is when the engine wrote it, however late the harness's reader
thread reads it. A pipe carries no such stamp: a reader held up by the GIL or a busy core (a 2-core box,
an engine whose threads take both cores) gave every line of one late read the same time, and an honest
fast engine's 32 tokens then read as one burst computed before the first was sent.

What the engine sees: a stdout it can write lines to as to a pipe (Python, C stdio, the HTTP relay and
llama.cpp all do), with two limits a pipe lacks: one write() may carry at most `max_message` bytes
(the kernel's socket send buffer, 200 KiB at the least; a longer write fails with EMSGSIZE), and an
empty write() sends an empty message (read here as nothing).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

# SO_TIMESTAMPNS (SO_TIMESTAMPNS_OLD on 64-bit Linux: x86-64 and arm64 use asm-generic's 35), and its
# control message's type; Python names neither. The stamp is a struct timespec of two longs, on
# CLOCK_REALTIME.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
# what the harness asks for as the engine end's send buffer: the kernel caps it at net.core.wmem_max
# (212,992 by default) and doubles it, so one write may carry 416 KiB on a default kernel
SEND_BUFFER = 4 << 20


@dataclass
class Channel:
    """The harness's end of an engine's stdout and the most one message may hold."""

    sock: socket.socket
    max_message: int
    stamped: bool  # the kernel stamps each message (False: arrival times are read times)
    _last_ns: int = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self, buf: bytearray) -> tuple[int, int, bool]:
        """Read one message into `buf` (non-blocking): its length, its arrival time (monotonic ns) and
        whether it was cut (longer than `buf`). BlockingIOError when none is queued."""
        n, anc, flags, _ = self.sock.recvmsg_into(
            [buf], socket.CMSG_SPACE(_TIMESPEC.size), socket.MSG_DONTWAIT
        )
        mono, real = time.monotonic_ns(), time.time_ns()
        at = arrival_ns(anc, mono, real, self._last_ns)
        self._last_ns = at
        return n, at, bool(flags & socket.MSG_TRUNC)

    def close(self) -> None:
        self.sock.close()


def open_pair() -> tuple[Channel, socket.socket]:
    """A connected pair: the harness's stamped end, and the end the engine's stdout becomes (the caller
    closes its copy of that once the engine has it)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        try:
            ours.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            stamped = True
        except OSError:  # a kernel without it: the read time stands in
            stamped = False
        # the kernel refuses a message past the send buffer less its own 32 bytes
        limit = theirs.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - 32
    except BaseException:
        ours.close()
        theirs.close()
        raise
    return Channel(ours, limit, stamped), theirs


def arrival_ns(ancillary: list[tuple[int, int, bytes]], mono_now: int, real_now: int, floor: int) -> int:
    """A message's arrival on the monotonic clock, from the kernel's realtime stamp read at `real_now`
    (`mono_now` on the monotonic clock): never after the read, nor before the previous message (a step of
    the realtime clock between the write and the read stays inside those bounds). The read time where
    the message carries no stamp."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack(data[: _TIMESPEC.size])
            at = mono_now - (real_now - (sec * 1_000_000_000 + nsec))
            return min(mono_now, max(floor, at))
    return max(mono_now, floor)
