"""The OpenVINO engine's state: the ContinuousBatchingPipeline built from the EngineConfig, its tokenizer, the KV pool,
the live requests, and how an `add` becomes one (or is refused). The step loop that drives it: step_loop.py.
"""
from __future__ import annotations

import codecs
import os
import sys
import time
from typing import Optional

from channel import Channel
from detokenize import ByteDetokenizer, Detokenizer
from faults import Faults
from guides import GuideRefused, plan_for, to_structured_config
from inbox import Inbox
from logline import Ticking, log
from messages import PROTOCOL_VERSION
from hybrid_guard import HybridGuard, hybrid_prefix_caching, hybrid_settings
from model_meta import is_hybrid, model_metadata, token_bytes_table
from ov_settings import block_size, compile_properties, kv_element_bytes, resolve_device
from request_state import Request
from tokenizer_limit import PromptCut, tokenizer_cap
from utf8_guard import Utf8Guard, resample_seed

V = PROTOCOL_VERSION
ENGINE_NAME = "openvino-genai"
#: Extended sampling fields OpenVINO GenAI applies (it has no logit bias).
SAMPLING_FIELDS = ["presencePenalty", "frequencyPenalty", "repetitionPenalty", "minP", "minTokens", "stopTokenIds"]
#: The event a gateway recognises as "the GPU asked for is not there" (cli.ts validateModel).
NO_GPU_EVENT = "no_gpu_backend"


class Engine:
    def __init__(self, cfg: dict, channel: Optional[Channel]) -> None:
        import openvino_genai as ov_genai

        self.ov = ov_genai
        self.cfg = cfg
        self.channel = channel
        self.device = resolve_device(cfg)
        self.meta = model_metadata(cfg["modelPath"])
        load_path = cfg["modelPath"]
        try:
            import prep  # model preparation (re-encode what OpenVINO cannot load; saved IR), src/engine-openvino/prep.py

            cache_dir = cfg.get("cacheDir") or os.environ.get("KEEL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "keel")
            load_path = prep.prepare(cfg["modelPath"], cache_dir, lambda m: log("info", m, event="model_prep"))
        except ImportError:
            pass
        #: Whether a hybrid IR's rotary reads position_ids (exact batched output); False: --deterministic serialises.
        self.exact_positions = True
        if is_hybrid(load_path):
            # Exact output on hybrid IRs: the rotary reads position_ids (rewired_ir.py, docs/upstream.md).
            from rewired_ir import rewired_path

            cache_root = cfg.get("cacheDir") or os.environ.get("KEEL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "keel")
            load_path, rewired = rewired_path(load_path, cache_root, lambda m, f: log("info", m, event="rope_positions", **f))
            self.exact_positions = bool(rewired)
        props, notes = compile_properties(cfg, self.device)
        for note in notes:
            log("warn", note, event="plugin_config")
        self.block = block_size(self.device)
        # The pool: fixed, so that one request's growth cannot take memory from the rest mid-flight.
        if cfg.get("kvBlocks"):
            pool_tokens = int(cfg["kvBlocks"]) * self.block
        elif cfg.get("cacheGb") and self.meta["kvElementsPerToken"]:
            pool_tokens = int(float(cfg["cacheGb"]) * 1e9 / (self.meta["kvElementsPerToken"] * kv_element_bytes(props)))
        else:
            # Every sequence at max_model_len, plus the one block of headroom a request is checked against (below).
            pool_tokens = int(cfg["maxModelLen"]) * int(cfg["maxNumSeqs"]) + self.block
        # Whole blocks: a GB budget is never exceeded (floor), the default pool always holds its sequences (ceil).
        self.kv_blocks = max(2, pool_tokens // self.block if cfg.get("cacheGb") and not cfg.get("kvBlocks") else -(-pool_tokens // self.block))
        self.pool_tokens = self.kv_blocks * self.block
        sc = ov_genai.SchedulerConfig()
        sc.num_kv_blocks = self.kv_blocks
        sc.max_num_seqs = int(cfg["maxNumSeqs"])
        sc.max_num_batched_tokens = int(cfg["maxNumBatchedTokens"])
        # Split-fuse off when the gateway caps prompts at one step (maxPromptLen), as OVMS's --dynamic_split_fuse false.
        sc.dynamic_split_fuse = cfg.get("maxPromptLen") is None
        sc.enable_prefix_caching = bool(cfg.get("prefixCaching"))
        #: The whole-request preemption of hybrid models (hybrid_guard.py), None for attention-only models.
        self.guard: Optional[HybridGuard] = None
        if cfg.get("cacheIntervalMultiplier"):
            sc.cache_interval_multiplier = int(cfg["cacheIntervalMultiplier"])
        if is_hybrid(load_path):
            prefix, why = hybrid_prefix_caching(cfg)
            if why:
                log("warn", why, event="hybrid_model")
            sc.enable_prefix_caching = prefix
            hs = hybrid_settings(cfg, sc.enable_prefix_caching, self.kv_blocks, self.block, sc.dynamic_split_fuse, self.exact_positions)
            sc.num_linear_attention_blocks = hs.la_blocks
            sc.max_num_seqs, sc.dynamic_split_fuse, sc.max_num_batched_tokens = hs.max_num_seqs, hs.split_fuse, hs.batched_tokens
            self.guard = HybridGuard(hs, self.kv_blocks, self.blocks_for)
            log("info", hs.note, event="hybrid_model", laBlocks=hs.la_blocks, laBlockTokens=hs.la_block_tokens, cacheIntervalMultiplier=hs.interval_multiplier)
        #: Sequences OpenVINO runs at once (maxNumSeqs, or 1 for a hybrid model under --deterministic).
        self.max_seqs = int(sc.max_num_seqs)
        #: Tokens OpenVINO computes in one step (maxNumBatchedTokens, or a hybrid model's setting).
        self.batched_tokens = int(sc.max_num_batched_tokens)
        tok_props = {"enable_save_ov_model": True} if props.get("enable_save_ov_model") else {}
        try:
            with Ticking(f"compiling the model for {self.device} (OpenVINO)", "model_compile"):
                self.pipe = ov_genai.ContinuousBatchingPipeline(load_path, sc, self.device, props, tok_props)
        except RuntimeError as err:
            if self.device == "GPU":
                log("fatal", f"a GPU was asked for (device \"gpu\") but OpenVINO cannot use one: {err}", event=NO_GPU_EVENT)
                sys.exit(3)
            raise
        self.tok = self.pipe.get_tokenizer()
        if self.meta["chatTemplate"] is None:
            self.meta["chatTemplate"] = self.tok.chat_template or None
        if not self.meta["bosToken"]:
            self.meta["bosToken"] = self.tok.get_bos_token()
        if not self.meta["eosToken"]:
            self.meta["eosToken"] = self.tok.get_eos_token()
        defaults = self.pipe.get_config()
        #: End-of-generation ids: the model's EOS and its default stop tokens.
        self.eog = set(defaults.stop_token_ids or []) | {self.tok.get_eos_token_id()}
        self.eog.discard(-1)
        #: Where OpenVINO's tokenizer cuts a text silently (tokenizer_limit.py), or None.
        self.tokenizer_cap = tokenizer_cap(lambda t: len(self.tok.encode(t, add_special_tokens=False).input_ids.data[0]))
        bos = self.tok.get_bos_token_id()
        probe_plain = list(self.tok.encode("a", add_special_tokens=False).input_ids.data[0])
        probe_special = list(self.tok.encode("a", add_special_tokens=True).input_ids.data[0])
        #: The BOS id the tokenizer prepends, or None.
        self.bos = bos if bos >= 0 and len(probe_special) > len(probe_plain) and probe_special[0] == bos else None
        self.vocab = int(self.meta["vocabSize"])
        #: Bytes of every token (byte-level GGUF vocabularies), else None: text then comes from OpenVINO's detokenizer.
        self.token_bytes = token_bytes_table(cfg["modelPath"])
        self.max_len = int(cfg["maxModelLen"])
        if self.tokenizer_cap is not None and self.tokenizer_cap <= self.max_len and cfg.get("mode", "serve") == "serve":
            log("warn", f"OpenVINO's tokenizer cuts a text at {self.tokenizer_cap} tokens: prompts that long are refused although max_model_len is {self.max_len}", event="tokenizer_cap", tokenizerCap=self.tokenizer_cap)

        # Loop state.
        #: Live requests by gateway id (queued and running).
        self.requests: dict[str, Request] = {}
        #: Queued requests (not yet in OpenVINO) in arrival order.
        self.queued: list[Request] = []
        #: Running requests by OpenVINO id.
        self.running: dict[int, Request] = {}
        #: Next OpenVINO request id; never reused (a reused live id wedges the pipeline).
        self.next_ov_id = 0
        #: Steps that computed a batch.
        self.steps = 0
        #: Preemptions observed (a decoding request that stopped getting tokens), cumulative.
        self.preemptions = 0
        #: Requests stopped in OpenVINO whose blocks it frees only at the end of its next step().
        self.releasing: list[Request] = []
        #: Step number at which each pending abort arrived.
        self.abort_arrived: dict[str, int] = {}
        self.stopping = False
        #: Test-only fault injection (faults.py); inert unless KEEL_FAULT_INJECTION is set.
        self.faults = Faults.from_env(first_process=int(cfg.get("generation", 1)) == 1)
        #: What the gateway sent (set by main once the channel is open).
        self.inbox: Optional[Inbox] = None
        #: The pool usage OpenVINO reported at its last step (percent).
        self.last_usage = 0.0

    def warm_up(self) -> dict:
        """One step at the largest batch before ready, as vLLM's profile run and llama.cpp's warm-up decode: the CPU
        plugin sizes its buffers for intermediate tensors to the biggest batch shape it has seen and keeps them, so
        without this the worker's memory climbs under the first heavy load instead of at start (issue #22's soak);
        on a GPU it also compiles the largest shapes' kernels before the first request waits for them.
        The prompt is one plain token repeated: no request of the gateway's is involved and its OpenVINO id is used
        up like any other. Returns what to log."""
        import numpy as np
        import openvino as ov

        started = time.monotonic()
        tokens = max(1, min(self.batched_tokens, self.max_len - 1, self.pool_tokens - self.block))
        filler = list(self.tok.encode("a", add_special_tokens=False).input_ids.data[0])[:1] or [0]
        config = self.ov.GenerationConfig()
        config.max_new_tokens = 1
        config.do_sample = False
        config.ignore_eos = True
        ov_id = self.next_ov_id
        self.next_ov_id += 1
        try:
            handle = self.pipe.add_request(ov_id, ov.Tensor(np.array([filler * tokens], dtype=np.int64)), config)
        except Exception as err:  # noqa: BLE001 - refused before anything is queued: serve without the warm-up
            return {"tokens": 0, "steps": 0, "ms": round((time.monotonic() - started) * 1000), "skipped": str(err)}
        steps = 0
        # Chunked prefill (a smaller step budget than the prompt) takes more than one step; bounded all the same.
        while self.pipe.has_non_finished_requests() and steps < 64:
            self.pipe.step()
            steps += 1
        while handle.can_read():
            handle.read()
        return {"tokens": tokens, "steps": steps, "ms": round((time.monotonic() - started) * 1000)}

    # -- helpers ------------------------------------------------------------------------------------------------

    def emit(self, msg: dict) -> None:
        if self.channel:
            self.channel.send({"v": V, **msg})

    def tokenize(self, text: str, special: bool) -> list[int]:
        ids = [int(t) for t in self.tok.encode(text, add_special_tokens=False).input_ids.data[0]]
        if self.tokenizer_cap is not None and len(ids) >= self.tokenizer_cap:
            raise PromptCut(len(ids), f"This prompt reaches the {self.tokenizer_cap} tokens where OpenVINO's tokenizer cuts a text (the rest would be lost without a word); shorten it, or serve with --engine llama.cpp for longer prompts.")
        if special and self.bos is not None and (not ids or ids[0] != self.bos):
            ids.insert(0, self.bos)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False) if ids else ""

    def capabilities(self) -> dict:
        return {
            "exactSeededResume": False,  # OpenVINO seeds a request's RNG once; a resumed sampled stream re-draws
            "maxTopLogprobs": 0,  # GenAI 2026.4 returns the sampled token's log-probability only (no alternatives)
            "extendedSampling": False,  # no logit_bias: GenerationConfig has none, and no logits processor hook
            "samplingFields": SAMPLING_FIELDS,
            "grammars": True,  # guides become XGrammar structural tags at add (guides.py); what cannot is refused
            "sharedPrefill": False,
        }

    def backend(self) -> dict:
        if self.device == "CPU":
            return {"gpu": False, "devices": []}
        try:
            import openvino as ov

            name = ov.Core().get_property("GPU", "FULL_DEVICE_NAME")
        except Exception:  # noqa: BLE001 - a name is only informative
            name = "GPU"
        return {"gpu": "openvino-gpu", "devices": [str(name)]}

    # -- adds -----------------------------------------------------------------------------------------------------

    def refuse(self, rid: str, code: str, message: str, param: str | None = None) -> None:
        """Refuse an add; `param` names the params field at fault, when the refusal is about one."""
        self.emit({"type": "request_error", "id": rid, "code": code, "message": message, **({"param": param} if param else {})})

    def generation_config(self, req: Request, max_new: int):
        p = req.params
        c = self.ov.GenerationConfig()
        c.max_new_tokens = max_new
        if p["temperature"] == 0:
            c.do_sample = False
        else:
            c.do_sample = True
            c.temperature = float(p["temperature"])
            c.top_p = float(p["topP"])
            if p["topK"] > 0:
                c.top_k = int(p["topK"])
            c.rng_seed = resample_seed(int(p["seed"]), req.utf8_resamples)
            if "minP" in p:
                c.min_p = float(p["minP"])
        c.ignore_eos = bool(p["ignoreEos"])
        if "presencePenalty" in p:
            c.presence_penalty = float(p["presencePenalty"])
        if "frequencyPenalty" in p:
            c.frequency_penalty = float(p["frequencyPenalty"])
        if "repetitionPenalty" in p:
            c.repetition_penalty = float(p["repetitionPenalty"])
        if p.get("minTokens"):
            c.min_new_tokens = max(0, int(p["minTokens"]) - len(req.resumed) - len(req.produced))
        if p.get("stopTokenIds"):
            c.stop_token_ids = set(int(t) for t in p["stopTokenIds"]) | self.eog
        if p.get("logprobs") is not None:
            c.logprobs = 1
        if p.get("guide") is not None:
            # The guide in the state the request's generated text left it (a resume or re-add continues, never restarts).
            c.structured_output_config = to_structured_config(plan_for(p["guide"], self.generated_text(req)), self.ov)
        return c

    def generated_text(self, req: Request, more: tuple = ()) -> str:
        """The text of what the request generated so far (resumed, produced and `more` tokens; end-of-generation adds
        none), as its client got it: bytes that are not UTF-8 read as U+FFFD (free text may hold them). Raises
        GuideRefused when it stops inside a character (a guide cannot continue from half a character)."""
        ids = [t for t in (*req.resumed, *req.produced, *more) if t not in self.eog]
        if not ids:
            return ""
        if not self.token_bytes:
            return self.decode(ids)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(b"".join(self.token_bytes[t] for t in ids))
        if decoder.getstate()[0]:
            raise GuideRefused("the OpenVINO engine cannot resume a guided request whose generated text stops inside a character")
        return text

    def apply_add(self, m: dict) -> None:
        rid = m["id"]
        if rid in self.requests:
            return self.refuse(rid, "duplicate_id", f"request id {rid} is already live")
        p = m["params"]
        unsupported = [k for k in ("logitBias",) if k in p]
        if unsupported:
            return self.refuse(rid, "invalid_params", "the OpenVINO engine does not apply logitBias (OpenVINO GenAI has no logit bias)")
        if p.get("guide") is not None and (p["ignoreEos"] or p.get("minTokens")):
            # OpenVINO lets a completed grammar's end-of-generation be ignored (the output then runs on unconstrained)
            # and masks everything before min_new_tokens (NUL tokens): never apply a guide loosely.
            field = "ignoreEos" if p["ignoreEos"] else "minTokens"
            return self.refuse(rid, "invalid_params", f"the OpenVINO engine cannot apply a guide together with {field}: after a complete grammar only end-of-generation may follow")
        if p.get("logprobs") is not None and p["logprobs"] > 0:
            return self.refuse(rid, "invalid_params", f"logprobs {p['logprobs']} exceeds the engine's maximum of 0 (OpenVINO GenAI reports the sampled token's log-probability only)")
        bad = next((t for t in p.get("stopTokenIds") or [] if t >= self.vocab), None)
        if bad is not None:
            return self.refuse(rid, "invalid_params", f"stopTokenIds token {bad} is outside the vocabulary ({self.vocab})", "stopTokenIds")
        try:
            prompt = self.tokenize(m["prompt"]["text"], True) if "text" in m["prompt"] else list(m["prompt"]["tokens"])
        except PromptCut as cut:
            if cut.tokens > self.max_len:
                return self.refuse(rid, "context_length_exceeded", f"This model's maximum context length is {self.max_len} tokens. However, your messages resulted in at least {cut.tokens} tokens.")
            return self.refuse(rid, "context_length_exceeded", str(cut))
        except Exception as err:  # noqa: BLE001 - a tokenizer failure refuses this request only
            return self.refuse(rid, "invalid_prompt", f"could not tokenize the prompt: {err}")
        resumed = list(m.get("generated") or [])
        bad = next((t for t in prompt + resumed if t >= self.vocab), None)
        if bad is not None:
            return self.refuse(rid, "invalid_prompt", f"token id {bad} is outside the vocabulary ({self.vocab})")
        if not prompt:
            return self.refuse(rid, "invalid_prompt", "the prompt is empty after tokenization")
        n = len(prompt) + len(resumed)
        cap = self.max_len
        # One request must never outgrow the whole pool (OpenVINO ends it IGNORED: a silently truncated answer); a
        # block of slack covers the block holding the next token.
        pool_cap = self.pool_tokens - self.block
        if self.cfg.get("maxPromptLen") is not None and len(prompt) > int(self.cfg["maxPromptLen"]):
            cap_p = int(self.cfg["maxPromptLen"])
            return self.refuse(rid, "context_length_exceeded", f"Input length exceeds pipeline capabilities: {len(prompt)} > {cap_p} (a prompt must fit one step of {cap_p} tokens when chunked prefill is off)")
        if n >= cap:
            return self.refuse(rid, "context_length_exceeded", f"This model's maximum context length is {cap} tokens. However, your messages resulted in {n} tokens.")
        max_tokens = p["maxTokens"]
        max_new = cap - n if max_tokens is None else max_tokens - len(resumed)
        if max_new < 1:
            return self.refuse(rid, "invalid_prompt", "the resumed generation already reached max_tokens")
        if max_tokens is not None and n + max_new > cap:
            return self.refuse(rid, "context_length_exceeded", f"This model's maximum context length is {cap} tokens. However, you requested {n + max_new} tokens ({n} in the messages, {max_new} in the completion).")
        if n + max_new > pool_cap:
            if max_tokens is None and n < pool_cap:
                max_new = pool_cap - n  # "until the sequence capacity": the pool is that capacity here
            else:
                return self.refuse(rid, "context_length_exceeded", f"This request needs {n + max_new} tokens of KV cache but the engine's whole pool holds {pool_cap} ({self.kv_blocks} blocks of {self.block}); lower max_tokens or raise --cache_size / --num_kv_blocks.")
        mbt = int(self.cfg["maxNumBatchedTokens"])
        if self.device == "GPU" and self.cfg.get("maxPromptLen") is not None and n + max_new > mbt:
            # Split-fuse off on GPU: OpenVINO recomputes a fully preempted sequence (prompt + generated) in one step and
            # asserts inside step() when that exceeds the step budget (research §5), which would take every request down.
            return self.refuse(rid, "context_length_exceeded", f"With --dynamic_split_fuse false on GPU a request must fit one step: prompt + max_tokens = {n + max_new} > --max_num_batched_tokens {mbt}.")
        req = Request(id=rid, prompt=prompt, resumed=resumed, params=p, arrived=time.monotonic())
        # Validate the configuration now: OpenVINO raises at add_request on bad values, before queueing anything.
        try:
            req.gen_config = self.generation_config(req, max_new)
            req.gen_config.validate()
            req.max_new = max_new
        except GuideRefused as err:
            return self.refuse(rid, "invalid_params", str(err))
        except Exception as err:  # noqa: BLE001
            return self.refuse(rid, "invalid_params", f"OpenVINO GenAI refuses these sampling parameters: {err}")
        silent = lambda t: t in self.eog  # noqa: E731
        primed = [t for t in resumed if not silent(t)]
        req.detok = ByteDetokenizer(self.token_bytes, primed) if self.token_bytes else Detokenizer(self.decode, primed)
        if p.get("guide") is not None and self.token_bytes:
            req.utf8 = Utf8Guard(self.token_bytes)  # a guided resume starts at a character boundary (generated_text)
        self.requests[rid] = req
        self.queued.append(req)

    # -- the loop -------------------------------------------------------------------------------------------------

    def finish(self, req: Request, reason: str, out: dict, error: Optional[dict] = None) -> None:
        self.requests.pop(req.id, None)
        fin: dict = {"reason": reason, "promptTokens": req.input_len, "completionTokens": len(req.produced)}
        if error:
            fin["error"] = error
        if reason == "abort" and req.id in self.abort_arrived:
            fin["stepsAfterAbort"] = self.steps - self.abort_arrived.pop(req.id)
        out["finish"] = fin
        req.handle = None

    def output_for(self, outputs: dict, rid: str) -> dict:
        if rid not in outputs:
            outputs[rid] = {"id": rid, "tokens": [], "text": ""}
        return outputs[rid]

    def blocks_for(self, tokens: int) -> int:
        return -(-(tokens + 1) // self.block)

    def held_blocks(self) -> int:
        """KV blocks the admitted requests hold by the worker's count (their tokens so far, the released included)."""
        return sum(self.blocks_for(r.context_len) for r in [*self.running.values(), *self.releasing])

    def fits(self, req: Request) -> bool:
        """Whether the pool holds every admitted request's current tokens and `req`'s prompt (admission rule)."""
        if self.guard:
            return self.guard.admits(self.running.values(), self.releasing, req)
        return self.held_blocks() + self.blocks_for(req.context_len) <= self.kv_blocks

    def position_logprob(self, token: int, logprob: float) -> dict:
        """The sampled token's log-probability (OpenVINO reports no alternatives), with its bytes where known."""
        entry: dict = {"token": token, "logprob": logprob, "top": []}
        if self.token_bytes:
            entry["bytes"] = list(self.token_bytes[token])
        return entry

    def stop_cut(self, req: Request, got: list[int]) -> Optional[int]:
        """Length of `got` up to and including the first stop token allowed to end `req`, or None."""
        stops = req.params.get("stopTokenIds")
        if not stops:
            return None
        before = len(req.resumed) + len(req.produced)
        min_tokens = int(req.params.get("minTokens") or 0)
        for i, t in enumerate(got):
            if t in stops and before + i >= min_tokens:
                return i + 1
        return None
