"""Bytes on the wire, read from the kernel: what this process's TCP sockets really sent.

Taught in ``notebooks/01_collectives.ipynb``. :class:`~course_utils.runtime.ledger.CommLedger`
computes the bytes of each collective from its message size with the ring formulas: a
*model*. This module *measures*: Linux keeps, for every TCP socket, the number of payload
bytes it has sent (``tcpi_bytes_sent`` of ``getsockopt(TCP_INFO)``, Linux 4.19 and newer),
so the difference of the sum over this process's sockets before and after a region is what
went on the wire in between, whatever algorithm the backend chose::

    with WireMeter() as wire:
        dist.all_reduce(t)
    wire.sent        # bytes, or None where the OS has no such counter (macOS, Windows)

What it sees: gloo's TCP connections (gloo's message headers and control messages
included, TCP/IP headers excluded; a segment TCP had to resend is counted once in
``sent`` and again in ``retransmitted``). What it does not see: NCCL's traffic over NVLink,
shared memory or InfiniBand (no TCP socket carries it), and sockets of other processes.
A rank forked from a notebook inherits the kernel's own sockets (Jupyter's messaging):
:func:`ignore_inherited_sockets`, called by ``launch`` when a rank starts, leaves them out.
"""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
import time

__all__ = ["wire_bytes_sent", "wire_bytes_retransmitted", "WireMeter", "group_wire_bytes", "wire_available", "WIRE_UNAVAILABLE",
           "ignore_inherited_sockets"]

#: Offset and size of ``tcpi_bytes_sent`` in Linux's ``struct tcp_info`` (since 4.19).
_BYTES_SENT_OFFSET = 200
_BYTES_RETRANS_OFFSET = 208         # tcpi_bytes_retrans (since 4.19)
_NOTSENT_OFFSET = 144               # tcpi_notsent_bytes (since 4.6)
#: How long a reading waits for the sockets' queues to drain (see :func:`wire_bytes_sent`).
SETTLE_S = 2.0
_TCP_INFO_BYTES = 512
#: Why :func:`wire_bytes_sent` returns None, in one sentence.
WIRE_UNAVAILABLE = ("not available here: the bytes on the wire are read from Linux's per-socket "
                    "counter (TCP_INFO), which this system does not provide")

_inherited: set[str] = set()       # socket inodes present when this rank started


def _socket_fds() -> dict[str, int]:
    """``{socket inode: one fd}`` for this process's open sockets (Linux ``/proc``)."""
    out: dict[str, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:                  # closed meanwhile
            continue
        if target.startswith("socket:"):
            out.setdefault(target, int(name))
    return out


def _counters(fd: int) -> tuple[int, int, int] | None:
    """``(tcpi_bytes_sent, tcpi_bytes_retrans, tcpi_notsent_bytes)`` of the TCP socket
    ``fd``: bytes the kernel has transmitted (retransmissions included), the retransmitted
    ones, and bytes written by the program but still queued; None for any other socket."""
    try:
        s = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)     # a dup: closing it is safe
    except OSError:
        return None
    try:
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    except OSError:                       # not a TCP socket (a Unix socket, UDP...)
        return None
    finally:
        s.close()
    if len(info) < _BYTES_RETRANS_OFFSET + 8:
        return None
    return (struct.unpack_from("Q", info, _BYTES_SENT_OFFSET)[0],
            struct.unpack_from("Q", info, _BYTES_RETRANS_OFFSET)[0],
            struct.unpack_from("I", info, _NOTSENT_OFFSET)[0])


def wire_available() -> bool:
    """Whether this system gives per-socket byte counters (Linux with ``TCP_INFO``)."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "TCP_INFO"):
        return False
    listener = socket.socket()                 # an unconnected TCP socket answers TCP_INFO too
    try:
        listener.bind(("127.0.0.1", 0))
        info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
        return len(info) >= _BYTES_RETRANS_OFFSET + 8
    except OSError:
        return False
    finally:
        listener.close()


def ignore_inherited_sockets() -> None:
    """Leave the sockets open now out of every later count: ``launch`` calls it when a
    rank starts, before its process group exists, so a rank forked from a notebook does
    not count the notebook kernel's own traffic on the sockets it inherited."""
    _inherited.clear()
    _inherited.update(_socket_fds())


def _read() -> tuple[int, int] | None:
    """``(bytes sent, each once; bytes retransmitted)`` over this process's TCP sockets
    (inherited ones left out), once nothing written is still queued in them (at most
    :data:`SETTLE_S` seconds); None where the OS gives no such counters."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "TCP_INFO"):
        return None
    deadline = time.monotonic() + SETTLE_S
    while True:
        sent, retrans, queued, seen_tcp = 0, 0, 0, False
        for inode, fd in _socket_fds().items():
            if inode in _inherited:
                continue
            counters = _counters(fd)
            if counters is not None:
                sent += counters[0] - counters[1]
                retrans += counters[1]
                queued += counters[2]
                seen_tcp = True
        # A collective returns once its bytes are written into the sockets; the kernel may
        # transmit some of them a moment later. Wait for the queues to drain, so that bytes
        # are counted in the region whose code sent them.
        if not queued or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    if not seen_tcp and not wire_available():
        return None
    return sent, retrans


def wire_bytes_sent() -> int | None:
    """Payload bytes this process's TCP sockets have sent since they were opened, each
    byte once (a segment TCP had to send again is counted in
    :func:`wire_bytes_retransmitted`, not here), summed over the sockets (each once,
    however many descriptors point at it; inherited ones left out), read from the kernel
    once nothing written is still queued in them; None where the OS gives no per-socket
    counter (:data:`WIRE_UNAVAILABLE`). Only differences mean something: read it before
    and after a region (:class:`WireMeter` does)."""
    counts = _read()
    return None if counts is None else counts[0]


def wire_bytes_retransmitted() -> int | None:
    """Bytes TCP sent a second time on this process's sockets (segments it took for lost;
    even on the loopback interface it happens now and then: seen here in about 1 of 30
    all-reduces of 4 MB on 4 ranks, 48 B to 256 kB on one rank); None where unavailable."""
    counts = _read()
    return None if counts is None else counts[1]


class WireMeter:
    """Bytes this process's TCP sockets send inside the ``with`` block, measured.

    ``sent``: payload bytes, each once (an int once the block has ended, or so far inside
    it); ``retransmitted``: bytes TCP had to send again, apart. Both None where the OS has
    no per-socket counter. :meth:`pause` leaves a part of the block out (e.g. a loss
    all-reduce done only for logging). A socket closed inside the block takes its bytes
    with it: meter regions in which the process group stays up.
    """
    def __init__(self):
        self._start: tuple | None = None
        self._end: tuple | None = None
        self._excluded = [0, 0]
        self._active = False

    def __enter__(self) -> "WireMeter":
        self._start, self._end, self._excluded = _read(), None, [0, 0]
        self._active = True
        return self

    def __exit__(self, *exc) -> bool:
        self._end = _read()
        self._active = False
        return False

    @contextlib.contextmanager
    def pause(self):
        """Do not count what is sent inside this block."""
        before = _read()
        try:
            yield self
        finally:
            after = _read()
            if before is not None and after is not None:
                self._excluded = [e + a - b for e, a, b in zip(self._excluded, after, before)]

    @property
    def available(self) -> bool:
        return self._start is not None

    def _delta(self, i: int) -> int | None:
        if self._start is None:
            return None
        end = _read() if self._active else self._end
        return None if end is None else end[i] - self._start[i] - self._excluded[i]

    @property
    def sent(self) -> int | None:
        return self._delta(0)

    @property
    def retransmitted(self) -> int | None:
        return self._delta(1)

    def __repr__(self) -> str:
        sent = self.sent
        if sent is None:
            return "WireMeter(not available)"
        return f"WireMeter({sent:,} bytes sent, {self.retransmitted:,} retransmitted)"


def group_wire_bytes(meter: WireMeter, group=None) -> int | None:
    """What ``meter`` measured as this rank's traffic in ``group``'s collectives: its
    count when the group runs gloo (TCP), None under NCCL, whose NVLink and InfiniBand
    traffic no socket carries (the sockets would show only NCCL's bootstrap)."""
    import torch.distributed as dist

    return meter.sent if dist.get_backend(group) == "gloo" else None
