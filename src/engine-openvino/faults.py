"""Test-only fault injection of the OpenVINO worker (docs/fault-injection.md), read from KEEL_FAULT_INJECTION (JSON).

The switch names are the llama.cpp engine's (src/engine/faulty-backend.ts; src/engine-openvino/faults.test.ts checks
the two lists): `crashAtStep`, `crashOnPrompt`, `throwAtStep`, `hangAtStep`, `failOnPrompt`, plus this worker's own
`ignoreAtStep`. `failOnPrompt` is not applied here (a step error is never per-request on OpenVINO: it is fatal), and
the worker says so at start. Step-keyed switches fire once, on the first engine process only.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Callable, Optional

from logline import log

#: Every switch name, with the fault it injects (the `fault` field of the "fault injected" log line).
SWITCHES = {
    "crashAtStep": "crash",
    "crashOnPrompt": "crash",
    "throwAtStep": "throw",
    "hangAtStep": "hang",
    "failOnPrompt": "fail",
    "ignoreAtStep": "ignore",
}
#: Switches this worker does not apply (see the module doc).
NOT_APPLIED = ("failOnPrompt",)


class Faults:
    """The switches of one engine process; every method is a no-op when fault injection is off."""

    def __init__(self, switches: Optional[dict], first_process: bool) -> None:
        self.switches = switches or {}
        self.first_process = first_process
        #: Step-keyed switches that fired.
        self.fired: set[str] = set()
        if switches:
            log("warn", "fault injection is ON (test-only)", faults=switches)
            for name in NOT_APPLIED:
                if name in switches:
                    log("warn", f"fault switch {name} is not applied by the OpenVINO engine (a step error is fatal here)", event="fault_not_applied")

    @staticmethod
    def from_env(first_process: bool) -> "Faults":
        raw = os.environ.get("KEEL_FAULT_INJECTION")
        return Faults(json.loads(raw) if raw else None, first_process)

    def at_step(self, switch: str, step: int) -> bool:
        """Whether the step-keyed `switch` fires at `step` (once; logged)."""
        if not self.first_process or self.switches.get(switch) != step or switch in self.fired:
            return False
        self.fired.add(switch)
        log("warn", "fault injected", fault=SWITCHES[switch], step=step)
        return True

    def on_prompt(self, switch: str, prompts: Callable[[], list[str]], step: int) -> bool:
        """Whether a prompt of `prompts()` (the running requests') holds the marker of `switch` (logged)."""
        marker = self.switches.get(switch)
        if not marker or not any(marker in p for p in prompts()):
            return False
        log("warn", "fault injected", fault=SWITCHES[switch], step=step)
        return True

    def before_step(self, step: int, prompts: Callable[[], list[str]]) -> None:
        """The faults of a pipeline step, before it runs: abort the process, or hang forever (for the watchdog)."""
        if not self.switches:
            return
        if self.at_step("crashAtStep", step) or self.on_prompt("crashOnPrompt", prompts, step):
            os.abort()
        if self.at_step("hangAtStep", step):
            threading.Event().wait()

    def step_raises(self, step: int) -> bool:
        """`throwAtStep`: OpenVINO's step() raises at `step` (fatal on this engine: the worker exits 1)."""
        return bool(self.switches) and self.at_step("throwAtStep", step)

    def ignores(self, step: int) -> bool:
        """`ignoreAtStep`: after `step` one running request is handled as OpenVINO's out-of-memory path leaves it."""
        return bool(self.switches) and self.at_step("ignoreAtStep", step)
