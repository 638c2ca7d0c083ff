"""Hybrid (linear-attention) models on OpenVINO GenAI: their scheduler settings, and the guard that keeps OpenVINO's
own preemption from ever running on them.

Why: OpenVINO GenAI 2026.4.1 partially preempts a victim when the KV pool runs short; on a hybrid model with prefix
caching that strips the victim's linear-attention table and a second pick asserts (block_manager.hpp:759, the
seed's crash; root-cause.md §1.2, §6), after which every step() raises. So for hybrid models the worker never lets
OpenVINO run out of KV blocks: before each step it counts the blocks every running sequence needs one step later
and, when they exceed the pool, preempts the latest-admitted request whole itself (stopped, re-queued first in line
with prompt + generated tokens, as after IGNORED). A stopped request keeps its blocks (and stays a victim candidate
inside OpenVINO) through the next step, which is why the guard looks one step ahead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional


@dataclass
class HybridSettings:
    """What the worker sets on OpenVINO's SchedulerConfig for a hybrid model, and the line it logs about them."""

    #: Tokens of one linear-attention block: KV block × cache_interval_multiplier with prefix caching, else None (one
    #: fixed block per sequence).
    la_block_tokens: Optional[int]
    #: num_linear_attention_blocks.
    la_blocks: int
    #: cache_interval_multiplier applied (None: OpenVINO's default).
    interval_multiplier: Optional[int]
    #: GenAI max_num_seqs (1 under --deterministic: one sequence per step is the only exact schedule on 2026.4.1).
    max_num_seqs: int
    #: dynamic_split_fuse (off under --deterministic: a prompt is prefilled whole).
    split_fuse: bool
    #: max_num_batched_tokens (at least the context under --deterministic, so that no prompt is chunked).
    batched_tokens: int
    #: One line for the log.
    note: str


def hybrid_prefix_caching(cfg: dict) -> tuple[bool, Optional[str]]:
    """Prefix caching on a hybrid model: off, and why, whenever it is asked for.

    OpenVINO GenAI 2026.4.1 restores linear-attention state at checkpoints every block × multiplier tokens, and a hit
    can restore the wrong state: with a multiplier of 2 or more a prompt that shares a first KV block but not the
    whole interval with an earlier one gets that other prompt's state (contract prefix_checkpoint_leak); with 1, some
    hits continue from a wrong state (seen through Keel with --max_num_batched_tokens 256: a 256- or 257-token prompt
    after prompts sharing its first 256 tokens; e2e hybrid-prefix.test.ts; not reproduced on a bare pipeline yet). A
    cache hit must never change output, so hybrid models run without reuse.
    """
    asked = bool(cfg.get("prefixCaching"))
    multiplier = int(cfg.get("cacheIntervalMultiplier") or 1)
    if not asked:
        return False, None
    if multiplier > 1:
        return False, (f"prefix caching is off for this hybrid (linear-attention) model: with --cache_interval_multiplier {multiplier} "
                       "OpenVINO GenAI 2026.4.1 can restore another prompt's linear-attention state on a prefix-cache hit "
                       "(docs/upstream.md)")
    return False, ("prefix caching is off for this hybrid (linear-attention) model: OpenVINO GenAI 2026.4.1 restores a wrong "
                   "linear-attention state on some prefix-cache hits (seen with multiplier 1: a 257-token prompt after a 256-token "
                   "one it starts with), which changes the output (docs/upstream.md)")


def hybrid_settings(cfg: dict, prefix: bool, kv_blocks: int, block: int, split_fuse: bool, exact_positions: bool = True) -> HybridSettings:
    """The linear-attention pool and schedule for a hybrid model served with `cfg` and a pool of `kv_blocks`.

    With prefix caching the LA state is checkpointed every block × multiplier tokens and a sequence of n tokens holds
    ceil(n / LA block) LA blocks: a pool full of KV holds at most ceil(pool / LA block) + one per sequence (each
    sequence's partial last block). Without prefix caching OpenVINO keeps one fixed LA block per sequence.
    """
    seqs = int(cfg["maxNumSeqs"])
    mbt = int(cfg["maxNumBatchedTokens"])
    multiplier = int(cfg["cacheIntervalMultiplier"]) if cfg.get("cacheIntervalMultiplier") else None
    serial = bool(cfg.get("deterministic")) and not exact_positions
    if serial:
        # One sequence per step, whole-prompt prefill: the only exact schedule of an unrewired hybrid IR (docs/upstream.md).
        seqs, split_fuse, mbt = 1, False, max(mbt, int(cfg["maxModelLen"]))
    pool_tokens = kv_blocks * block
    if prefix:
        la_block = block * (multiplier or 1)
        la_blocks = math.ceil(pool_tokens / la_block) + seqs
        how = f"prefix caching on: LA block = {block} x {multiplier or 1} = {la_block} tokens, ceil({pool_tokens} / {la_block}) + {seqs} sequences"
    else:
        la_block = None
        la_blocks = seqs
        how = "prefix caching off: one fixed LA block per sequence"
    note = (f"hybrid (linear-attention) model: num_linear_attention_blocks {la_blocks} ({how}); max_num_seqs {seqs}; "
            f"the worker preempts whole requests itself so OpenVINO never partially preempts linear-attention state"
            + ("; --deterministic without rewired rotary positions: one sequence per step, prompts prefilled whole" if serial else ""))
    return HybridSettings(la_block, la_blocks, multiplier, seqs, split_fuse, mbt, note)


class HybridGuard:
    """The whole-request preemption of hybrid models (module doc)."""

    def __init__(self, settings: HybridSettings, kv_blocks: int, blocks_for: Callable[[int], int]) -> None:
        #: The scheduler settings this guard keeps within.
        self.settings = settings
        #: KV pool in blocks.
        self.kv_blocks = kv_blocks
        #: KV blocks a sequence of n tokens holds (with its next token): Engine.blocks_for.
        self.blocks_for = blocks_for

    @staticmethod
    def context(req: Any) -> int:
        return req.input_len + len(req.produced)

    def next_step_need(self, running: Iterable[Any]) -> int:
        """KV blocks the running requests hold one step from now (one more token each)."""
        return sum(self.blocks_for(self.context(r) + 1) for r in running)

    def admits(self, running: Iterable[Any], releasing: Iterable[Any], req: Any) -> bool:
        """Whether `req` may enter now: this step (the released still holding theirs) and the next one fit."""
        running = list(running)
        now = sum(self.blocks_for(self.context(r)) for r in [*running, *releasing]) + self.blocks_for(req.input_len + len(req.produced))
        return now <= self.kv_blocks and self.next_step_need([*running, req]) <= self.kv_blocks

    def victims(self, running: dict) -> list[Any]:
        """The requests to preempt whole before this step, latest admitted first, until the next step fits."""
        order = sorted(running.items(), key=lambda kv: kv[0])  # OpenVINO ids grow with admission
        keep = [r for _, r in order]
        out: list[Any] = []
        while len(keep) > 1 and self.next_step_need(keep) > self.kv_blocks:
            out.append(keep.pop())
        return out

    def la_in_use(self, running: Iterable[Any]) -> int:
        """Linear-attention blocks the running requests hold (estimated like the KV: OpenVINO does not report it)."""
        la = self.settings.la_block_tokens
        reqs = list(running)
        if la is None:
            return len(reqs)
        return sum(max(1, math.ceil(self.context(r) / la)) for r in reqs)
