"""What the gateway sent, read by the step loop itself between steps."""
from __future__ import annotations

import os
from typing import Any

from channel import FrameDecoder
from messages import parse_message


class Inbox:
    """What the gateway sent, read by the loop itself between steps (no reader thread: a thread would get the GIL only
    between steps anyway, and on a loaded host it could lag many steps behind, delaying aborts). Pings are answered
    as soon as they are read; everything else is returned in arrival order."""

    def __init__(self, fd: int, engine: Any) -> None:
        self.fd = fd
        self.engine = engine
        self.decoder = FrameDecoder()

    def take(self, block: bool) -> list[tuple]:
        import select

        items: list[tuple] = []
        timeout = None if block else 0
        while True:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return items
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                return items + [("eof",)]
            self.decode(chunk, items)
            timeout = 0  # drain what else is there, without waiting

    def decode(self, chunk: bytes, items: list[tuple]) -> None:
        e = self.engine
        for frame in self.decoder.push(chunk):
            if isinstance(frame, str):
                e.emit({"type": "protocol_error", "message": frame})
                continue
            res = parse_message(frame)
            if res[0] == "protocol_error":
                e.emit({"type": "protocol_error", "message": res[1]})
            elif res[0] == "refuse":
                items.append(("refuse", res[1], res[2]))
            elif res[1]["type"] == "ping":
                e.emit({"type": "pong", "nonce": res[1]["nonce"], "step": e.steps})
            else:
                items.append((res[1]["type"], res[1]))
