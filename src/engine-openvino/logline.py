"""One JSON log line on stderr: the OpenVINO worker's only logging (the gateway relays engine stderr into its log)."""
from __future__ import annotations

import json
import os
import time
from typing import Any


def log(level: str, msg: str, **extra: Any) -> None:
    """One JSON log line on stderr (the gateway relays engine stderr into its own log)."""
    line = {"level": level, "time": int(time.time() * 1000), "component": "engine", "pid": os.getpid(), "msg": msg, **extra}
    try:
        os.write(2, (json.dumps(line, separators=(",", ":")) + "\n").encode("utf-8"))
    except OSError:
        pass
