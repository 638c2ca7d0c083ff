#!/usr/bin/env python3
"""Keel's OpenVINO GenAI engine: continuous batching (ContinuousBatchingPipeline) behind Keel's engine protocol.

Run as `python worker.py <EngineConfig JSON>` by the gateway (src/engine-openvino/venv.ts builds the venv). The
channel is fd 3 (docs/protocol.md); stdout is not private (OpenVINO logs to std::cout), so fd 1 is pointed at
stderr at start and the validate result goes to a private duplicate of the original stdout.

One thread owns every call into OpenVINO: add_request, step, the handles and the tokenizer
(research/openvino-engine.md §6: step() holds the GIL for the whole step; nothing may race it). The loop reads
the channel itself between steps (pings answered at once, everything else applied at that step boundary). The loop, per iteration:
  1. take what arrived (block while idle);
  2. apply aborts (waiting → finish at once; running → handle.stop(), finish reported now);
  3. admit waiting requests while fewer than maxNumSeqs run (add_request);
  4. step() if OpenVINO has work; any exception is fatal (the gateway restarts and resumes);
  5. read every handle (can_read before read: read blocks) and emit one step message.

Guards (issue #11; each pinned by a test in test/conformance or test/e2e):
  - OpenVINO request ids come from a counter that never repeats (a reused live id wedges the pipeline for good);
  - prompt + max new tokens above the KV pool is refused at add (one sequence outgrowing the pool turns EVERY
    in-flight request IGNORED); an IGNORED status that still happens is an engine fault: exit, resume elsewhere;
  - hybrid (linear-attention) models run with prefix caching off (the seed's assert needs partial preemption of
    recurrent state with prefix caching), logged;
  - exact numerics by default on CPU (f32 inference and KV, no dynamic quantisation): resumed streams and
    bystanders are token-identical; --plugin_config may trade that for speed (logged).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from channel import Channel, FrameDecoder  # noqa: E402
from messages import PROTOCOL_VERSION, parse_message  # noqa: E402

V = PROTOCOL_VERSION
ENGINE_NAME = "openvino-genai"
#: Extended sampling fields OpenVINO GenAI applies (it has no logit bias).
SAMPLING_FIELDS = ["presencePenalty", "frequencyPenalty", "repetitionPenalty", "minP", "minTokens", "stopTokenIds"]
#: Times a request OpenVINO drops (IGNORED) is re-added before the worker treats it as an engine fault.
MAX_REQUEUES = 3
#: The event a gateway recognises as "the GPU asked for is not there" (cli.ts validateModel).
NO_GPU_EVENT = "no_gpu_backend"


def log(level: str, msg: str, **extra: Any) -> None:
    """One JSON log line on stderr (the gateway relays engine stderr into its own log)."""
    line = {"level": level, "time": int(time.time() * 1000), "component": "engine", "pid": os.getpid(), "msg": msg, **extra}
    try:
        os.write(2, (json.dumps(line, separators=(",", ":")) + "\n").encode("utf-8"))
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------------------------
# Model metadata (what `ready` announces): from the GGUF header or the IR directory's config.json.

def _gguf_fields(path: str) -> dict:
    """Scalar and string keys of a GGUF header, plus its vocabulary (token strings and types)."""
    import mmap

    from prep import read_gguf_layout  # a struct reader: gguf.GGUFReader takes ~30 s on a 151k-token vocabulary

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        layout = read_gguf_layout(buf, frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"}))
    out = {name: key.value for name, key in layout.keys.items() if key.value is not None}
    if "tokenizer.ggml.tokens" in out:
        out["tokenizer.ggml.tokens"] = [b.decode("utf-8", "replace") for b in out["tokenizer.ggml.tokens"]]
    return out


def model_metadata(model_path: str) -> dict:
    """ModelMetadata (src/protocol/messages.ts) of a GGUF file or an OpenVINO IR directory."""
    if os.path.isdir(model_path):
        # A folder prepared from a GGUF (prep.py's manifest): the GGUF's own metadata, vocabulary bytes included.
        manifest = os.path.join(model_path, "manifest.json")
        source = json.load(open(manifest)).get("source", {}).get("path") if os.path.exists(manifest) else None
        if source and os.path.isfile(source):
            meta = model_metadata(source)
            _TOKEN_TABLES[model_path] = _TOKEN_TABLES[source]
            return {**meta, "path": model_path}
        cfg_path = os.path.join(model_path, "config.json")
        cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
        layers = cfg.get("num_hidden_layers")
        heads = cfg.get("num_attention_heads")
        kv_heads = cfg.get("num_key_value_heads", heads)
        head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads and cfg.get("hidden_size") else None)
        return {
            "path": model_path,
            "name": cfg.get("_name_or_path") or os.path.basename(os.path.normpath(model_path)),
            "architecture": cfg.get("model_type", "unknown"),
            "trainContextSize": cfg.get("max_position_embeddings", 4096),
            "vocabSize": cfg.get("vocab_size") or _ir_vocab_size(model_path),
            "chatTemplate": None,  # filled from the tokenizer
            "kvElementsPerToken": 2 * layers * kv_heads * head_dim if layers and kv_heads and head_dim else None,
            "bosToken": "",
            "eosToken": "",
        }
    f = _gguf_fields(model_path)
    arch = f.get("general.architecture", "unknown")
    tokens = f.get("tokenizer.ggml.tokens", [])
    layers = f.get(f"{arch}.block_count")
    heads = f.get(f"{arch}.attention.head_count")
    kv_heads = f.get(f"{arch}.attention.head_count_kv", heads)
    emb = f.get(f"{arch}.embedding_length")
    head_dim = f.get(f"{arch}.attention.key_length") or (emb // heads if emb and heads else None)
    tok = lambda key: tokens[f[key]] if key in f and 0 <= f[key] < len(tokens) else ""  # noqa: E731
    _TOKEN_TABLES[model_path] = (f.get("tokenizer.ggml.model"), tokens, f.get("tokenizer.ggml.token_type"))
    return {
        "path": model_path,
        "name": f.get("general.name"),
        "architecture": arch,
        "trainContextSize": f.get(f"{arch}.context_length", 2048),
        "vocabSize": len(tokens),
        "chatTemplate": f.get("tokenizer.chat_template"),
        "kvElementsPerToken": 2 * layers * kv_heads * head_dim if layers and kv_heads and head_dim else None,
        "bosToken": tok("tokenizer.ggml.bos_token_id"),
        "eosToken": tok("tokenizer.ggml.eos_token_id"),
    }


def _ir_vocab_size(model_dir: str) -> int:
    """The logits width of an IR model (its vocabulary size) when config.json does not say."""
    import openvino as ov

    model = ov.Core().read_model(os.path.join(model_dir, "openvino_model.xml"))
    for out in model.outputs:
        if "logits" in out.get_names() or len(model.outputs) == 1:
            return int(out.get_partial_shape()[-1].get_length())
    return int(model.outputs[0].get_partial_shape()[-1].get_length())


#: Vocabulary of each GGUF read by model_metadata: (tokenizer model, token strings, token types).
_TOKEN_TABLES: dict = {}


def _gpt2_byte_decoder() -> dict:
    """GPT-2 byte-level BPE: the printable character standing for each byte in token strings → that byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def token_bytes_table(model_path: str) -> Optional[list]:
    """The raw bytes of every token of a byte-level (gpt2) GGUF vocabulary, or None when unknown.

    Protocol §6.2 defines a request's text as the UTF-8 decoding of its tokens' bytes (invalid sequences → U+FFFD);
    OpenVINO's detokenizer drops invalid bytes instead, so the engine decodes bytes itself where it can.
    """
    entry = _TOKEN_TABLES.get(model_path)
    if not entry or entry[0] != "gpt2":
        return None
    _, tokens, types = entry
    dec = _gpt2_byte_decoder()
    table = []
    for i, text in enumerate(tokens):
        kind = types[i] if types and i < len(types) else 1
        if kind in (3, 4):  # control and user-defined tokens: their text as is
            table.append(text.encode("utf-8"))
        else:
            table.append(bytes(dec[ch] for ch in text if ch in dec) if all(ch in dec for ch in text) else text.encode("utf-8"))
    return table


def is_hybrid(model_path: str) -> bool:
    """A model with linear-attention (recurrent) layers: the seed's assert needs one (root-cause.md)."""
    cfg_path = os.path.join(model_path, "config.json") if os.path.isdir(model_path) else None
    if not cfg_path or not os.path.exists(cfg_path):
        return False  # GGUF: OpenVINO GenAI loads only llama/qwen2/qwen3 from GGUF, all pure attention
    cfg = json.load(open(cfg_path))
    layer_types = cfg.get("layer_types") or []
    return any(t != "full_attention" for t in layer_types) or "next" in str(cfg.get("model_type", ""))


# ---------------------------------------------------------------------------------------------------------------
# Engine settings from the EngineConfig.

def prefix_caching_for(cfg: dict, load_path: str) -> tuple[bool, Optional[str]]:
    """Prefix caching as asked, except for hybrid models (then off, and why)."""
    asked = bool(cfg.get("prefixCaching"))
    if asked and is_hybrid(load_path):
        return False, ("prefix caching is off for this hybrid (linear-attention) model: OpenVINO GenAI can assert when it "
                       "partially preempts recurrent state with prefix caching on (the seed's crash, root-cause.md); "
                       "with it off a preempted sequence is recomputed whole")
    return asked, None

#: KV block size of OpenVINO's paged cache (tokens): 32 on CPU, 16 on GPU (research §1).
def block_size(device: str) -> int:
    return 16 if device == "GPU" else 32


def ov_device(cfg: dict) -> str:
    return {"cpu": "CPU", "gpu": "GPU", "auto": "AUTO"}[cfg.get("device", "cpu")]


def resolve_device(cfg: dict) -> str:
    """CPU or GPU: AUTO takes an Intel GPU when OpenVINO sees one, else the CPU (said in `ready.backend`)."""
    device = ov_device(cfg)
    if device != "AUTO":
        return device
    import openvino as ov

    return "GPU" if any(d.startswith("GPU") for d in ov.Core().available_devices) else "CPU"


def compile_properties(cfg: dict, device: str = "CPU") -> tuple[dict, list[str]]:
    """Properties for compile_model and the notes to log about them.

    On CPU the engine is exact by default: f32 inference and KV, no dynamic quantisation (bf16 and dynamic
    quantisation make a sequence's logits depend on its batch neighbours, research §7, so a resumed stream or a
    bystander next to a preemption would drift). `--kv_cache_precision u8` keeps a u8 KV, and a `--plugin_config` that
    sets any of the three keys takes over all three (OpenVINO then picks the others: bf16 inference needs a matching
    KV type) — both trade exactness for speed or memory, with a note saying so.
    """
    notes: list[str] = []
    props: dict = {"INFERENCE_NUM_THREADS": int(cfg["threads"]), "sampler_num_threads": max(1, int(cfg["threads"]))}
    kv = {"f16": "f16", "f32": "f32", "q8_0": "u8", "q4_0": "u4"}[cfg.get("kvCacheType", "f16")]
    plugin = cfg.get("pluginConfig") or {}
    exact_keys = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE")
    overridden = [k for k in exact_keys if k in plugin]
    if device == "CPU" and not overridden:
        props.update({"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})
        props["KV_CACHE_PRECISION"] = "u8" if kv == "u8" else "f32"
        if kv == "u8":
            notes.append("--kv_cache_precision u8: a u8 KV cache makes batched and resumed streams differ slightly from an uninterrupted solo run")
    elif not overridden:
        props["KV_CACHE_PRECISION"] = kv
    props.update(plugin)
    if overridden:
        notes.append(f"--plugin_config sets {', '.join(overridden)}: OpenVINO's own defaults apply to the rest of {', '.join(exact_keys)}; resumed and batched streams may then differ from an uninterrupted solo run")
    return props, notes


def kv_element_bytes(props: dict) -> float:
    return {"f32": 4, "f16": 2, "bf16": 2, "u8": 1, "u4": 0.5}.get(str(props.get("KV_CACHE_PRECISION", "f16")).lower(), 2)


# ---------------------------------------------------------------------------------------------------------------
# Streaming text.

class ByteDetokenizer:
    """Incremental text from token bytes (protocol §6.2): an incremental UTF-8 decoder holds back an incomplete
    character and turns never-valid bytes into U+FFFD, exactly as the llama.cpp engine does."""

    def __init__(self, table: list, primed: list[int]) -> None:
        import codecs

        self.table = table
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Prime with the resumed tokens' bytes without emitting them (a character split at the resume point).
        self.decoder.decode(b"".join(table[t] for t in primed))

    def push(self, tokens: list[int], final: bool = False) -> str:
        return self.decoder.decode(b"".join(self.table[t] for t in tokens), final=final)


class Detokenizer:
    """Incremental text of one request (protocol §6.2): held back while the decoded tail is an incomplete character.

    Decodes a sliding window (from the token before the last emitted text) so each step costs O(window), not O(n).
    """

    def __init__(self, decode, primed: list[int]) -> None:
        self.decode = decode
        #: Non-end-of-generation tokens so far (resumed ones included).
        self.ids: list[int] = list(primed)
        #: Start of the decoding window.
        self.prefix = max(0, len(self.ids) - 6)
        #: End of the text already emitted (tokens before it were emitted, up to a held-back partial character).
        self.read = len(self.ids)

    def push(self, tokens: list[int], final: bool = False) -> str:
        self.ids.extend(tokens)
        if len(self.ids) == self.read and not final:
            return ""
        done = self.decode(self.ids[self.prefix:self.read]).rstrip("\ufffd") if self.read > self.prefix else ""
        full = self.decode(self.ids[self.prefix:])
        if full.endswith("\ufffd") and not final:
            return ""
        delta = full[len(done):] if full.startswith(done) else full[len(done):]
        self.prefix, self.read = self.read, len(self.ids)
        return delta


# ---------------------------------------------------------------------------------------------------------------
# Requests.

@dataclass
class Request:
    """One request the gateway added; it lives here until its finish is emitted."""

    #: Gateway id.
    id: str
    #: Prompt token ids (as tokenized here; without resumed tokens).
    prompt: list[int]
    #: Tokens generated on earlier engines (resume); prefilled after the prompt.
    resumed: list[int]
    params: dict
    #: When the add arrived (monotonic seconds), for queueMs.
    arrived: float
    #: `waiting` (in our queue, not yet in OpenVINO) or `running` (added to OpenVINO; `handle` set).
    phase: str = "waiting"
    #: OpenVINO's GenerationHandle; kept alive while running (dropping the last reference stops the request).
    handle: Any = None
    #: Tokens this engine generated.
    produced: list[int] = field(default_factory=list)
    #: Streaming text state.
    detok: Optional[Detokenizer] = None
    #: The last finish reason OpenVINO reported (NONE until the end).
    last_reason: str = "NONE"
    #: True once the request sampled a token since it was (re)scheduled: a decode that then yields nothing was preempted.
    decoding: bool = False
    #: Prefill tokens not yet computed (estimate, for batchTokens).
    prefill_left: int = 0
    #: OpenVINO's GenerationConfig, built and validated at add.
    gen_config: Any = None
    #: Tokens this engine may generate for the request (max_tokens less resumed ones, or up to the capacity).
    max_new: int = 0
    #: Times OpenVINO dropped the request (IGNORED) and the loop re-added it with what it had generated.
    requeues: int = 0

    @property
    def input_len(self) -> int:
        return len(self.prompt) + len(self.resumed)


class Inbox:
    """What the gateway sent, read by the loop itself between steps (no reader thread: a thread would get the GIL only
    between steps anyway, and on a loaded host it could lag many steps behind, delaying aborts). Pings are answered
    as soon as they are read; everything else is returned in arrival order."""

    def __init__(self, fd: int, engine: "Engine") -> None:
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


# ---------------------------------------------------------------------------------------------------------------
# The engine.

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
            pool_tokens = int(cfg["maxModelLen"]) * int(cfg["maxNumSeqs"])
        # Whole blocks: a GB budget is never exceeded (floor), the default pool always holds its sequences (ceil).
        self.kv_blocks = max(2, pool_tokens // self.block if cfg.get("cacheGb") and not cfg.get("kvBlocks") else -(-pool_tokens // self.block))
        self.pool_tokens = self.kv_blocks * self.block
        sc = ov_genai.SchedulerConfig()
        sc.num_kv_blocks = self.kv_blocks
        sc.max_num_seqs = int(cfg["maxNumSeqs"])
        sc.max_num_batched_tokens = int(cfg["maxNumBatchedTokens"])
        # Split-fuse off when the gateway caps prompts at one step (maxPromptLen), as OVMS's --dynamic_split_fuse false.
        sc.dynamic_split_fuse = cfg.get("maxPromptLen") is None
        prefix, why = prefix_caching_for(cfg, load_path)
        if why:
            log("warn", why, event="hybrid_model")
        sc.enable_prefix_caching = prefix
        tok_props = {"enable_save_ov_model": True} if props.get("enable_save_ov_model") else {}
        try:
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
        bos = self.tok.get_bos_token_id()
        probe_plain = list(self.tok.encode("a", add_special_tokens=False).input_ids.data[0])
        probe_special = list(self.tok.encode("a", add_special_tokens=True).input_ids.data[0])
        #: The BOS id the tokenizer prepends, or None.
        self.bos = bos if bos >= 0 and len(probe_special) > len(probe_plain) and probe_special[0] == bos else None
        self.vocab = int(self.meta["vocabSize"])
        #: Bytes of every token (byte-level GGUF vocabularies), else None: text then comes from OpenVINO's detokenizer.
        self.token_bytes = token_bytes_table(cfg["modelPath"])
        self.max_len = int(cfg["maxModelLen"])

        # Loop state.
        #: Live requests by gateway id (waiting and running).
        self.requests: dict[str, Request] = {}
        #: Waiting requests in arrival order.
        self.waiting: list[Request] = []
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
        self.faults = json.loads(os.environ["KEEL_FAULT_INJECTION"]) if os.environ.get("KEEL_FAULT_INJECTION") else None
        self.first_generation = int(cfg.get("generation", 1)) == 1
        self.fired: set[str] = set()

    # -- helpers ------------------------------------------------------------------------------------------------

    def emit(self, msg: dict) -> None:
        if self.channel:
            self.channel.send({"v": V, **msg})

    def tokenize(self, text: str, special: bool) -> list[int]:
        ids = [int(t) for t in self.tok.encode(text, add_special_tokens=False).input_ids.data[0]]
        if special and self.bos is not None and (not ids or ids[0] != self.bos):
            ids.insert(0, self.bos)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False) if ids else ""

    def capabilities(self) -> dict:
        return {
            "exactSeededResume": False,  # OpenVINO seeds a request's RNG once; a resumed sampled stream re-draws
            "maxTopLogprobs": 0,  # the sampled token's log-probability only
            "extendedSampling": False,  # no logit_bias
            "samplingFields": SAMPLING_FIELDS,
            "grammars": False,  # Keel's guides (GBNF phases with triggers) have no OpenVINO equivalent yet
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

    def refuse(self, rid: str, code: str, message: str) -> None:
        self.emit({"type": "request_error", "id": rid, "code": code, "message": message})

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
            c.rng_seed = int(p["seed"])
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
        return c

    def apply_add(self, m: dict) -> None:
        rid = m["id"]
        if rid in self.requests:
            return self.refuse(rid, "duplicate_id", f"request id {rid} is already live")
        p = m["params"]
        unsupported = [k for k in ("logitBias",) if k in p]
        if unsupported:
            return self.refuse(rid, "invalid_params", "the OpenVINO engine does not apply logitBias (OpenVINO GenAI has no logit bias)")
        if p.get("guide") is not None:
            return self.refuse(rid, "invalid_params", "this engine does not apply guides (capabilities.grammars is false)")
        if p.get("logprobs") is not None and p["logprobs"] > 0:
            return self.refuse(rid, "invalid_params", f"logprobs {p['logprobs']} exceeds the engine's maximum of 0 (OpenVINO GenAI reports the sampled token's log-probability only)")
        bad = next((t for t in p.get("stopTokenIds") or [] if t >= self.vocab), None)
        if bad is not None:
            return self.refuse(rid, "invalid_params", f"stopTokenIds token {bad} is outside the vocabulary ({self.vocab})")
        try:
            prompt = self.tokenize(m["prompt"]["text"], True) if "text" in m["prompt"] else list(m["prompt"]["tokens"])
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
        except Exception as err:  # noqa: BLE001
            return self.refuse(rid, "invalid_params", f"OpenVINO GenAI refuses these sampling parameters: {err}")
        silent = lambda t: t in self.eog  # noqa: E731
        primed = [t for t in resumed if not silent(t)]
        req.detok = ByteDetokenizer(self.token_bytes, primed) if self.token_bytes else Detokenizer(self.decode, primed)
        self.requests[rid] = req
        self.waiting.append(req)

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

    def fits(self, req: Request) -> bool:
        """Whether the pool holds every admitted request's current tokens and `req`'s prompt (admission rule)."""
        held = sum(self.blocks_for(r.input_len + len(r.produced)) for r in [*self.running.values(), *self.releasing])
        return held + self.blocks_for(req.input_len) <= self.kv_blocks

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

    def fault(self, kind: str, step: int) -> bool:
        f = self.faults
        if not f:
            return False
        key = {"crash": "crashAtStep", "throw": "throwAtStep", "hang": "hangAtStep", "ignore": "ignoreAtStep"}[kind]
        if self.first_generation and f.get(key) == step and kind not in self.fired:
            self.fired.add(kind)
            log("warn", "fault injected", fault=kind, step=step)
            return True
        return False

    def prompt_has(self, marker: Optional[str]) -> bool:
        if not marker:
            return False
        return any(marker in self.decode(r.prompt) for r in self.running.values())

    def run(self) -> None:
        while True:
            # 1. Take what arrived; block only while there is nothing to do.
            idle = not self.requests and not self.releasing
            for item in self.inbox.take(block=idle):
                kind = item[0]
                if kind == "eof":
                    return  # the gateway is gone: nobody can read our output
                if kind == "shutdown":
                    self.stopping = True
                elif kind == "refuse":
                    self.refuse(item[1], "invalid_params", item[2])
                elif kind == "tokenize":
                    m = item[1]
                    try:
                        self.emit({"type": "tokenized", "id": m["id"], "tokens": self.tokenize(m["text"], m["addSpecialTokens"])})
                    except Exception as err:  # noqa: BLE001
                        self.emit({"type": "tokenized", "id": m["id"], "error": str(err)})
                elif kind == "add":
                    self.apply_add(item[1])
                elif kind == "abort":
                    for rid in item[1]["ids"]:
                        if rid in self.requests:
                            self.abort_arrived.setdefault(rid, self.steps)
            if self.stopping:
                return
            outputs: dict = {}
            # 2. Aborts: a waiting request leaves at once; a running one is stopped in OpenVINO (freed at its next
            #    step) and its finish is reported now; OpenVINO never mentions it to us again (we drop the handle).
            for rid in list(self.abort_arrived):
                req = self.requests.get(rid)
                if req is None:
                    self.abort_arrived.pop(rid, None)
                    continue
                if req.phase == "waiting":
                    self.waiting.remove(req)
                else:
                    req.handle.stop()
                    self.running = {k: r for k, r in self.running.items() if r is not req}
                    # OpenVINO frees a stopped request's blocks only at the end of its next step(): until then they
                    # count as held (admitting into them can leave nothing schedulable: requests IGNORED).
                    self.releasing.append(req)
                self.finish(req, "abort", self.output_for(outputs, rid))
            # 3. Admit while fewer than maxNumSeqs run and the pool holds what every admitted request has now plus the
            #    new prompt (a block of headroom each). OpenVINO prefills several prompts chunk by chunk without
            #    reserving their blocks: prompts that do not fit together fill the pool half-prefilled, nothing can be
            #    scheduled, and OpenVINO turns requests IGNORED (seen with 4 prompts of 13 blocks in a 16-block pool).
            #    Growth while decoding may still overrun the pool: that is what OpenVINO's preemption handles.
            while self.waiting and len(self.running) < int(self.cfg["maxNumSeqs"]) and self.fits(self.waiting[0]):
                req = self.waiting.pop(0)
                import numpy as np
                import openvino as ov

                # A re-added request (after IGNORED) continues from what it generated: its tokens are prefilled.
                ids = req.prompt + req.resumed + req.produced
                tensor = ov.Tensor(np.array([ids], dtype=np.int64))
                ov_id = self.next_ov_id
                self.next_ov_id += 1
                try:
                    if req.requeues:
                        req.gen_config = self.generation_config(req, req.max_new - len(req.produced))
                    req.handle = self.pipe.add_request(ov_id, tensor, req.gen_config)
                except Exception as err:  # noqa: BLE001 - raised before anything is queued (research §1)
                    if req.requeues:
                        self.finish(req, "error", self.output_for(outputs, req.id), {"code": "engine_error", "message": f"OpenVINO GenAI refused to continue the request: {err}"})
                    else:
                        self.requests.pop(req.id, None)
                        self.refuse(req.id, "invalid_params", f"OpenVINO GenAI refused the request: {err}")
                    continue
                req.phase = "running"
                req.prefill_left = len(ids)
                self.running[ov_id] = req
                if req.requeues:
                    continue  # admitted once, when it first entered OpenVINO
                self.output_for(outputs, req.id)["admitted"] = {
                    "promptTokens": req.prompt,
                    "cachedTokens": 0,
                    "queueMs": round((time.monotonic() - req.arrived) * 1000, 3),
                }
            # 4. One OpenVINO step. Any exception is fatal: the pipeline's state is unknown after it (research §5).
            batch_tokens = 0
            if (self.running or self.releasing) and self.pipe.has_non_finished_requests():
                step = self.steps + 1
                if self.fault("crash", step) or (self.faults and self.prompt_has(self.faults.get("crashOnPrompt"))):
                    log("warn", "fault injected", fault="crash", step=step)
                    os.abort()
                if self.fault("hang", step):
                    threading.Event().wait()
                try:
                    if self.fault("throw", step):
                        raise RuntimeError(f"injected failure at step {step}")
                    self.pipe.step()
                except Exception as err:  # noqa: BLE001
                    self.emit({"type": "fatal", "message": f"OpenVINO step() failed: {err}"})
                    log("fatal", f"OpenVINO step() failed; exiting so the gateway resumes every request on a fresh engine: {err}", event="step_failed")
                    os._exit(1)
                metrics = self.pipe.get_metrics()
                # That step freed the requests stopped before it.
                self.releasing.clear()
                # 5. Read every running handle (read() blocks when empty: can_read first).
                decoded = 0
                for ov_id, req in list(self.running.items()):
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
                    if status == "RUNNING" and self.fault("ignore", self.steps + 1):
                        # Test-only: handle this request as OpenVINO's out-of-memory path would (docs/fault-injection.md).
                        h.stop()
                        self.releasing.append(req)
                        status = "IGNORED"
                    cut = self.stop_cut(req, got)
                    if cut is not None:
                        # A stop token ends the request also under ignoreEos, which OpenVINO applies to every stop
                        # id: the loop ends it itself (OpenVINO bans stop ids before min_new_tokens, so a stop
                        # token here is past minTokens) and drops what OpenVINO generated after it.
                        got, logprobs = got[:cut], logprobs[:cut]
                        h.stop()
                        self.releasing.append(req)
                        status, req.last_reason = "FINISHED", "STOP"
                    if got:
                        decoded += len(got)
                        req.produced.extend(got)
                        req.decoding = True
                        req.prefill_left = 0
                        out = self.output_for(outputs, req.id)
                        out["tokens"].extend(got)
                        # End-of-generation tokens and the stop token that ended the request add no text (§6.1).
                        speaking = got[:-1] if cut is not None else got
                        out["text"] += req.detok.push([t for t in speaking if t not in self.eog])
                        if req.params.get("logprobs") is not None:
                            out["logprobs"] = [self.position_logprob(t, lp) for t, lp in zip(got, logprobs)]
                    elif req.decoding and status == "RUNNING":
                        # A request that was decoding got no token: OpenVINO preempted it (its KV went to others).
                        req.decoding = False
                        self.preemptions += 1
                    if status == "FINISHED":
                        out = self.output_for(outputs, req.id)
                        reason = "length" if req.last_reason == "LENGTH" else "stop"
                        out["text"] += req.detok.push([], final=True)
                        del self.running[ov_id]
                        self.finish(req, reason, out)
                    elif status == "IGNORED" and req.requeues < MAX_REQUEUES:
                        # OpenVINO dropped it (its out-of-memory path; it freed its blocks). The pipeline itself is
                        # fine: re-add it first in line with what it generated, like a preemption, so the stream goes
                        # on (greedy: token-identical) and nobody else is disturbed. Never a silent empty answer.
                        del self.running[ov_id]
                        req.handle, req.phase, req.decoding = None, "waiting", False
                        req.requeues += 1
                        self.waiting.insert(0, req)
                        self.preemptions += 1
                        log("warn", "OpenVINO dropped a request (IGNORED: out of KV cache); re-added with its generated tokens", event="ignored_requeued", request=req.id, generated=len(req.produced), requeues=req.requeues)
                    elif status == "IGNORED":
                        # Dropped again and again: treat it as an engine fault. Exit so that the gateway resumes every
                        # request on a fresh engine (its bisection isolates a request that keeps doing this).
                        self.emit({"type": "fatal", "message": f"OpenVINO dropped request {req.id} {MAX_REQUEUES + 1} times (IGNORED: out of KV cache)"})
                        log("fatal", "OpenVINO keeps turning a request IGNORED (out of KV cache); exiting so that the gateway resumes every request", event="ignored", request=req.id)
                        os._exit(1)
                # Prefill estimate: the step's budget after decodes goes to prefilling requests in admission order.
                budget = max(0, int(self.cfg["maxNumBatchedTokens"]) - decoded)
                prefill = 0
                for req in self.running.values():
                    if req.prefill_left and budget:
                        take = min(req.prefill_left, budget)
                        req.prefill_left -= take
                        budget -= take
                        prefill += take
                batch_tokens = decoded + prefill if metrics.scheduled_requests > 0 else decoded
                if batch_tokens > 0:
                    self.steps += 1
                self.last_usage = float(metrics.cache_usage)
            if not outputs and batch_tokens == 0:
                continue
            usage = getattr(self, "last_usage", 0.0)
            self.emit({
                "type": "step",
                "step": self.steps,
                "batchTokens": batch_tokens,
                "outputs": list(outputs.values()),
                "stats": {
                    "waiting": len(self.waiting),
                    "running": len(self.running),
                    "activeSequences": len(self.running),
                    "cachedSequences": 0,
                    "prefixCacheHitTokens": 0,
                    # OpenVINO reads its usage at schedule time, before the step frees finished requests: with
                    # nothing left in flight nothing is held (prefix-cache blocks count as free).
                    "kvTokensInUse": int(round(usage / 100 * self.pool_tokens)) if self.running or self.releasing else 0,
                    "preemptions": self.preemptions,
                },
            })


def main() -> None:
    started = time.monotonic()
    cfg = json.loads(sys.argv[-1])
    # OpenVINO prints to std::cout: keep a private stdout for the validate result and point fd 1 at stderr.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    serve = cfg.get("mode", "serve") == "serve"
    channel = Channel(3) if serve else None
    if channel:
        channel.send({"v": V, "type": "loading", "progress": 0})
    engine = Engine(cfg, channel)
    if not serve:
        os.write(result_fd, (json.dumps({"ok": True, "metadata": engine.meta, "backend": engine.backend()}) + "\n").encode("utf-8"))
        os._exit(0)
    engine.inbox = Inbox(3, engine)
    engine.emit({
        "type": "ready",
        "pid": os.getpid(),
        "model": engine.meta,
        "limits": {"maxNumSeqs": int(cfg["maxNumSeqs"]), "maxNumBatchedTokens": int(cfg["maxNumBatchedTokens"]), "maxModelLen": engine.max_len, "kvPoolTokens": engine.pool_tokens},
        "engine": f"{ENGINE_NAME}@{engine.ov.__version__.split('-')[0]}",
        "capabilities": engine.capabilities(),
        "backend": engine.backend(),
        "loadMs": round((time.monotonic() - started) * 1000),
    })
    log("info", "OpenVINO engine ready", event="ready", kvBlocks=engine.kv_blocks, blockTokens=engine.block, poolTokens=engine.pool_tokens, device=engine.device)
    engine.run()
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - last resort: report and exit non-zero (the gateway restarts us)
        log("fatal", f"engine failed: {err}")
        os._exit(1)
