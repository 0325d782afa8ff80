"""A connection's unread input: bounded, and cut into requests the way h11 will read them.

Theory of operation: the socket's bytes land here (`append`), never straight in h11, and the
connection (`adapters.http.protocol`) stops reading while `room()` is 0, so a client that
pipelines requests faster than they are answered holds at most `capacity_bytes` of the
server's memory. h11 is given one request at a time: exactly the bytes of a head
(`head_end`, found with the same blank-line rule h11 uses, so both agree where a head ends),
then exactly the body its Content-Length declares. h11 therefore never buffers a following
request, the head's own bytes are at hand for the checks h11 does not make, and nothing is
copied but the request taken. Taking from the front of a `bytearray` is amortised O(1) in
CPython, and the search for a head's end resumes where the last one stopped, so a head that
trickles in is not scanned again from its start.
"""

from __future__ import annotations

import re

# h11's own end-of-head rule (a line feed, an optional carriage return, a line feed): a head
# framed here is then the head h11 parses, byte for byte.
_BLANK_LINE = re.compile(b"\n\r?\n")


class Inbox:
    __slots__ = ("_data", "_searched", "capacity_bytes")

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._data = bytearray()
        self._searched = 0  # no head end starts before this offset

    def __len__(self) -> int:
        return len(self._data)

    def room(self) -> int:
        return self.capacity_bytes - len(self._data)

    def append(self, chunk: bytes | bytearray | memoryview) -> None:
        if len(chunk) > self.room():
            raise OverflowError(f"{len(chunk)} bytes into {self.room()} bytes of room")
        self._data += chunk

    def peek(self) -> bytes:
        """The whole of what is held (an incomplete head: at most its limits)."""
        return bytes(self._data)

    def head_end(self) -> int:
        """The length of the head at the front, its blank line included; -1 while it is
        incomplete. An empty line first is a head of its own, as h11 reads it (and refuses:
        a request line must come first)."""
        data = self._data
        if data[:1] == b"\n":
            return 1
        if data[:2] == b"\r\n":
            return 2
        found = _BLANK_LINE.search(data, self._searched)
        if found is None:
            # The next search starts before the last two bytes: they may begin a blank line.
            self._searched = max(0, len(data) - 2)
            return -1
        return found.end()

    def starts_with_a_control(self) -> bool:
        """Whether the held bytes cannot begin a request line (h11 refuses such input before
        the head is complete: a TLS handshake sent to the plain port, for one)."""
        return bool(self._data) and self._data[0] < 0x21

    def take(self, count: int) -> bytes:
        out = bytes(self._data[:count])
        del self._data[:count]
        self._searched = 0
        return out
