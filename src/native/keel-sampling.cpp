// Keel's one extra native method: sample every sequence of a decoded step in ONE synchronous call.
//
// Why: node-llama-cpp's `AddonContext.sampleToken` is an AsyncWorker, so each sequence of each step costs a libuv
// worker hop plus an event-loop wake-up, and the calls must run one after another (llama.cpp's lazy output reorder
// is not thread-safe). The engine's main thread is idle while it samples anyway, so here the whole step is sampled
// on that thread, in order, with the same per-item steps as a plain (no probabilities) sampleToken: rebuild the
// sampler's chain if its config changed, sample at the item's batch logit index, take the selected id (or -1 when
// nothing was selected), and let the sampler accept it (penalty history, grammar state).
//
// JS signature (registered on the addon's exports by src/native/register.patch):
//   keelSampleTokens(context: AddonContext, logitIndices: Int32Array, samplers: AddonSampler[], out: Int32Array)
//     → undefined when every item succeeded, else an Array whose entry i is the error message of failed item i
//       (out[i] is then KEEL_SAMPLE_ERROR); other items are unaffected.
// Only public members of node-llama-cpp's classes are used (AddonContext::ctx, AddonSampler::rebuildChainIfNeeded /
// sample / acceptToken); the file is compiled into a Keel-built copy of node-llama-cpp's addon (scripts/build-native.mjs).
#include <exception>
#include <string>
#include <vector>

#include "napi.h"
#include "llama.h"
#include "AddonContext.h"
#include "AddonSampler.h"
#include "AddonGrammarEvaluationState.h"

namespace {

/** out[i] of an item whose sampling threw (its message is in the returned array). */
constexpr int32_t KEEL_SAMPLE_ERROR = -2;
/** out[i] of an item where the chain selected nothing (what sampleToken reports as -1). */
constexpr int32_t KEEL_SAMPLE_NONE = -1;

/** Items sampled by the greedy fast path and by the sampler's chain since the addon loaded (keelSamplingCounts). */
uint64_t fastSamples = 0;
uint64_t chainSamples = 0;

/**
 * Greedy without the candidate array: for a sampler whose chain is [logit bias] + greedy (temperature 0, no
 * repetition/DRY penalty, no XTC, no grammar) over the raw logits, the chain's pick is the first index of the maximum
 * of logits + biases. The chain would first copy the whole vocabulary into (id, logit, p) candidates — per sequence
 * per step the largest part of sampling (31 % of a 64-stream step on the H200). Same arithmetic as the chain: biases
 * added in the sampler's order to the token's logit, then the first strict maximum from index 0. False when the
 * sampler or the context is not of that shape (the caller uses the chain).
 */
bool sampleGreedyFast(AddonContext* context, AddonSampler* sampler, int32_t batchLogitIndex, llama_token& token) {
    if (sampler->greedySampler == nullptr || sampler->repeatPenaltySampler != nullptr || sampler->dryRepeatPenaltySampler != nullptr || sampler->xtcSampler != nullptr) return false;
    if (sampler->grammarEvaluationState != nullptr && sampler->grammarEvaluationState->sampler != nullptr) return false;
    // Backend sampling (llama.cpp's sampled candidates) gives the chain other candidates than the raw logits.
    if (llama_get_sampled_probs_ith(context->ctx, batchLogitIndex) != nullptr || llama_get_sampled_logits_ith(context->ctx, batchLogitIndex) != nullptr) return false;
    const float* logits = llama_get_logits_ith(context->ctx, batchLogitIndex);
    if (logits == nullptr) return false;
    const int32_t n = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(context->ctx)));
    if (n <= 0) return false;
    const float* values = logits;
    static thread_local std::vector<float> biased;
    if (sampler->tokenBiasSampler != nullptr && !sampler->tokenBiasSampler_biases.empty()) {
        biased.assign(logits, logits + n);
        for (const auto& lb : sampler->tokenBiasSampler_biases) {
            if (lb.token >= 0 && lb.token < n) biased[lb.token] += lb.bias;
        }
        values = biased.data();
    }
    // The chain's greedy compares each candidate with the selected one's logit; keeping that logit in a register is
    // the same comparison (strict: the first maximum wins; a NaN never wins, and a NaN first stays selected).
    int32_t selected = 0;
    float best = values[0];
    for (int32_t i = 1; i < n; i++) {
        if (values[i] > best) {
            best = values[i];
            selected = i;
        }
    }
    token = selected;
    return true;
}

/** Samples one item; returns the token id or KEEL_SAMPLE_NONE, throws on a sampler or accept failure. */
int32_t sampleOne(AddonContext* context, AddonSampler* sampler, int32_t batchLogitIndex) {
    // 1. A disposed sampler throws here ("Sampler is disposed"), before touching the logits.
    sampler->rebuildChainIfNeeded();
    llama_token fast;
    if (sampleGreedyFast(context, sampler, batchLogitIndex, fast)) {
        fastSamples++;
        sampler->acceptToken(fast);  // no penalty and no grammar here: keeps the sampler's bookkeeping as the chain path
        return fast;
    }
    chainSamples++;
    // 2. The sampler copies the logits of this batch index into its own candidate array and applies its chain.
    llama_token_data_array candidates;
    sampler->sample(context->ctx, batchLogitIndex, candidates, false);
    if (candidates.size == 0 || candidates.selected < 0 || candidates.selected >= (int64_t)candidates.size) {
        return KEEL_SAMPLE_NONE;
    }
    const llama_token token = candidates.data[candidates.selected].id;
    // 3. The sampler's own state (penalty window, grammar) moves on by the chosen token, as sampleToken does.
    try {
        sampler->acceptToken(token);
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string("Failed to accept token in sampler: ") + e.what());
    }
    return token;
}

Napi::Value keelSampleTokens(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 4 || !info[0].IsObject() || !info[1].IsTypedArray() || !info[2].IsArray() || !info[3].IsTypedArray()) {
        throw Napi::TypeError::New(env, "keelSampleTokens(context, logitIndices: Int32Array, samplers: AddonSampler[], out: Int32Array)");
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
    std::vector<std::pair<size_t, std::string>> failures;
    const bool hasLogits = llama_get_logits(context->ctx) != nullptr;
    for (size_t i = 0; i < count; i++) {
        if (!hasLogits) {
            out[i] = KEEL_SAMPLE_ERROR;
            failures.emplace_back(i, "This model does not support token generation");
            continue;
        }
        try {
            out[i] = sampleOne(context, samplers[i], indices[i]);
        } catch (const std::exception& e) {
            out[i] = KEEL_SAMPLE_ERROR;
            failures.emplace_back(i, e.what());
        } catch (...) {
            out[i] = KEEL_SAMPLE_ERROR;
            failures.emplace_back(i, "Unknown error while sampling");
        }
    }
    if (failures.empty()) return env.Undefined();
    Napi::Array messages = Napi::Array::New(env, count);
    for (const auto& failure : failures) messages.Set(static_cast<uint32_t>(failure.first), Napi::String::New(env, failure.second));
    return messages;
}

/**
 * keelDecodeBatch(context): decode the batch built with initBatch/addToBatch on the CALLING thread and wait for the
 * backend (what AddonContext.decodeBatch's AsyncWorker does on a libuv worker). For small batches (decode steps) the
 * worker hop and the event-loop wake-up that ends it cost as much as the decode of a small model; the engine's
 * main thread only waits meanwhile. Throws the same messages as decodeBatch when llama.cpp refuses the batch.
 */
Napi::Value keelDecodeBatch(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsObject()) throw Napi::TypeError::New(env, "keelDecodeBatch(context)");
    AddonContext* context = Napi::ObjectWrap<AddonContext>::Unwrap(info[0].As<Napi::Object>());
    if (context == nullptr || context->disposed || context->ctx == nullptr) throw Napi::Error::New(env, "keelDecodeBatch: the context is disposed");
    if (!context->has_batch) throw Napi::Error::New(env, "keelDecodeBatch: no batch (initBatch first)");
    int r;
    try {
        r = llama_decode(context->ctx, context->batch);
        if (r == 0) llama_synchronize(context->ctx);
    } catch (const std::exception& e) {
        throw Napi::Error::New(env, e.what());
    }
    if (r == 1) throw Napi::Error::New(env, "could not find a KV slot for the batch (try reducing the size of the batch or increase the context)");
    if (r != 0) throw Napi::Error::New(env, "Eval has failed");
    return env.Undefined();
}

/** keelSamplingCounts() → { fast, chain }: items each path sampled since load (tests check the fast path is taken). */
Napi::Value keelSamplingCounts(const Napi::CallbackInfo& info) {
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("fast", Napi::Number::New(info.Env(), static_cast<double>(fastSamples)));
    out.Set("chain", Napi::Number::New(info.Env(), static_cast<double>(chainSamples)));
    return out;
}

}  // namespace

/** Called from node-llama-cpp's registerCallback (addon.cpp, via register.patch). */
void keelRegisterSampling(Napi::Object exports) {
    exports.Set("keelSampleTokens", Napi::Function::New(exports.Env(), keelSampleTokens, "keelSampleTokens"));
    exports.Set("keelDecodeBatch", Napi::Function::New(exports.Env(), keelDecodeBatch, "keelDecodeBatch"));
    exports.Set("keelSamplingCounts", Napi::Function::New(exports.Env(), keelSamplingCounts, "keelSamplingCounts"));
}
