// Keel's one extra native method: sample every sequence of a decoded step in ONE synchronous call.
//
// Why: node-llama-cpp's `AddonContext.sampleToken` is an AsyncWorker, so each sequence of each step costs a libuv
// worker hop plus an event-loop wake-up, and the calls must run one after another (llama.cpp's lazy output reorder
// is not thread-safe). Here the whole step is sampled in one call, with the same per-item steps as a plain (no
// probabilities) sampleToken: rebuild the sampler's chain if its config changed, sample at the item's batch logit
// index, take the selected id (or -1 when nothing was selected), and let the sampler accept it (penalty history,
// grammar state). Greedy items take a fast path and sampled ones Keel's fused path (keel-fused-sampling.cpp), both
// exact replays of the chain without its full-vocabulary candidate array; those two paths touch no llama_context, so
// they run on a few threads (keel-sampling-pool.cpp) once the rows are resolved on the calling thread. The chain
// itself (and any sampler with a grammar) runs on the calling thread, in order.
//
// JS signature (registered on the addon's exports by src/native/register.patch):
//   keelSampleTokens(context: AddonContext, logitIndices: Int32Array, samplers: AddonSampler[], out: Int32Array,
//                    threads?: number)
//     → undefined when every item succeeded, else an Array whose entry i is the error message of failed item i
//       (out[i] is then KEEL_SAMPLE_ERROR); other items are unaffected. `threads` (default 1): the most threads
//       (the calling one included) that sample the step; the items of one sampler are always sampled in order.
// Only public members of node-llama-cpp's classes are used (AddonContext::ctx, AddonSampler's fields and
// rebuildChainIfNeeded / sample / acceptToken); the files are compiled into a Keel-built copy of node-llama-cpp's
// addon (scripts/build-native.mjs).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "napi.h"
#include "llama.h"
#include "AddonContext.h"
#include "AddonSampler.h"
#include "AddonGrammarEvaluationState.h"

/** keel-fused-sampling.cpp: the chain's pick for a sampled (temperature > 0) sampler without the full candidate array. */
bool keelSampleFused(const float* logits, int32_t n, AddonSampler* sampler, llama_token& token);
/** keel-fused-sampling.cpp: the first index of the row's maximum (SSE2); false when the row holds a NaN. */
bool keelFirstMax(const float* values, int32_t n, int32_t& index);
/** keel-sampling-pool.cpp: fn(0..jobs-1) over the calling thread and up to threads-1 pool threads. */
void keelParallelFor(unsigned threads, size_t jobs, const std::function<void(size_t)>& fn);
/** keel-grammar-utf8.cpp: mask the tokens that would make a guided item's output invalid UTF-8 out of its row. */
void keelMaskInvalidUtf8(AddonSampler* sampler, float* row, std::vector<std::pair<llama_token, float>>& saved);
/** keel-grammar-utf8.cpp: guided items masked, and those left unmasked (the grammar's layout did not check out). */
std::pair<uint64_t, uint64_t> keelUtf8MaskCounts();

namespace {

/** out[i] of an item whose sampling threw (its message is in the returned array). */
constexpr int32_t KEEL_SAMPLE_ERROR = -2;
/** out[i] of an item where the chain selected nothing (what sampleToken reports as -1). */
constexpr int32_t KEEL_SAMPLE_NONE = -1;

/** Items sampled by the greedy fast path, the fused path and the sampler's chain since the addon loaded (keelSamplingCounts). */
std::atomic<uint64_t> fastSamples{0};
std::atomic<uint64_t> fusedSamples{0};
std::atomic<uint64_t> chainSamples{0};
/** Whether sampled items try the fused path (keelSamplingOptions({ fused }); off only for A/B measurements and tests). */
bool fusedEnabled = true;
/** Whether contexts created from now on share one KV buffer across their sequences (keelContextOptions({ kvUnified })). */
bool kvUnifiedEnabled = false;

/**
 * The chain's greedy pick over `values`: it compares each candidate with the selected one's logit, so the first strict
 * maximum wins. Without NaN that is the first index holding the maximum (found vectorized); with one, the scalar scan
 * (a NaN never wins, and a NaN first stays selected).
 */
static int32_t firstMaximum(const float* values, int32_t n) {
    int32_t first;
    if (keelFirstMax(values, n, first)) return first;
    int32_t selected = 0;
    float best = values[0];
    for (int32_t i = 1; i < n; i++) {
        if (values[i] > best) {
            best = values[i];
            selected = i;
        }
    }
    return selected;
}

/**
 * Greedy without the candidate array: for a sampler whose chain is [logit bias] + greedy (temperature 0, no
 * repetition/DRY penalty, no XTC, no grammar) over the raw logits, the chain's pick is the first index of the maximum
 * of logits + biases. The chain would first copy the whole vocabulary into (id, logit, p) candidates — per sequence
 * per step the largest part of sampling (31 % of a 64-stream step on the H200). Same arithmetic as the chain: biases
 * added in the sampler's order to the token's logit, then the first strict maximum from index 0. False when the
 * sampler is not of that shape or there is no row (the caller uses the chain). Touches no llama_context.
 */
bool sampleGreedyFast(const float* logits, int32_t n, AddonSampler* sampler, llama_token& token) {
    if (sampler->greedySampler == nullptr || sampler->repeatPenaltySampler != nullptr || sampler->dryRepeatPenaltySampler != nullptr || sampler->xtcSampler != nullptr) return false;
    if (sampler->grammarEvaluationState != nullptr && sampler->grammarEvaluationState->sampler != nullptr) return false;
    if (logits == nullptr || n <= 0) return false;
    // The biases go onto the row itself and come off again after the scan: copying the whole row first cost more than
    // the scan (144 µs a sample on a 128 K vocabulary on the H200 host, most of a one-stream step's host work). The row
    // belongs to this item alone (one batch logit index per item), and each saved original is written back in reverse
    // order, so a token biased twice gets its first original and the row is bit-identical afterwards.
    static thread_local std::vector<std::pair<int32_t, float>> saved;
    saved.clear();
    float* row = const_cast<float*>(logits);
    if (sampler->tokenBiasSampler != nullptr) {
        for (const auto& lb : sampler->tokenBiasSampler_biases) {
            if (lb.token < 0 || lb.token >= n) continue;
            saved.emplace_back(lb.token, row[lb.token]);
            row[lb.token] += lb.bias;
        }
    }
    token = firstMaximum(row, n);
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) row[it->first] = it->second;
    return true;
}

/**
 * One item by the greedy fast path or the fused path, without the chain: true with the token (or KEEL_SAMPLE_NONE)
 * when one applied, false when the item needs the chain (nothing drawn, nothing accepted). Safe on a sampling thread
 * (per-sampler state only; the row was resolved on the engine's thread). Throws when accepting the token fails.
 */
bool sampleWithoutChain(const float* logits, int32_t n, AddonSampler* sampler, int32_t& out) {
    llama_token token;
    if (sampleGreedyFast(logits, n, sampler, token)) {
        fastSamples.fetch_add(1, std::memory_order_relaxed);
    } else if (fusedEnabled && keelSampleFused(logits, n, sampler, token)) {
        fusedSamples.fetch_add(1, std::memory_order_relaxed);
        if (token < 0) {
            out = KEEL_SAMPLE_NONE;
            return true;
        }
    } else {
        return false;
    }
    sampler->acceptToken(token);  // no grammar on these paths: only the penalty window moves on, as after the chain
    out = token;
    return true;
}

/** The row of a batch logit index for the paths without the chain; null when backend sampling replaced it. */
const float* rowOf(llama_context* ctx, int32_t batchLogitIndex) {
    // Backend sampling (llama.cpp's sampled candidates) gives the chain other candidates than the raw logits.
    if (llama_get_sampled_probs_ith(ctx, batchLogitIndex) != nullptr || llama_get_sampled_logits_ith(ctx, batchLogitIndex) != nullptr) return nullptr;
    return llama_get_logits_ith(ctx, batchLogitIndex);
}

/** A logit row with entries masked for one sample; puts them back when restored or left (also on an exception). */
struct MaskedRow {
    /** The row, or null when nothing was masked. */
    float* row;
    /** Masked entries and their logits. */
    std::vector<std::pair<llama_token, float>> saved;
    void restore() {
        for (const auto& [t, logit] : saved) row[t] = logit;
        saved.clear();
    }
    ~MaskedRow() { restore(); }
};

/** Samples one item on the engine's thread, the chain when needed; returns the token id or KEEL_SAMPLE_NONE, throws on failure. */
int32_t sampleOne(AddonContext* context, AddonSampler* sampler, int32_t batchLogitIndex, int32_t n) {
    // 1. A disposed sampler throws here ("Sampler is disposed"), before touching the logits.
    sampler->rebuildChainIfNeeded();
    int32_t quick;
    if (sampleWithoutChain(rowOf(context->ctx, batchLogitIndex), n, sampler, quick)) return quick;
    chainSamples.fetch_add(1, std::memory_order_relaxed);
    // 2. Under a grammar, tokens no strict UTF-8 decoder accepts leave the row first (llama.cpp's grammar lets some
    //    through); the row is restored after sampling, so it stays the raw logits for log probabilities and retries.
    const bool guided = sampler->grammarEvaluationState != nullptr && sampler->grammarEvaluationState->sampler != nullptr;
    MaskedRow masked{guided && rowOf(context->ctx, batchLogitIndex) != nullptr ? llama_get_logits_ith(context->ctx, batchLogitIndex) : nullptr, {}};
    if (masked.row != nullptr) keelMaskInvalidUtf8(sampler, masked.row, masked.saved);
    // 3. The sampler copies the logits of this batch index into its own candidate array and applies its chain.
    llama_token_data_array candidates;
    sampler->sample(context->ctx, batchLogitIndex, candidates, false);
    masked.restore();
    if (candidates.size == 0 || candidates.selected < 0 || candidates.selected >= (int64_t)candidates.size) {
        return KEEL_SAMPLE_NONE;
    }
    const llama_token token = candidates.data[candidates.selected].id;
    // A pick whose logit is −∞ means the grammar, the bias and the UTF-8 check left nothing: llama.cpp still picks,
    // and its grammar may take the token without complaint (inside a character). Never accepted: the caller drops
    // the guide (or ends the request, when the client's bias did it).
    if (guided && std::isinf(candidates.data[candidates.selected].logit) && candidates.data[candidates.selected].logit < 0) {
        throw std::runtime_error("every token was masked by the grammar, the bias and the UTF-8 check");
    }
    // 4. The sampler's own state (penalty window, grammar) moves on by the chosen token, as sampleToken does.
    try {
        sampler->acceptToken(token);
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string("Failed to accept token in sampler: ") + e.what());
    }
    return token;
}

/** Where an item of a step stands while keelSampleTokens runs. */
enum class ItemState : uint8_t { Pending, Done, Failed };

Napi::Value keelSampleTokens(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 4 || !info[0].IsObject() || !info[1].IsTypedArray() || !info[2].IsArray() || !info[3].IsTypedArray()) {
        throw Napi::TypeError::New(env, "keelSampleTokens(context, logitIndices: Int32Array, samplers: AddonSampler[], out: Int32Array, threads?: number)");
    }
    AddonContext* context = Napi::ObjectWrap<AddonContext>::Unwrap(info[0].As<Napi::Object>());
    Napi::TypedArray indicesArray = info[1].As<Napi::TypedArray>();
    Napi::TypedArray outArray = info[3].As<Napi::TypedArray>();
    if (indicesArray.TypedArrayType() != napi_int32_array || outArray.TypedArrayType() != napi_int32_array) {
        throw Napi::TypeError::New(env, "keelSampleTokens: logitIndices and out must be Int32Array");
    }
    Napi::Int32Array indices = indicesArray.As<Napi::Int32Array>();
    Napi::Int32Array out = outArray.As<Napi::Int32Array>();
    Napi::Array samplerObjects = info[2].As<Napi::Array>();
    const size_t count = indices.ElementLength();
    if (samplerObjects.Length() != count || out.ElementLength() != count) {
        throw Napi::RangeError::New(env, "keelSampleTokens: logitIndices, samplers and out must have the same length");
    }
    if (context == nullptr || context->disposed || context->ctx == nullptr) {
        throw Napi::Error::New(env, "keelSampleTokens: the context is disposed");
    }
    const unsigned threads = info.Length() >= 5 && info[4].IsNumber() ? std::max(1, std::min(64, info[4].As<Napi::Number>().Int32Value())) : 1;

    // Unwrap every sampler first (a JS-level type error refuses the whole call before anything is sampled).
    std::vector<AddonSampler*> samplers(count);
    for (size_t i = 0; i < count; i++) {
        Napi::Value value = samplerObjects.Get(static_cast<uint32_t>(i));
        if (!value.IsObject()) {
            throw Napi::TypeError::New(env, "keelSampleTokens: samplers[" + std::to_string(i) + "] is not an AddonSampler");
        }
        samplers[i] = Napi::ObjectWrap<AddonSampler>::Unwrap(value.As<Napi::Object>());
    }

    // Per-item failures are collected, not thrown: the other items of the step keep their tokens.
    std::vector<ItemState> state(count, ItemState::Pending);
    std::vector<std::string> errors(count);
    std::vector<int32_t> tokens(count, KEEL_SAMPLE_NONE);
    std::vector<const float*> rows(count, nullptr);
    const int32_t n = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(context->ctx)));
    const bool hasLogits = llama_get_logits(context->ctx) != nullptr;
    auto fail = [&](size_t i, std::string message) {
        state[i] = ItemState::Failed;
        errors[i] = std::move(message);
    };
    // 1. On this thread: everything that touches the context or JS-visible state — the chains (a disposed sampler
    //    throws), the rows (llama.cpp's lazy output reorder and synchronize are not thread-safe).
    for (size_t i = 0; i < count; i++) {
        if (!hasLogits) {
            fail(i, "This model does not support token generation");
            continue;
        }
        try {
            samplers[i]->rebuildChainIfNeeded();
            rows[i] = rowOf(context->ctx, indices[i]);
        } catch (const std::exception& e) {
            fail(i, e.what());
        }
    }
    // 2. On the sampling threads: the greedy and fused paths, one job per sampler (its items in order, since each
    //    sample moves its penalty window and RNG on). A sampler under a grammar stays on this thread (step 3), and so
    //    does the rest of a job from its first item that needs the chain.
    std::vector<std::vector<size_t>> jobs;
    {
        std::unordered_map<AddonSampler*, size_t> jobOf;
        for (size_t i = 0; i < count; i++) {
            AddonSampler* s = samplers[i];
            if (state[i] != ItemState::Pending || (s->grammarEvaluationState != nullptr && s->grammarEvaluationState->sampler != nullptr)) continue;
            auto found = jobOf.emplace(s, jobs.size());
            if (found.second) jobs.emplace_back();
            jobs[found.first->second].push_back(i);
        }
    }
    // Waking a thread costs about as much as sampling a small vocabulary once: at least two jobs per thread.
    const unsigned useThreads = static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(1, jobs.size() / 2)));
    keelParallelFor(useThreads, jobs.size(), [&](size_t j) {
        for (size_t i : jobs[j]) {
            if (state[i] != ItemState::Pending) continue;
            try {
                if (!sampleWithoutChain(rows[i], n, samplers[i], tokens[i])) return;  // the chain, on this thread, from here
                state[i] = ItemState::Done;
            } catch (const std::exception& e) {
                fail(i, std::string("Failed to accept token in sampler: ") + e.what());
            } catch (...) {
                fail(i, "Unknown error while sampling");
            }
        }
    });
    // 3. On this thread, in order: what is left (grammar samplers, items that need the chain).
    for (size_t i = 0; i < count; i++) {
        if (state[i] != ItemState::Pending) continue;
        try {
            tokens[i] = sampleOne(context, samplers[i], indices[i], n);
            state[i] = ItemState::Done;
        } catch (const std::exception& e) {
            fail(i, e.what());
        } catch (...) {
            fail(i, "Unknown error while sampling");
        }
    }
    bool failed = false;
    for (size_t i = 0; i < count; i++) {
        out[i] = state[i] == ItemState::Failed ? KEEL_SAMPLE_ERROR : tokens[i];
        failed = failed || state[i] == ItemState::Failed;
    }
    if (!failed) return env.Undefined();
    Napi::Array messages = Napi::Array::New(env, count);
    for (size_t i = 0; i < count; i++) {
        if (state[i] == ItemState::Failed) messages.Set(static_cast<uint32_t>(i), Napi::String::New(env, errors[i]));
    }
    return messages;
}

/**
 * keelDecodeBatch(context): decode the batch built with initBatch/addToBatch on the CALLING thread and wait for the
 * backend (what AddonContext.decodeBatch's AsyncWorker does on a libuv worker). For small batches (decode steps) the
 * worker hop and the event-loop wake-up that ends it cost as much as the decode of a small model; the engine's
 * main thread only waits meanwhile. Throws the same messages as decodeBatch when llama.cpp refuses the batch.
 * keelDecodeBatch(context, false) returns once llama.cpp has queued the work on its backend (a GPU computes on while
 * the caller does host work that touches no native state); keelSynchronize(context) then waits for it.
 */
Napi::Value keelDecodeBatch(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsObject()) throw Napi::TypeError::New(env, "keelDecodeBatch(context, wait = true)");
    const bool wait = info.Length() < 2 || !info[1].IsBoolean() || info[1].As<Napi::Boolean>().Value();
    AddonContext* context = Napi::ObjectWrap<AddonContext>::Unwrap(info[0].As<Napi::Object>());
    if (context == nullptr || context->disposed || context->ctx == nullptr) throw Napi::Error::New(env, "keelDecodeBatch: the context is disposed");
    if (!context->has_batch) throw Napi::Error::New(env, "keelDecodeBatch: no batch (initBatch first)");
    int r;
    try {
        r = llama_decode(context->ctx, context->batch);
        if (r == 0 && wait) llama_synchronize(context->ctx);
    } catch (const std::exception& e) {
        throw Napi::Error::New(env, e.what());
    }
    if (r == 1) throw Napi::Error::New(env, "could not find a KV slot for the batch (try reducing the size of the batch or increase the context)");
    if (r != 0) throw Napi::Error::New(env, "Eval has failed");
    return env.Undefined();
}

/** keelSynchronize(context): wait for the decode keelDecodeBatch(context, false) queued. */
Napi::Value keelSynchronize(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsObject()) throw Napi::TypeError::New(env, "keelSynchronize(context)");
    AddonContext* context = Napi::ObjectWrap<AddonContext>::Unwrap(info[0].As<Napi::Object>());
    if (context == nullptr || context->disposed || context->ctx == nullptr) throw Napi::Error::New(env, "keelSynchronize: the context is disposed");
    llama_synchronize(context->ctx);
    return env.Undefined();
}

/**
 * keelSamplingCounts() → { fast, fused, chain, utf8Masked, utf8Unchecked }: items each path sampled since load (tests
 * check which path is taken), guided items whose row lost its invalid-UTF-8 tokens, and guided items left unmasked.
 */
Napi::Value keelSamplingCounts(const Napi::CallbackInfo& info) {
    Napi::Object out = Napi::Object::New(info.Env());
    const auto [utf8Masked, utf8Unchecked] = keelUtf8MaskCounts();
    out.Set("utf8Masked", Napi::Number::New(info.Env(), static_cast<double>(utf8Masked)));
    out.Set("utf8Unchecked", Napi::Number::New(info.Env(), static_cast<double>(utf8Unchecked)));
    out.Set("fast", Napi::Number::New(info.Env(), static_cast<double>(fastSamples.load())));
    out.Set("fused", Napi::Number::New(info.Env(), static_cast<double>(fusedSamples.load())));
    out.Set("chain", Napi::Number::New(info.Env(), static_cast<double>(chainSamples.load())));
    return out;
}

/**
 * The JS side of process-wide switches: each boolean of the options object (the call's first argument) named in
 * `switches` sets that switch; returns every switch's value after the call (what `keelSamplingOptions` and
 * `keelContextOptions` answer).
 */
Napi::Value switchOptions(const Napi::CallbackInfo& info, std::initializer_list<std::pair<const char*, bool*>> switches) {
    Napi::Env env = info.Env();
    const bool given = info.Length() >= 1 && info[0].IsObject();
    Napi::Object out = Napi::Object::New(env);
    for (const auto& [name, value] : switches) {
        if (given && info[0].As<Napi::Object>().Has(name)) *value = info[0].As<Napi::Object>().Get(name).ToBoolean().Value();
        out.Set(name, Napi::Boolean::New(env, *value));
    }
    return out;
}

/**
 * keelSamplingOptions({ fused?: boolean }) → the options in force after the call. `fused: false` sends sampled items
 * through node-llama-cpp's chain (what the fused path replays): for A/B benchmarks and the equality tests.
 */
Napi::Value keelSamplingOptions(const Napi::CallbackInfo& info) {
    return switchOptions(info, {{"fused", &fusedEnabled}});
}

/**
 * keelContextOptions({ kvUnified?: boolean }) → the options in force after the call, for contexts created after it.
 * kvUnified: one KV buffer shared by every sequence (llama.cpp's kv_unified, llama-server's --kv-unified). Without
 * it llama.cpp keeps one stream per sequence and splits each batch into ubatches of consecutive sequences with equal
 * token counts, so a step that prefills several prompts of different lengths runs as many small graphs.
 */
Napi::Value keelContextOptions(const Napi::CallbackInfo& info) {
    return switchOptions(info, {{"kvUnified", &kvUnifiedEnabled}});
}

}  // namespace

/** register.patch: read by AddonContext's constructor, which sets llama_context_params.kv_unified from it. */
bool keelKvUnified() {
    return kvUnifiedEnabled;
}

/** Called from node-llama-cpp's registerCallback (addon.cpp, via register.patch). */
void keelRegisterSampling(Napi::Object exports) {
    exports.Set("keelSampleTokens", Napi::Function::New(exports.Env(), keelSampleTokens, "keelSampleTokens"));
    exports.Set("keelDecodeBatch", Napi::Function::New(exports.Env(), keelDecodeBatch, "keelDecodeBatch"));
    exports.Set("keelSynchronize", Napi::Function::New(exports.Env(), keelSynchronize, "keelSynchronize"));
    exports.Set("keelSamplingCounts", Napi::Function::New(exports.Env(), keelSamplingCounts, "keelSamplingCounts"));
    exports.Set("keelSamplingOptions", Napi::Function::New(exports.Env(), keelSamplingOptions, "keelSamplingOptions"));
    exports.Set("keelContextOptions", Napi::Function::New(exports.Env(), keelContextOptions, "keelContextOptions"));
}
