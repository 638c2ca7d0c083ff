"""One JSON log line on stderr: the OpenVINO worker's only logging (the gateway relays engine stderr into its log)."""
from __future__ import annotations

import json
import os
import time
from typing import Any


class Ticking:
    """While a long call runs (OpenVINO compiling the model: 5–20 s on a busy CPU, one call with no progress of its
    own), a line every `every` seconds says it still runs, then one line with its time: no silent stretch at start."""

    def __init__(self, what: str, event: str, every: float = 5.0) -> None:
        import threading

        self.what, self.event, self.every = what, event, every
        self.started = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self) -> None:
        while not self.done.wait(self.every):
            log("info", f"{self.what}: still running ({time.monotonic() - self.started:.0f} s)", event=self.event)

    def __enter__(self) -> "Ticking":
        log("info", f"{self.what}…", event=self.event)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if exc[0] is None:
            log("info", f"{self.what}: done in {time.monotonic() - self.started:.1f} s", event=self.event)


def log(level: str, msg: str, **extra: Any) -> None:
    """One JSON log line on stderr (the gateway relays engine stderr into its own log)."""
    line = {"level": level, "time": int(time.time() * 1000), "component": "engine", "pid": os.getpid(), "msg": msg, **extra}
    try:
        os.write(2, (json.dumps(line, separators=(",", ":")) + "\n").encode("utf-8"))
    except OSError:
        pass
