"""The OpenVINO worker's step loop: one thread owns every call into OpenVINO (add_request, step, the handles and the
tokenizer; research/openvino-engine.md §6: step() holds the GIL for the whole step, nothing may race it). Per
iteration, as named steps:
  1. take_commands — what arrived (block while idle); pings are answered as soon as they are read;
  2. apply_aborts  — queued → finished at once; running → handle.stop(), finish reported now;
  2b. guard_pool   — hybrid models only: preempt whole the latest-admitted requests that the next step cannot hold
                     (hybrid_guard.py), so that OpenVINO never partially preempts linear-attention state;
  3. admit         — queued requests enter OpenVINO while fewer than maxNumSeqs run and the pool holds them;
  4. run_step      — one pipeline step() if OpenVINO has work; any exception is fatal (the gateway resumes);
  5. read_handles  — every running handle (can_read before read: read blocks): tokens, text, finishes;
  6. emit_step     — one step message for a step that did work.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional

from engine import Engine
from guides import GuideRefused, phase_at
from logline import log
from utf8_guard import MAX_RESAMPLES

#: Times a request OpenVINO drops (IGNORED) is re-added before the worker treats it as an engine fault.
MAX_REQUEUES = 3


def run(e: Engine) -> None:
    """Drive the engine until the gateway goes away or asks for a shutdown."""
    memory = MemoryTrace.from_env()
    while True:
        if not take_commands(e):
            return
        if memory:
            memory.after_step(e.steps)
        outputs: dict = {}
        apply_aborts(e, outputs)
        guard_pool(e)
        admit(e, outputs)
        batch_tokens = 0
        if (e.running or e.releasing) and e.pipe.has_non_finished_requests():
            metrics = run_step(e)
            decoded = read_handles(e, outputs)
            prefill = estimate_prefill(e, decoded)
            batch_tokens = decoded + prefill if metrics.scheduled_requests > 0 else decoded
            if batch_tokens > 0:
                e.steps += 1
            e.last_usage = float(metrics.cache_usage)
        if outputs or batch_tokens > 0:
            emit_step(e, outputs, batch_tokens)


class MemoryTrace:
    """KEEL_OV_TRACEMALLOC=FILE (a leak hunt, bench/soak.mjs): the Python allocations that grew since step 1000, by
    line, appended to FILE every 5000 steps. Off unless set: tracing slows every allocation."""

    def __init__(self, path: str) -> None:
        import tracemalloc

        self.tracemalloc = tracemalloc
        self.path = path
        self.base = None
        self.last_step = 0
        tracemalloc.start(8)

    @staticmethod
    def from_env() -> "Optional[MemoryTrace]":
        path = os.environ.get("KEEL_OV_TRACEMALLOC")
        return MemoryTrace(path) if path else None

    def after_step(self, step: int) -> None:
        if step == self.last_step:
            return
        self.last_step = step
        if self.base is None and step >= 1000:
            self.base = self.tracemalloc.take_snapshot()
        elif self.base is not None and step % 5000 == 0:
            now = self.tracemalloc.take_snapshot()
            top = now.compare_to(self.base, "traceback")[:12]
            with open(self.path, "a", encoding="utf-8") as f:
                size, peak = self.tracemalloc.get_traced_memory()
                f.write(f"== step {step}: traced {size / 1e6:.1f} MB (peak {peak / 1e6:.1f} MB)\n")
                for stat in top:
                    f.write(f"{stat.size_diff / 1e3:+.1f} kB in {stat.count_diff:+d} blocks\n")
                    for line in stat.traceback.format()[-6:]:
                        f.write(f"    {line}\n")


def take_commands(e: Engine) -> bool:
    """Apply what arrived (adds, tokenize answers, abort arrivals); False when the loop must end."""
    idle = not e.requests and not e.releasing
    assert e.inbox is not None
    for item in e.inbox.take(block=idle):
        kind = item[0]
        if kind == "eof":
            return False  # the gateway is gone: nobody can read our output
        if kind == "shutdown":
            e.stopping = True
        elif kind == "refuse":
            e.refuse(item[1], "invalid_params", item[2])
        elif kind == "tokenize":
            m = item[1]
            try:
                e.emit({"type": "tokenized", "id": m["id"], "tokens": e.tokenize(m["text"], m["addSpecialTokens"])})
            except Exception as err:  # noqa: BLE001
                e.emit({"type": "tokenized", "id": m["id"], "error": str(err)})
        elif kind == "add":
            e.apply_add(item[1])
        elif kind == "abort":
            for rid in item[1]["ids"]:
                if rid in e.requests:
                    e.abort_arrived.setdefault(rid, e.steps)
    return not e.stopping


def apply_aborts(e: Engine, outputs: dict) -> None:
    """A queued request leaves at once; a running one is stopped in OpenVINO (freed at its next step) and its finish
    is reported now; OpenVINO never mentions it to us again (we drop the handle)."""
    for rid in list(e.abort_arrived):
        req = e.requests.get(rid)
        if req is None:
            e.abort_arrived.pop(rid, None)
            continue
        if req.phase == "queued":
            e.queued.remove(req)
        else:
            req.handle.stop()
            e.running = {k: r for k, r in e.running.items() if r is not req}
            # OpenVINO frees a stopped request's blocks only at the end of its next step(): until then they count as
            # held (admitting into them can leave nothing schedulable: requests IGNORED).
            e.releasing.append(req)
        e.finish(req, "abort", e.output_for(outputs, rid))


def requeue_first(e: Engine, req, preempted: bool = True) -> None:
    """Put a running request back first in line; it re-enters with its prompt and what it generated (prefilled)."""
    req.handle, req.phase = None, "queued"
    if req.utf8 is not None:
        req.utf8.drop_held()  # it re-enters with the emitted tokens only
    e.queued.insert(0, req)
    if preempted:
        e.preemptions += 1


def may_resample(e: Engine, req, more: list[int]) -> bool:
    """Whether a token that is not valid UTF-8, after the request's text and `more` tokens, is sampled again: only
    inside a rule (in free text or reasoning the bytes stay, as without a guide and as the llama.cpp engine's lazy
    grammar leaves them), by a sampled request (greedy would pick it again), fewer than MAX_RESAMPLES times in a row
    there. Otherwise the bytes stay as the model wrote them."""
    try:
        phase = phase_at(req.params["guide"], e.generated_text(req, tuple(more)))
    except GuideRefused:
        return False  # inside a trigger's text or a marker (free text): no re-add can continue there
    except Exception as err:  # noqa: BLE001 - a planner bug must not take the worker (and every request) down
        log("error", f"could not re-derive a guide after an invalid UTF-8 token: {err}", event="utf8_resample_plan", request=req.id)
        return False
    if phase != "rule":
        return False
    greedy = req.params["temperature"] == 0 or req.params.get("topK") == 1
    exhausted = req.utf8_at == len(req.produced) + len(more) and req.utf8_in_a_row >= MAX_RESAMPLES
    if greedy or exhausted:
        why = "greedy decoding would pick it again" if greedy else f"{req.utf8_in_a_row} samples in a row were not valid"
        log("warn", f"a guided request's token inside a rule is not valid UTF-8 and stays as sampled ({why}; OpenVINO GenAI cannot ban it)", event="utf8_kept", request=req.id, generated=len(req.produced) + len(more))
        return False
    return True


def resample(e: Engine, ov_id: int, req, status: str) -> None:
    """A sampled guided request drew a token that is not valid UTF-8 inside a rule (dropped by read_handles): re-add it
    first in line with what it emitted, to sample that character again with another seed."""
    if status == "RUNNING":
        req.handle.stop()
        e.releasing.append(req)
    del e.running[ov_id]
    req.utf8_resamples += 1
    req.utf8_in_a_row = req.utf8_in_a_row + 1 if req.utf8_at == len(req.produced) else 1
    req.utf8_at = len(req.produced)
    log("info", "a guided request sampled a token that is not valid UTF-8 inside a rule (XGrammar takes it): sampled again", event="utf8_resample", request=req.id, generated=len(req.produced), rejected=req.utf8.rejected.hex(" "), inARow=req.utf8_in_a_row)
    requeue_first(e, req, preempted=False)


def guard_pool(e: Engine) -> None:
    """Hybrid models: stop and re-queue (whole) the latest-admitted requests the next step's pool cannot hold. A
    stopped request keeps its blocks through the coming step, so the guard acts one step ahead of the shortage."""
    if e.guard is None:
        return
    victims = e.guard.victims(e.running)
    for req in victims:
        req.handle.stop()
        e.running = {k: r for k, r in e.running.items() if r is not req}
        e.releasing.append(req)
        req.guard_preemptions += 1
        requeue_first(e, req)
    if victims:
        log("info", f"preempted {len(victims)} request(s) whole before the KV pool runs short (hybrid model)", event="hybrid_preempt", requests=[r.id for r in victims], preemptions=e.preemptions)


def admit(e: Engine, outputs: dict) -> None:
    """Admit while fewer than maxNumSeqs run and the pool holds what every admitted request has now plus the new
    prompt (a block of headroom each). OpenVINO prefills several prompts chunk by chunk without reserving their
    blocks: prompts that do not fit together fill the pool half-prefilled, nothing can be scheduled, and OpenVINO
    turns requests IGNORED (seen with 4 prompts of 13 blocks in a 16-block pool). Growth while decoding may still
    overrun the pool: that is what OpenVINO's preemption handles."""
    while e.queued and len(e.running) < e.max_seqs and e.fits(e.queued[0]):
        req = e.queued.pop(0)
        import numpy as np
        import openvino as ov

        # A re-added request (after IGNORED) continues from what it generated: its tokens are prefilled.
        ids = req.prompt + req.resumed + req.produced
        tensor = ov.Tensor(np.array([ids], dtype=np.int64))
        ov_id = e.next_ov_id
        e.next_ov_id += 1
        try:
            if req.reentered:
                req.gen_config = e.generation_config(req, req.max_new - len(req.produced))
            req.handle = e.pipe.add_request(ov_id, tensor, req.gen_config)
        except Exception as err:  # noqa: BLE001 - raised before anything is queued (research §1)
            if req.reentered:
                e.finish(req, "error", e.output_for(outputs, req.id), {"code": "engine_error", "message": f"OpenVINO GenAI refused to continue the request: {err}"})
            else:
                e.requests.pop(req.id, None)
                e.refuse(req.id, "invalid_params", f"OpenVINO GenAI refused the request: {err}")
            continue
        req.phase = "prefill"
        req.prefill_left = len(ids)
        e.running[ov_id] = req
        if req.reentered:
            continue  # admitted once, when it first entered OpenVINO
        e.output_for(outputs, req.id)["admitted"] = {
            "promptTokens": req.prompt,
            "cachedTokens": 0,
            "queueMs": round((time.monotonic() - req.arrived) * 1000, 3),
        }


def run_step(e: Engine) -> Any:
    """One OpenVINO step; returns its metrics. Any exception is fatal: the pipeline's state is unknown after it
    (research §5), so the worker exits and the gateway resumes every request on a fresh engine."""
    step = e.steps + 1
    e.faults.before_step(step, lambda: [e.decode(r.prompt) for r in e.running.values()])
    try:
        if e.faults.step_raises(step):
            raise RuntimeError(f"injected failure at step {step}")
        e.pipe.step()
    except Exception as err:  # noqa: BLE001
        e.emit({"type": "fatal", "message": f"OpenVINO step() failed: {err}"})
        log("fatal", f"OpenVINO step() failed; exiting so the gateway resumes every request on a fresh engine: {err}", event="step_failed")
        os._exit(1)
    metrics = e.pipe.get_metrics()
    # That step freed the requests stopped before it.
    e.releasing.clear()
    return metrics


def read_handles(e: Engine, outputs: dict) -> int:
    """Read every running handle (read() blocks when empty: can_read first); returns the tokens decoded."""
    decoded = 0
    for ov_id, req in list(e.running.items()):
        got: list[int] = []
        logprobs: list[float] = []
        h = req.handle
        while h.can_read():
            for seq in h.read().values():
                got.extend(int(t) for t in seq.generated_ids)
                logprobs.extend(float(x) for x in seq.generated_log_probs)
                if str(seq.finish_reason).endswith(("STOP", "LENGTH")):
                    req.last_reason = str(seq.finish_reason).rsplit(".", 1)[-1]
        status = str(h.get_status()).rsplit(".", 1)[-1]
        if status == "RUNNING" and e.faults.ignores(e.steps + 1):
            # Test-only: handle this request as OpenVINO's out-of-memory path would (docs/fault-injection.md).
            h.stop()
            e.releasing.append(req)
            status = "IGNORED"
        cut = e.stop_cut(req, got)
        if cut is not None:
            # A stop token ends the request also under ignoreEos, which OpenVINO applies to every stop id: the loop
            # ends it itself (OpenVINO bans stop ids before min_new_tokens, so a stop token here is past minTokens)
            # and drops what OpenVINO generated after it.
            got, logprobs = got[:cut], logprobs[:cut]
        sampled = len(got)
        invalid = False
        if req.utf8 is not None:
            # Guided: an incomplete character is held until it completes, and a token that is not valid UTF-8 inside
            # a rule is dropped, so that the request can sample that character again (utf8_guard.py, may_resample).
            n = len(got) - (1 if cut is not None else 0)  # the stop token adds no text
            kept, kept_lp, invalid = req.utf8.settle(got[:n], logprobs[:n], lambda t: t in e.eog, cut is not None or status == "FINISHED", lambda more: may_resample(e, req, more))
            if invalid:
                cut = None
                got, logprobs = kept, kept_lp
                if status == "FINISHED" and req.last_reason == "LENGTH":
                    invalid = False  # the last tokens allowed were the invalid ones: it ends at its length without them
            else:
                got, logprobs = kept + got[n:], kept_lp + logprobs[n:]
        if cut is not None:
            h.stop()
            e.releasing.append(req)
            status, req.last_reason = "FINISHED", "STOP"
        if sampled:
            decoded += sampled
            req.phase = "decode"
            req.prefill_left = 0
        if got:
            req.produced.extend(got)
            out = e.output_for(outputs, req.id)
            out["tokens"].extend(got)
            # End-of-generation tokens and the stop token that ended the request add no text (§6.1).
            speaking = got[:-1] if cut is not None else got
            out["text"] += req.detok.push([t for t in speaking if t not in e.eog])
            if req.params.get("logprobs") is not None:
                out["logprobs"] = [e.position_logprob(t, lp) for t, lp in zip(got, logprobs)]
        elif not sampled and req.phase == "decode" and status == "RUNNING":
            # A request that was decoding got no token: OpenVINO preempted it (its KV went to others; it is
            # recomputed: back in prefill).
            req.phase = "prefill"
            e.preemptions += 1
            if e.guard:
                # The guard's count was short of what OpenVINO allocates: the hazard it exists for (hybrid_guard.py).
                log("warn", "OpenVINO preempted a request of a hybrid model itself (the worker's pool count was short)", event="hybrid_ov_preempted", request=req.id)
        if invalid:
            resample(e, ov_id, req, status)
        elif status == "FINISHED":
            out = e.output_for(outputs, req.id)
            reason = "length" if req.last_reason == "LENGTH" else "stop"
            out["text"] += req.detok.push([], final=True)
            del e.running[ov_id]
            e.finish(req, reason, out)
        elif status == "IGNORED" and req.requeues < MAX_REQUEUES:
            # OpenVINO dropped it (its out-of-memory path; it freed its blocks). The pipeline itself is fine: re-add
            # it first in line with what it generated, like a preemption, so the stream goes on (greedy:
            # token-identical) and nobody else is disturbed. Never a silent empty answer.
            del e.running[ov_id]
            req.requeues += 1
            requeue_first(e, req)
            log("warn", "OpenVINO dropped a request (IGNORED: out of KV cache); re-added with its generated tokens", event="ignored_requeued", request=req.id, generated=len(req.produced), requeues=req.requeues)
        elif status == "IGNORED":
            # Dropped again and again: treat it as an engine fault. Exit so that the gateway resumes every request on
            # a fresh engine (its bisection isolates a request that keeps doing this).
            e.emit({"type": "fatal", "message": f"OpenVINO dropped request {req.id} {MAX_REQUEUES + 1} times (IGNORED: out of KV cache)"})
            log("fatal", "OpenVINO keeps turning a request IGNORED (out of KV cache); exiting so that the gateway resumes every request", event="ignored", request=req.id)
            os._exit(1)
    return decoded


def estimate_prefill(e: Engine, decoded: int) -> int:
    """Prefill tokens of the step (an estimate: OpenVINO does not say): the step's budget after decodes goes to the
    prefilling requests in admission order."""
    budget = max(0, int(e.cfg["maxNumBatchedTokens"]) - decoded)
    prefill = 0
    for req in e.running.values():
        if req.prefill_left and budget:
            take = min(req.prefill_left, budget)
            req.prefill_left -= take
            budget -= take
            prefill += take
    return prefill


def emit_step(e: Engine, outputs: dict, batch_tokens: int) -> None:
    """The step message: every output and the engine's gauges."""
    e.emit({
        "type": "step",
        "step": e.steps,
        "batchTokens": batch_tokens,
        "outputs": list(outputs.values()),
        "stats": {
            "waiting": len(e.queued),
            "running": len(e.running),
            "activeSequences": len(e.running),
            "cachedSequences": 0,
            "prefixCacheHitTokens": 0,
            # OpenVINO reads its usage at schedule time, before the step frees finished requests: with nothing left
            # in flight nothing is held (prefix-cache blocks count as free).
            # OpenVINO's percentage is of the blocks it allocated so far, not of a large --cache_size pool: never more
            # than the worker's own count of the blocks its requests hold.
            "kvTokensInUse": min(int(round(e.last_usage / 100 * e.pool_tokens)), e.held_blocks() * e.block) if e.running or e.releasing else 0,
            "preemptions": e.preemptions,
            **({"linearAttentionBlocks": {"inUse": e.guard.la_in_use([*e.running.values(), *e.releasing]), "total": e.guard.settings.la_blocks}} if e.guard else {}),
        },
    })
