"""The engine channel on fd 3: length-prefixed JSON frames (src/protocol/framing.ts is the normative codec).

Frame = 4-byte big-endian payload length, then that many bytes of UTF-8 JSON (one object). A frame over the limit
or whose payload is not a JSON object is reported as an error string and skipped; the stream stays usable.
"""
from __future__ import annotations

import json
import os
import struct
import threading
from typing import Union

#: Largest accepted payload (bytes); the same limit as framing.ts.
MAX_FRAME_BYTES = 64 * 1024 * 1024

Frame = Union[dict, str]  # a decoded message, or why the frame could not be decoded


class FrameDecoder:
    """Incremental decoder: feed chunks, get every frame they complete."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        #: Bytes received and not yet consumed.
        self.buffer = bytearray()
        #: Bytes of an oversized frame still to skip.
        self.skipping = 0
        self.max_frame_bytes = max_frame_bytes

    def push(self, chunk: bytes) -> list[Frame]:
        frames: list[Frame] = []
        self.buffer += chunk
        while True:
            # 1. Drop the rest of an oversized frame.
            if self.skipping:
                n = min(self.skipping, len(self.buffer))
                del self.buffer[:n]
                self.skipping -= n
                if self.skipping:
                    break
            # 2. Read the length prefix.
            if len(self.buffer) < 4:
                break
            (length,) = struct.unpack(">I", self.buffer[:4])
            if length > self.max_frame_bytes:
                frames.append(f"frame of {length} bytes exceeds the limit of {self.max_frame_bytes} bytes")
                del self.buffer[:4]
                self.skipping = length
                continue
            # 3. Wait for the whole payload, then parse it.
            if len(self.buffer) < 4 + length:
                break
            payload = bytes(self.buffer[4:4 + length])
            del self.buffer[:4 + length]
            try:
                message = json.loads(payload.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                frames.append(f"frame payload is not JSON: {err}")
                continue
            frames.append(message if isinstance(message, dict) else "frame payload is not a JSON object")
        return frames


def encode_frame(message: dict) -> bytes:
    payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return struct.pack(">I", len(payload)) + payload


class Channel:
    """Writes frames to the channel fd from any thread (one lock: a pong never splits a step frame)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: Serialises writers: the step loop and the reader thread's pongs.
        self.lock = threading.Lock()
        #: Set once a write failed (the gateway is gone).
        self.broken = False

    def send(self, message: dict) -> None:
        data = encode_frame(message)
        with self.lock:
            if self.broken:
                return
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            except OSError:
                self.broken = True
