"""The control channel of a transfer: small messages on one TCP connection,
each a msgpack map behind its 4-byte length.

Only descriptions travel here (the export's tokens and counts, the
receiver's runs, "done"); the KV bytes go through the transfer engine. Every
read has a deadline, and so has every write on a channel given a
``timeout_s`` (a frozen peer stops reading, and a message larger than the
socket's buffers, a long sequence's runs, would wait for it forever), so a
peer that died or hangs is an answer in bounded time, never a wait forever.

`ping` is the one check that a peer's process runs: it needs the peer's
own answer. A TCP connect, or a send that fits the socket's buffers, succeeds
against a process stopped with SIGSTOP (the kernel takes them), so neither
says anything. The sender asks for a pong as soon as the receiver accepted,
and waits for it before it hands its first write to the transfer engine (see
endpoint.py for why the engine must never be the one to find a frozen peer).
"""
from __future__ import annotations

import select
import socket
import struct
import time
import uuid
from typing import Optional, Tuple

import msgpack

#: the largest message accepted: a 128K-token sequence's runs are far below it
MAX_MESSAGE_BYTES = 256 << 20
_LENGTH = struct.Struct("!I")


def check_timeout(where: str, timeout_s, none_ok: bool = False) -> None:
    """ValueError naming ``where`` unless ``timeout_s`` is a number of seconds > 0
    (or None, where ``none_ok``: no limit)."""
    if none_ok and timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"{where}: timeout_s must be a number > 0{' or None' if none_ok else ''}, "
                         f"got {timeout_s!r}")


class ChannelClosed(ConnectionError):
    """The peer closed the connection, or it broke."""


class Channel:
    """One connection (see the module docstring); each `send` waits at most
    ``timeout_s`` for the peer to take the message (None: as long as it takes)."""

    def __init__(self, sock: socket.socket, timeout_s: Optional[float] = None):
        check_timeout("Channel", timeout_s, none_ok=True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.timeout_s = sock, timeout_s

    @classmethod
    def connect(cls, address: Tuple[str, int], timeout_s: float) -> "Channel":
        """A channel to ``address``, reached within ``timeout_s``, which then bounds each send."""
        try:
            return cls(socket.create_connection(tuple(address), timeout=timeout_s), timeout_s)
        except OSError as e:
            raise ChannelClosed(f"cannot reach {address[0]}:{address[1]}: {e}") from None

    def send(self, message: dict) -> None:
        """ChannelClosed if the peer is gone, or took not all of the message
        within timeout_s (the stream is then cut mid-message: close the channel)."""
        body = msgpack.packb(message, use_bin_type=True)
        try:
            self.sock.settimeout(self.timeout_s)
            self.sock.sendall(_LENGTH.pack(len(body)) + body)
        except socket.timeout:
            raise ChannelClosed(f"the peer did not take a {len(body)}-byte message within "
                                f"{self.timeout_s:.1f} s") from None
        except OSError as e:
            raise ChannelClosed(f"send failed: {e}") from None

    def ping(self, timeout_s: float) -> None:
        """Ask the peer for a "pong" and wait at most ``timeout_s`` for it:
        returns once the peer's process answered. TimeoutError without an
        answer (a frozen or busy peer), ChannelClosed if the peer is gone or
        answers anything else; after either, close the channel."""
        check_timeout("Channel.ping", timeout_s)
        self.await_pong(self.send_ping(), timeout_s)

    def send_ping(self) -> str:
        """The first half of `ping`: ask for a "pong" and return at once, with the
        nonce to pass to `await_pong` (the peer answers while the caller works on)."""
        nonce = uuid.uuid4().hex
        self.send(dict(type="ping", nonce=nonce))
        return nonce

    def await_pong(self, nonce: str, timeout_s: float) -> None:
        """The second half of `ping`: the peer's next message must be the pong of
        ``nonce``, within ``timeout_s`` (the same errors as `ping`)."""
        try:
            answer = self.receive(timeout_s)
        except TimeoutError:
            raise TimeoutError(f"the peer did not answer a ping within {timeout_s:.1f} s") from None
        if answer != dict(type="pong", nonce=nonce):
            raise ChannelClosed(f"the peer answered a ping with {answer.get('type')!r}, expected this ping's 'pong'")

    def pong(self, ping: dict) -> None:
        """Answer a peer's ``ping`` message."""
        self.send(dict(type="pong", nonce=ping.get("nonce")))

    def receive(self, timeout_s: Optional[float]) -> dict:
        """The next message; TimeoutError if none completes within timeout_s
        (None: wait), ChannelClosed if the peer is gone. After a TimeoutError
        the stream may be cut mid-message: close the channel."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        length, = _LENGTH.unpack(self._read(_LENGTH.size, deadline))
        if length > MAX_MESSAGE_BYTES:
            raise ChannelClosed(f"a {length}-byte message is over the {MAX_MESSAGE_BYTES}-byte limit")
        return msgpack.unpackb(self._read(length, deadline), raw=False)

    def ready(self, timeout_s: float) -> bool:
        """Whether a message (or the peer's close) waits to be read, after at most ``timeout_s``."""
        return bool(select.select([self.sock], [], [], timeout_s)[0])

    def _read(self, count: int, deadline: Optional[float]) -> bytes:
        parts, left = [], count
        while left:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no message from the peer in time")
                self.sock.settimeout(remaining)
            else:
                self.sock.settimeout(None)
            try:
                part = self.sock.recv(min(left, 1 << 20))
            except socket.timeout:
                raise TimeoutError("no message from the peer in time") from None
            except OSError as e:
                raise ChannelClosed(f"receive failed: {e}") from None
            if not part:
                raise ChannelClosed("the peer closed the connection")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        self.sock.close()
