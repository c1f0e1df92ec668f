// eagle3_engine.cpp: the generation loop of eagle3_engine.h.
//
// Uses only llama.h and the shim's C ABI (eagle3_shim.h): the session's
// checks and draft/accept bookkeeping apply here exactly as from Python.

#include "eagle3_engine.h"
#include "draft_tuner.hpp"
#include "eagle3_sampling.hpp"
#include "shim_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using e3::clock_type;
using e3::draft_tuner;
using e3::fail;
using e3::seconds_since;

// internal: a decode stopped by e3_engine_cancel (not an error)
constexpr int E3_CANCELLED = 1;

// SplitMix64: independent, reproducible seeds for each request's stream
uint64_t mix_seed(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

struct sequence {
    int32_t seq_id = 0;
    int32_t * out = nullptr;
    int32_t n_out = 0;
    int32_t id_last = 0;
    int32_t n_past = 0;
    int32_t finish = E3_RUNNING;
    int32_t cap = 0;          // draft length cap of this sequence
    int32_t n_keep = 0;       // prompt tokens its KV cache kept (prefix reuse)
    std::unique_ptr<e3::seq_sampler> smpl;
    std::vector<e3::distribution> q;  // rejection verification: the draft's distribution at each drafted position
    size_t n_q = 0;                   // (of this round)
    float * out_lp = nullptr;         // logprobs: where emitted tokens' go
    int32_t * out_top_ids = nullptr;
    float * out_top_lp = nullptr;
    std::vector<float> lp, top_lp;    // logprobs of this round's tokens, until they are emitted
    std::vector<int32_t> top_ids;
    double t_draft = 0.0;             // this round's share of the draft call
    std::vector<e3_trace_round> trace;
    std::vector<int32_t> trace_tokens;  // n_draft_max per round
    std::vector<float> trace_p;
    std::string text;         // detokenized output, for stop strings
    e3::tally tally;          // this request's counters
    // this round
    bool live = false;
    bool drafted = false;
    int32_t draft_len = 0;
    const int32_t * draft = nullptr;
    int32_t row0 = 0;         // its first row in the verify batch
    std::vector<int32_t> accepted;  // the target's tokens at the verified rows, while they agree
};

}  // namespace

struct e3_engine {
    llama_context * ctx = nullptr;
    e3_spec * spec = nullptr;
    const llama_vocab * vocab = nullptr;
    int32_t n_vocab = 0;
    int32_t n_batch = 0;
    int32_t n_ctx_seq = 0;
    int32_t n_seq_limit = 0;   // sequences a generation may use
    int32_t n_draft_spec = 0;  // the session's n_draft_max
    int32_t n_min = 1;         // the session's n_min: shorter drafts are dropped
    llama_batch_ext * batch = nullptr;

    // the generation
    std::vector<sequence> seqs;
    int32_t max_new = 0;
    e3_sampling sampling{};
    std::vector<int32_t> stop_tokens;
    std::vector<std::string> stop_strings;
    int32_t n_draft = 0;
    bool adaptive = false;
    e3::tally total;
    clock_type::time_point t_start;

    uint64_t n_setups = 0;   // starts that went past the request's checks (and changed the contexts)
    draft_tuner tuner;       // adaptive: measured costs and acceptance, kept across generations
    int64_t n_adaptive = 0;  // adaptive generations so far
    int32_t best_cap = -1;   // adaptive: the tuner's draft length (-1: not decided yet)
    bool plain = false;      // adaptive chose plain decoding for the rest of this generation
    e3_cancel * cancel = nullptr;  // the target context's: set, it aborts the target's decodes

    // per sequence id: the tokens its target KV cache holds after the last generation, when
    // known, and whether the draft side followed all of them (prefix reuse)
    std::vector<std::vector<int32_t>> held;
    std::vector<char> known, in_step;

    void forget(int32_t seq) {
        held[seq].clear();
        known[seq] = 0;
        in_step[seq] = 0;
    }

    // after a failure or a cancel nothing is known of the generation's sequences
    void forget_generation() {
        for (const sequence & s : seqs) {
            forget(s.seq_id);
        }
    }

    bool rejection = false;  // rejection verification (temperature > 0 and asked for)
    int32_t n_logprobs = 0;
    bool tracing = false;
    double t_verify = 0.0;   // this round's target pass
    int failed = E3_OK;      // why sample_row() gave no token
    std::vector<int32_t> b_tok, b_pos, b_seq;  // the batch's entries, for e3_spec_process
    std::vector<int32_t> d_seq, d_past, d_last, d_cap, d_len, d_out, d_owner;  // draft requests
    char piece[256];

    bool drafting() const { return spec && !plain; }

    bool cancelled() const { return cancel && e3_cancel_get(cancel); }

    // every live sequence ends here, keeping its tokens
    void cancel_all() {
        for (sequence & s : seqs) {
            if (s.finish == E3_RUNNING) {
                finish(s, E3_FINISH_CANCELLED);
            }
        }
    }

    // -- the target batch ----------------------------------------------------

    void batch_clear() {
        llama_batch_ext_clear(batch);
        b_tok.clear();
        b_pos.clear();
        b_seq.clear();
    }

    int batch_add(int32_t seq, int32_t token, int32_t pos, bool output, e3_error * err) {
        const int32_t idx = llama_batch_ext_add_token(batch, seq, token);
        if (idx < 0) {
            return fail(err, E3_ERR_DECODE, "llama.cpp refused batch entry (token %d, sequence %d): code %d",
                        (int) token, (int) seq, (int) idx);
        }
        llama_batch_ext_set_pos(batch, idx, &pos);
        if (output) {
            llama_batch_ext_set_output_logits(batch, idx, true);
        }
        b_tok.push_back(token);
        b_pos.push_back(pos);
        b_seq.push_back(seq);
        return E3_OK;
    }

    int batch_decode(double & t_decode, e3_error * err) {
        const auto t0 = clock_type::now();
        const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
        t_decode += seconds_since(t0);
        if (rc == 2 && cancelled()) {
            return E3_CANCELLED;
        }
        if (rc != 0) {
            const char * why = rc == 1 ? "no KV cache slot" : rc == 2 ? "aborted" : "computation failed";
            return fail(err, E3_ERR_DECODE, "the target failed to decode a batch of %d tokens (code %d: %s)",
                        (int) b_tok.size(), (int) rc, why);
        }
        return E3_OK;
    }

    // hands the first n rows of the decoded batch to the session
    int batch_process(int32_t n, double & t_process, e3_error * err) {
        if (!drafting() || n <= 0) {
            return E3_OK;
        }
        const auto t0 = clock_type::now();
        const int rc = e3_spec_process(spec, n, b_tok.data(), b_pos.data(), b_seq.data(), err);
        t_process += seconds_since(t0);
        return rc != E3_OK && cancelled() ? E3_CANCELLED : rc;  // (a cancel also stops the draft side)
    }

    // the token at a verified row (k: the drafted position it verifies, -1 for none), or -1
    // (err and failed filled) when the row has no token to give
    int32_t sample_row(sequence & s, int32_t row, int32_t k, e3_error * err) {
        const auto t0 = clock_type::now();
        const float * logits = llama_get_logits_ith(ctx, row);
        if (!logits) {
            failed = fail(err, E3_ERR_DECODE, "the target returned no logits for batch row %d", (int) row);
            return -1;
        }
        const int32_t best = e3_logits_argmax(logits, n_vocab);
        if (best < 0) {
            // NaN or infinite weights (or activations that overflow) give rows with no
            // token to pick: greedy would return an arbitrary id as if it were the answer
            failed = fail(err, E3_ERR_DECODE, "the target's logits for sequence %d contain NaN or +inf (or are all "
                          "-inf): its weights are corrupt or its activations overflow", (int) s.seq_id);
            return -1;
        }
        e3::seq_sampler & smpl = *s.smpl;
        int32_t token;
        if (smpl.plain_greedy() && n_logprobs == 0) {
            token = best;
        } else {
            const e3::distribution & p = smpl.target(logits);
            if (p.size == 0) {
                failed = fail(err, E3_ERR_ARG, "the grammar allows no token for sequence %d after %d generated tokens",
                              (int) s.seq_id, (int) (s.n_out + (int32_t) s.lp.size()));
                return -1;
            }
            if (k >= 0 && (size_t) k < s.n_q) {
                token = smpl.verify(p, s.q[k], s.draft[k]);
            } else {
                token = smpl.greedy() ? p.argmax() : smpl.pick(p);
            }
            if (n_logprobs > 0) {
                keep_logprobs(s, p, token);
            }
        }
        smpl.accept(token);
        const double dt = seconds_since(t0);
        s.tally.c.t_sample_s += dt;
        total.c.t_sample_s += dt;
        return token;
    }

    // the token's log-probability and the n_logprobs most probable, until emit() writes them
    void keep_logprobs(sequence & s, const e3::distribution & p, int32_t token) {
        s.lp.push_back(std::log(p.prob(token)));
        std::vector<size_t> order(p.size);
        for (size_t i = 0; i < p.size; ++i) {
            order[i] = i;
        }
        const size_t n = std::min<size_t>(n_logprobs, p.size);
        std::partial_sort(order.begin(), order.begin() + n, order.end(),
                          [&](size_t a, size_t b) { return p.cand[a].p > p.cand[b].p; });
        for (int32_t j = 0; j < n_logprobs; ++j) {
            const bool have = (size_t) j < n;
            s.top_ids.push_back(have ? p.cand[order[j]].id : -1);
            s.top_lp.push_back(have ? std::log(p.cand[order[j]].p) : -INFINITY);
        }
    }

    void forget_logprobs(sequence & s) {
        s.lp.clear();
        s.top_ids.clear();
        s.top_lp.clear();
    }

    // appends one generated token; returns false once the sequence is done
    bool emit(sequence & s, int32_t token, size_t j) {
        if (n_logprobs > 0 && j < s.lp.size()) {
            s.out_lp[s.n_out] = s.lp[j];
            std::copy_n(s.top_ids.begin() + j * n_logprobs, n_logprobs, s.out_top_ids + (size_t) s.n_out * n_logprobs);
            std::copy_n(s.top_lp.begin() + j * n_logprobs, n_logprobs, s.out_top_lp + (size_t) s.n_out * n_logprobs);
        }
        s.out[s.n_out++] = token;
        s.tally.c.n_generated++;
        total.c.n_generated++;
        if (llama_vocab_is_eog(vocab, token) ||
            std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end()) {
            return finish(s, E3_FINISH_STOP);
        }
        if (!stop_strings.empty() && hits_stop_string(s, token)) {
            return finish(s, E3_FINISH_STOP);
        }
        if (s.n_out >= max_new) {
            return finish(s, E3_FINISH_LENGTH);
        }
        return true;
    }

    bool hits_stop_string(sequence & s, int32_t token) {
        const int32_t n = llama_token_to_piece(vocab, token, piece, sizeof(piece), 0, false);
        if (n <= 0) {
            return false;
        }
        const size_t from = s.text.size();
        s.text.append(piece, n);
        for (const auto & stop : stop_strings) {
            const size_t start = from >= stop.size() ? from - stop.size() + 1 : 0;
            if (s.text.find(stop, start) != std::string::npos) {
                return true;
            }
        }
        return false;
    }

    bool finish(sequence & s, int32_t reason) {
        s.finish = reason;
        s.tally.c.t_total_s = seconds_since(t_start);
        return false;
    }

    void record_round(sequence & s, int32_t n_acc) {
        s.trace.push_back({(int32_t) total.c.n_rounds - 1, s.draft_len, n_acc, s.t_draft, t_verify});
        const float * probs = s.drafted ? e3_spec_draft_probs(spec, s.seq_id) : nullptr;
        for (int32_t k = 0; k < std::max(n_draft_spec, 1); ++k) {
            const bool have = k < s.draft_len;
            s.trace_tokens.push_back(have ? s.draft[k] : -1);
            s.trace_p.push_back(have && probs ? probs[k] : NAN);
        }
    }

    int32_t draft_cap(const sequence & s) const {
        if (!drafting()) {
            return 0;
        }
        const int32_t room_ctx = n_ctx_seq - s.n_past - 1;  // positions n_past .. n_past + cap
        const int32_t room_out = max_new - s.n_out - 1;     // the round also yields one target token
        return std::max(0, std::min({s.cap, room_ctx, room_out}));
    }
};

// ---------------------------------------------------------------------------
// Starting a generation: check the request, reset the sequences, prefill
// ---------------------------------------------------------------------------

extern "C" int32_t e3_logits_argmax(const float * logits, int32_t n) {
    bool finite = true;
    int32_t best = 0;
    for (int32_t i = 0; i < n; ++i) {
        finite &= !std::isnan(logits[i]) && logits[i] != INFINITY;
        best = logits[i] > logits[best] ? i : best;
    }
    return finite && n > 0 && logits[best] > -INFINITY ? best : -1;
}

extern "C" e3_engine * e3_engine_create(llama_context * ctx_tgt, e3_spec * spec, e3_cancel * cancel,
                                        e3_error * err) {
    if (!ctx_tgt) {
        fail(err, E3_ERR_ARG, "no target context");
        return nullptr;
    }
    try {
        auto * e = new e3_engine;
        e->ctx = ctx_tgt;
        e->spec = spec;
        e->cancel = cancel;
        e->vocab = llama_model_get_vocab(llama_get_model(ctx_tgt));
        e->n_vocab = llama_vocab_n_tokens(e->vocab);
        e->n_batch = (int32_t) llama_n_batch(ctx_tgt);
        e->n_ctx_seq = (int32_t) llama_n_ctx_seq(ctx_tgt);
        e->n_seq_limit = (int32_t) llama_n_seq_max(ctx_tgt);
        if (spec) {
            e3_spec_info info{};
            e3_spec_get_info(spec, &info);
            e->n_seq_limit = info.n_seq;
            e->n_draft_spec = info.n_draft_max;
            e->n_min = std::max(info.n_min, 1);
        }
        e->held.assign(e->n_seq_limit, {});
        e->known.assign(e->n_seq_limit, 0);
        e->in_step.assign(e->n_seq_limit, 0);
        e->batch = llama_batch_ext_init(ctx_tgt);
        if (!e->batch) {
            delete e;
            fail(err, E3_ERR_INIT, "could not allocate a batch");
            return nullptr;
        }
        return e;
    } catch (const std::exception & ex) {
        fail(err, E3_ERR_EXCEPTION, "%s", ex.what());
    }
    return nullptr;
}

extern "C" void e3_engine_free(e3_engine * e) {
    if (!e) {
        return;
    }
    llama_batch_ext_free(e->batch);
    delete e;
}

static int check_sampling(const e3_sampling & s, e3_error * err) {
    if (!(s.temperature >= 0.0f && s.temperature <= 1e6f)) {
        return fail(err, E3_ERR_ARG, "temperature must be in [0.0, 1000000.0], got %g", (double) s.temperature);
    }
    if (s.top_k < 0) {
        return fail(err, E3_ERR_ARG, "top_k = %d must be >= 0 (0: off)", (int) s.top_k);
    }
    if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
        return fail(err, E3_ERR_ARG, "top_p must be in (0.0, 1.0], got %g", (double) s.top_p);
    }
    if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) {
        return fail(err, E3_ERR_ARG, "min_p must be in [0.0, 1.0], got %g", (double) s.min_p);
    }
    if (!(s.typical_p > 0.0f && s.typical_p <= 1.0f)) {
        return fail(err, E3_ERR_ARG, "typical_p must be in (0.0, 1.0], got %g", (double) s.typical_p);
    }
    if (s.penalty_last_n < -1) {
        return fail(err, E3_ERR_ARG, "penalty_last_n = %d must be >= -1 (-1: the whole context, 0: off)",
                    (int) s.penalty_last_n);
    }
    if (!(s.repeat_penalty > 0.0f && s.repeat_penalty < 1e6f)) {
        return fail(err, E3_ERR_ARG, "repeat_penalty must be a number > 0 (1: off), got %g", (double) s.repeat_penalty);
    }
    if (!std::isfinite(s.frequency_penalty) || !std::isfinite(s.presence_penalty)) {
        return fail(err, E3_ERR_ARG, "frequency_penalty and presence_penalty must be finite numbers");
    }
    if (s.verify != E3_VERIFY_MATCH && s.verify != E3_VERIFY_REJECTION) {
        return fail(err, E3_ERR_ARG, "unknown verification %d", (int) s.verify);
    }
    return E3_OK;
}

static int check_logit_bias(const e3_engine * e, const e3_sampling & s, e3_error * err) {
    for (int32_t i = 0; i < s.n_logit_bias; ++i) {
        const e3_logit_bias & b = s.logit_bias[i];
        if (b.token < 0 || b.token >= e->n_vocab) {
            return fail(err, E3_ERR_ARG, "logit_bias token %d is outside the vocabulary (0..%d)", (int) b.token,
                        (int) e->n_vocab - 1);
        }
        if (std::isnan(b.bias) || b.bias == INFINITY) {
            return fail(err, E3_ERR_ARG, "logit_bias of token %d must be a number or -inf (to ban it)", (int) b.token);
        }
    }
    return E3_OK;
}

static int check_request(const e3_engine * e, const e3_request & r, e3_error * err) {
    if (r.n_seq <= 0 || r.n_seq > e->n_seq_limit || !r.seq_ids || !r.prompts || !r.n_prompt || !r.out) {
        return fail(err, E3_ERR_ARG, "%d prompts; a generation takes 1 to %d (the %s)", (int) r.n_seq,
                    (int) e->n_seq_limit, e->spec ? "session's n_seq" : "context's n_seq_max");
    }
    if (!e->spec && r.n_seq > e->n_batch) {
        return fail(err, E3_ERR_ARG, "%d sequences do not fit one batch (n_batch = %d)", (int) r.n_seq,
                    (int) e->n_batch);
    }
    if (r.max_new <= 0) {
        return fail(err, E3_ERR_ARG, "max_new_tokens must be > 0");
    }
    if (int rc = check_sampling(r.sampling, err)) {
        return rc;
    }
    if (int rc = check_logit_bias(e, r.sampling, err)) {
        return rc;
    }
    if (r.n_logprobs < 0 || r.n_logprobs > std::min(e->n_vocab, 1024) ||
        (r.n_logprobs > 0 && !(r.logprobs && r.top_ids && r.top_logprobs))) {
        return fail(err, E3_ERR_ARG, "logprobs = %d must be in [0, %d]", (int) r.n_logprobs,
                    (int) std::min(e->n_vocab, 1024));
    }
    if (e->spec && (r.n_draft < E3_DRAFT_AUTO || r.n_draft > e->n_draft_spec)) {
        return fail(err, E3_ERR_ARG, "n_draft_max = %d is outside [1, %d] (the session's n_draft_max)",
                    (int) r.n_draft, (int) e->n_draft_spec);
    }
    if (e->spec && r.n_draft > 0 && r.n_draft < e->n_min) {
        return fail(err, E3_ERR_ARG, "n_draft_max = %d is below the session's n_min = %d: every draft would be "
                    "dropped", (int) r.n_draft, (int) e->n_min);
    }
    std::vector<char> seen(e->n_seq_limit, 0);
    for (int32_t i = 0; i < r.n_seq; ++i) {
        const int32_t seq = r.seq_ids[i];
        if (seq < 0 || seq >= e->n_seq_limit || seen[seq]) {
            return fail(err, E3_ERR_SEQ, "sequence id %d out of range or repeated", (int) seq);
        }
        seen[seq] = 1;
        if (r.n_prompt[i] <= 0) {
            return fail(err, E3_ERR_ARG, "prompt %d is empty", (int) i);
        }
        if (r.n_prompt[i] >= e->n_ctx_seq) {
            return fail(err, E3_ERR_ARG, "prompt %d has %d tokens; the context holds %d per sequence", (int) i,
                        (int) r.n_prompt[i], (int) e->n_ctx_seq);
        }
        for (int32_t k = 0; k < r.n_prompt[i]; ++k) {
            if (r.prompts[i][k] < 0 || r.prompts[i][k] >= e->n_vocab) {
                return fail(err, E3_ERR_ARG, "prompt %d has token %d outside the vocabulary (0..%d)", (int) i,
                            (int) r.prompts[i][k], (int) e->n_vocab - 1);
            }
        }
    }
    for (int32_t k = 0; k < r.n_stop_tokens; ++k) {
        if (r.stop_tokens[k] < 0 || r.stop_tokens[k] >= e->n_vocab) {
            return fail(err, E3_ERR_ARG, "stop token %d outside the vocabulary", (int) r.stop_tokens[k]);
        }
    }
    for (int32_t k = 0; k < r.n_stop_strings; ++k) {
        if (!r.stop_strings[k] || !r.stop_strings[k][0]) {
            return fail(err, E3_ERR_ARG, "stop string %d is empty (it would stop at once)", (int) k);
        }
    }
    return E3_OK;
}

// the generation's settings, the adaptive state, and a fresh start for each sequence
// each request's sampler chains; a grammar that does not parse fails here, before
// anything of the engine's changes
// each request's sampler chains; a grammar that does not parse, or that (with the logit
// biases) leaves no first token, fails here, before anything of the engine's changes.
// Whether a chain leaves a token does not depend on the logits (a bias of -inf and a
// grammar remove tokens whatever the logits; the other stages keep at least one), so a
// row of zeros tells.
static int make_samplers(const e3_engine * e, const e3_request & r,
                         std::vector<std::unique_ptr<e3::seq_sampler>> & out, e3_error * err) {
    std::vector<float> zeros;
    for (int32_t i = 0; i < r.n_seq; ++i) {
        out.push_back(std::make_unique<e3::seq_sampler>());
        e3::seq_sampler & smpl = *out.back();
        if (int rc = smpl.init(e->vocab, e->n_vocab, e->n_ctx_seq, r.sampling, r.prompts[i], r.n_prompt[i],
                               mix_seed(r.sampling.seed + (uint64_t) i), err)) {
            return rc;
        }
        if (!smpl.plain_greedy()) {
            zeros.resize(e->n_vocab, 0.0f);
            if (smpl.target(zeros.data()).size == 0) {
                return fail(err, E3_ERR_ARG, "the grammar and logit_bias of prompt %d allow no first token", (int) i);
            }
        }
    }
    return E3_OK;
}

static void setup(e3_engine * e, const e3_request & r, std::vector<std::unique_ptr<e3::seq_sampler>> & samplers) {
    e->n_setups++;
    e->max_new = r.max_new;
    e->sampling = r.sampling;
    e->rejection = r.sampling.verify == E3_VERIFY_REJECTION && r.sampling.temperature > 0.0f;
    e->n_logprobs = r.n_logprobs;
    e->tracing = r.trace != 0;
    e->stop_tokens.assign(r.stop_tokens, r.stop_tokens + r.n_stop_tokens);
    e->stop_strings.assign(r.stop_strings, r.stop_strings + r.n_stop_strings);
    e->adaptive = r.n_draft == E3_DRAFT_AUTO && e->spec;
    e->n_draft = e->spec ? (r.n_draft > 0 ? r.n_draft : e->n_draft_spec) : 0;
    if (e->adaptive) {
        if (e->n_adaptive++ % draft_tuner::relearn_every == 0) {
            e->tuner.reset(e->n_draft);
        } else {
            e->tuner.carry_over(e->n_draft);
        }
    }
    e->best_cap = e->adaptive ? e->tuner.best(e->n_min, e->n_draft, r.n_seq) : -1;
    e->plain = e->best_cap == 0;
    e->total = e3::tally(e->n_draft_spec);
    e->t_start = clock_type::now();

    const int32_t first_cap = !e->adaptive     ? e->n_draft
                              : e->best_cap > 0 ? e->best_cap
                                                : std::max(std::min(2, e->n_draft), e->n_min);
    e->seqs.clear();
    e->seqs.resize(r.n_seq);
    llama_memory_t mem = llama_get_memory(e->ctx);
    for (int32_t i = 0; i < r.n_seq; ++i) {
        sequence & s = e->seqs[i];
        s.seq_id = r.seq_ids[i];
        s.out = r.out[i];
        if (e->n_logprobs > 0) {
            s.out_lp = r.logprobs[i];
            s.out_top_ids = r.top_ids[i];
            s.out_top_lp = r.top_logprobs[i];
        }
        s.cap = first_cap;
        s.tally = e3::tally(e->n_draft_spec);
        s.smpl = std::move(samplers[i]);
    }
    if (r.reuse != E3_REUSE_ALL) {
        for (int32_t seq = 0; seq < e->n_seq_limit; ++seq) {
            e->forget(seq);
        }
    }
    // the record holds only while the target holds that many tokens
    for (int32_t i = 0; i < r.n_seq; ++i) {
        const int32_t seq = r.seq_ids[i];
        if (e->known[seq] && llama_memory_seq_pos_max(mem, seq) + 1 != (llama_pos) e->held[seq].size()) {
            e->forget(seq);
        }
    }
}

// A run of prompt tokens to decode: request req's tokens [from, to) at their positions,
// its first token sampled from the last one when sample is set.
struct span {
    int32_t req, from, to;
    bool sample;
};

// chunks of n_batch over the spans, each chunk processed by the session; each first token is
// sampled from the chunk that holds its prompt's last token
static int decode_spans(e3_engine * e, const e3_request & r, const std::vector<span> & spans, double & t_decode,
                        double & t_process, e3_error * err) {
    e->batch_clear();
    std::vector<std::pair<int32_t, int32_t>> ready;  // (request, row) to sample after this chunk
    for (size_t j = 0; j < spans.size(); ++j) {
        const span & sp = spans[j];
        for (int32_t k = sp.from; k < sp.to; ++k) {
            const bool last = k == sp.to - 1;
            if (last && sp.sample) {
                ready.emplace_back(sp.req, (int32_t) e->b_tok.size());
            }
            if (int rc = e->batch_add(r.seq_ids[sp.req], r.prompts[sp.req][k], k, last && sp.sample, err)) {
                return rc;
            }
            if ((int32_t) e->b_tok.size() < e->n_batch && !(last && j == spans.size() - 1)) {
                continue;
            }
            if (int rc = e->batch_decode(t_decode, err)) {
                return rc;
            }
            if (int rc = e->batch_process((int32_t) e->b_tok.size(), t_process, err)) {
                return rc;
            }
            for (auto [req, row] : ready) {
                sequence & s = e->seqs[req];
                s.n_past = r.n_prompt[req];
                s.id_last = e->sample_row(s, row, -1, err);
                if (s.id_last < 0) {
                    return e->failed;
                }
                e->emit(s, s.id_last, 0);
                e->forget_logprobs(s);
            }
            ready.clear();
            e->batch_clear();
        }
    }
    return E3_OK;
}

static int32_t common_prefix(const std::vector<int32_t> & a, const int32_t * b, int32_t n) {
    int32_t k = 0;
    const int32_t m = std::min<int32_t>((int32_t) a.size(), n);
    while (k < m && a[k] == b[k]) {
        ++k;
    }
    return k;
}

// What sequence seq of request i keeps of its KV cache (at most n_common tokens); the draft
// side is trimmed to match, and the target to what is kept.
static int32_t keep_prefix(e3_engine * e, int32_t seq, int32_t n_common) {
    int32_t keep = 0;
    if (e->known[seq] && n_common > 0) {
        const int32_t n_held = (int32_t) e->held[seq].size();
        keep = e->spec ? e3_spec_keep(e->spec, seq, n_held, n_common, e->in_step[seq]) : n_common;
    } else if (e->spec) {
        e3_spec_reset_seq(e->spec, seq);  // the draft side of a sequence starts over with it
    }
    llama_memory_seq_rm(llama_get_memory(e->ctx), seq, keep > 0 ? keep : -1, -1);
    e->forget(seq);  // known again once the prompt is in
    return keep;
}

// Each sequence keeps the longest prefix of its prompt that its caches hold (never the last
// prompt token: its logits give the first token). Of several prompts, the prefix all share
// is decoded once, on the sequence that holds the most of it, and copied to those that hold
// less; then each prompt's rest is decoded.
static int prefill(e3_engine * e, const e3_request & r, e3_error * err) {
    const auto t0 = clock_type::now();
    double t_decode = 0.0, t_process = 0.0;
    llama_memory_t mem = llama_get_memory(e->ctx);

    std::vector<int32_t> common(r.n_seq, 0);
    int32_t shared = r.reuse == E3_REUSE_NONE ? 0 : r.n_prompt[0] - 1;  // the prefix every prompt shares
    for (int32_t i = 0; i < r.n_seq; ++i) {
        const int32_t seq = r.seq_ids[i];
        common[i] = e->known[seq] ? common_prefix(e->held[seq], r.prompts[i], r.n_prompt[i] - 1) : 0;
        if (i > 0 && shared > 0) {
            shared = std::min(shared, common_prefix(std::vector<int32_t>(r.prompts[0], r.prompts[0] + shared),
                                                    r.prompts[i], r.n_prompt[i] - 1));
        }
    }
    // those that hold less than the shared prefix get it from a source: a sequence that holds
    // exactly it (its draft side then ends there too), or else the one of them that holds the
    // most, once it has decoded the rest of it
    std::vector<char> copies(r.n_seq, 0);
    int32_t source = -1;
    for (int32_t i = 0; i < r.n_seq; ++i) {
        copies[i] = r.n_seq > 1 && shared > 0 && common[i] < shared;
        if (copies[i]) {
            continue;
        }
        const int32_t seq = r.seq_ids[i];
        const bool whole = e->known[seq] && (int32_t) e->held[seq].size() == shared;
        e->seqs[i].n_keep = keep_prefix(e, seq, common[i]);
        if (source < 0 && shared > 0 && whole && e->seqs[i].n_keep == shared) {
            source = i;
        }
    }
    int32_t leader = -1;
    for (int32_t i = 0; source < 0 && i < r.n_seq; ++i) {
        if (copies[i] && (leader < 0 || common[i] > common[leader])) {
            leader = i;
        }
    }
    if (leader >= 0) {
        copies[leader] = 0;
        sequence & s = e->seqs[leader];
        s.n_keep = keep_prefix(e, s.seq_id, common[leader]);
        s.tally.c.n_reused = s.n_keep;
        if (int rc = decode_spans(e, r, {{leader, s.n_keep, shared, false}}, t_decode, t_process, err)) {
            return rc;
        }
        s.n_keep = shared;
        source = leader;
    }
    for (int32_t i = 0; i < r.n_seq; ++i) {
        sequence & s = e->seqs[i];
        if (!copies[i]) {
            if (i != leader) {
                s.tally.c.n_reused = s.n_keep;
            }
            continue;
        }
        const int32_t src = r.seq_ids[source];
        // the whole source (it holds no more than the prefix; sequences may have streams of their own)
        llama_memory_seq_rm(mem, s.seq_id, -1, -1);
        llama_memory_seq_cp(mem, src, s.seq_id, -1, -1);
        if (e->spec) {
            if (int rc = e3_spec_copy_seq(e->spec, src, s.seq_id, err)) {
                return rc;
            }
        }
        e->forget(s.seq_id);
        s.n_keep = shared;
        s.tally.c.n_reused = shared;
    }
    std::vector<span> rest;
    for (int32_t i = 0; i < r.n_seq; ++i) {
        rest.push_back({i, e->seqs[i].n_keep, r.n_prompt[i], true});
    }
    if (int rc = decode_spans(e, r, rest, t_decode, t_process, err)) {
        return rc;
    }
    for (int32_t i = 0; e->drafting() && i < r.n_seq; ++i) {
        e3_spec_begin(e->spec, r.seq_ids[i], r.prompts[i], r.n_prompt[i], nullptr);
    }
    for (int32_t i = 0; i < r.n_seq; ++i) {
        const int32_t seq = r.seq_ids[i];
        e->held[seq].assign(r.prompts[i], r.prompts[i] + r.n_prompt[i]);
        e->known[seq] = 1;
        e->in_step[seq] = e->drafting();
    }
    const double dt = seconds_since(t0);  // the prompts' process is prefill time
    e->total.c.t_prefill_s = dt;
    for (int32_t i = 0; i < r.n_seq; ++i) {
        e->seqs[i].tally.c.n_prompt = r.n_prompt[i];
        e->seqs[i].tally.c.t_prefill_s = dt;
        e->total.c.n_prompt += r.n_prompt[i];
        e->total.c.n_reused += e->seqs[i].tally.c.n_reused;
    }
    return E3_OK;
}

extern "C" int e3_engine_start(e3_engine * e, const e3_request * r, e3_error * err) {
    if (!e) {
        return fail(err, E3_ERR_STATE, "the engine is closed");
    }
    if (!r) {
        return fail(err, E3_ERR_ARG, "no request");
    }
    try {
        if (int rc = check_request(e, *r, err)) {
            return rc;  // refused: the engine and the contexts are as they were
        }
        std::vector<std::unique_ptr<e3::seq_sampler>> samplers;
        if (int rc = make_samplers(e, *r, samplers, err)) {
            return rc;
        }
        setup(e, *r, samplers);
        const int rc = prefill(e, *r, err);
        if (rc != E3_OK) {
            e->forget_generation();
        }
        if (rc == E3_CANCELLED) {
            e->cancel_all();
            return E3_OK;
        }
        if (rc != E3_OK) {
            e->seqs.clear();
        }
        return rc;
    } catch (const std::exception & ex) {
        e->forget_generation();
        e->seqs.clear();
        return fail(err, E3_ERR_EXCEPTION, "%s", ex.what());
    }
}

// ---------------------------------------------------------------------------
// A round, in phases: plan -> draft -> verify -> sample -> process -> commit
// ---------------------------------------------------------------------------

// which sequences take part and how much each may draft; returns the live count
static int32_t plan(e3_engine * e, bool probe) {
    e->d_seq.clear();
    e->d_past.clear();
    e->d_last.clear();
    e->d_cap.clear();
    e->d_owner.clear();
    int32_t n_live = 0;
    for (int32_t i = 0; i < (int32_t) e->seqs.size(); ++i) {
        sequence & s = e->seqs[i];
        s.live = false;
        s.drafted = false;
        s.draft_len = 0;
        s.draft = nullptr;
        s.n_q = 0;
        s.t_draft = 0.0;
        if (s.finish != E3_RUNNING) {
            continue;
        }
        if (s.n_past >= e->n_ctx_seq) {
            e->finish(s, E3_FINISH_CONTEXT);
            continue;
        }
        s.live = true;
        n_live++;
        const int32_t cap = probe ? 0 : e->draft_cap(s);
        if (cap > 0) {
            e->d_seq.push_back(s.seq_id);
            e->d_past.push_back(s.n_past);
            e->d_last.push_back(s.id_last);
            e->d_cap.push_back(cap);
            e->d_owner.push_back(i);
        }
    }
    return n_live;
}

// rejection verification: each drafted token is drawn from the draft's own distribution q
// under the generation's transforms, and q is kept for the verification
static int32_t draft_from_q(void * user, llama_context * ctx, int32_t idx, float * p) {
    sequence & s = *static_cast<sequence *>(user);
    if (s.n_q == s.q.size()) {
        s.q.emplace_back();
    }
    return s.smpl->draft_pick(llama_get_logits_ith(ctx, idx), s.q[s.n_q++], p);
}

// one draft call for every planned request
static int draft(e3_engine * e, e3_error * err) {
    const int32_t n_req = (int32_t) e->d_seq.size();
    if (n_req == 0) {
        return E3_OK;
    }
    const int32_t stride = std::max(e->n_draft_spec, 1);
    e->d_out.assign((size_t) n_req * stride, 0);
    e->d_len.assign(n_req, 0);
    for (int32_t r = 0; e->rejection && r < n_req; ++r) {  // the drafts are drawn from q, which is kept
        sequence & s = e->seqs[e->d_owner[r]];
        s.n_q = 0;
        e3_spec_set_draft_sampler(e->spec, s.seq_id, draft_from_q, &s);
    }
    const auto t0 = clock_type::now();
    const int rc = e3_spec_draft(e->spec, n_req, e->d_seq.data(), e->d_past.data(), e->d_last.data(),
                                 e->d_cap.data(), e->d_out.data(), stride, e->d_len.data(), err);
    const double dt = seconds_since(t0) / n_req;
    for (int32_t r = 0; e->rejection && r < n_req; ++r) {
        e3_spec_set_draft_sampler(e->spec, e->d_seq[r], nullptr, nullptr);
    }
    if (rc != E3_OK) {
        return e->cancelled() ? E3_CANCELLED : rc;
    }
    for (int32_t r = 0; r < n_req; ++r) {
        sequence & s = e->seqs[e->d_owner[r]];
        s.drafted = true;
        s.t_draft = dt;
        s.draft_len = std::min(e->d_len[r], e->d_cap[r]);
        s.draft = e->d_out.data() + (size_t) r * stride;
        s.tally.add_draft(s.draft_len, dt);
        e->total.add_draft(s.draft_len, dt);
    }
    return E3_OK;
}

// one target pass over every live sequence's last token and drafts
static int verify(e3_engine * e, e3_error * err) {
    e->batch_clear();
    for (sequence & s : e->seqs) {
        if (!s.live) {
            continue;
        }
        s.row0 = (int32_t) e->b_tok.size();
        if (int rc = e->batch_add(s.seq_id, s.id_last, s.n_past, true, err)) {
            return rc;
        }
        for (int32_t k = 0; k < s.draft_len; ++k) {
            if (int rc = e->batch_add(s.seq_id, s.draft[k], s.n_past + 1 + k, true, err)) {
                return rc;
            }
        }
    }
    double t_verify = 0.0;
    const int rc = e->batch_decode(t_verify, err);
    e->t_verify = t_verify;
    e->total.c.t_verify_s += t_verify;
    e->total.c.n_rounds++;
    e->total.c.n_plain_rounds += e->plain;
    for (sequence & s : e->seqs) {
        if (s.live) {
            s.tally.c.t_verify_s += t_verify;
            s.tally.c.n_rounds++;
            s.tally.c.n_plain_rounds += e->plain;
        }
    }
    return rc;
}

// the target's token at each verified row, while the drafts agree with it
static int sample(e3_engine * e, e3_error * err) {
    for (sequence & s : e->seqs) {
        if (!s.live) {
            continue;
        }
        s.accepted.clear();
        e->forget_logprobs(s);
        for (int32_t k = 0;; ++k) {
            const int32_t token = e->sample_row(s, s.row0 + k, k < s.draft_len ? k : -1, err);
            if (token < 0) {
                return e->failed;
            }
            s.accepted.push_back(token);
            if (k == s.draft_len || token != s.draft[k]) {
                break;
            }
        }
    }
    return E3_OK;
}

// the session reads the target's hidden states of the verified rows, up to
// the last one that is kept (the rows of rejected drafts after it would only
// be dropped again)
static int process(e3_engine * e, e3_error * err) {
    int32_t n_rows = 0;
    int32_t n_seq = 0;
    for (const sequence & s : e->seqs) {
        if (s.live) {
            n_rows = s.row0 + (int32_t) s.accepted.size();
            n_seq++;
        }
    }
    double t_process = 0.0;
    const int rc = e->batch_process(n_rows, t_process, err);
    if (e->drafting()) {
        e->total.c.t_process_s += t_process;
        e->total.c.n_process_calls += n_seq;
        for (sequence & s : e->seqs) {
            if (s.live) {
                s.tally.c.t_process_s += t_process;
                s.tally.c.n_process_calls++;
            }
        }
    }
    return rc;
}

// tell the session what was accepted, move each sequence on, trim rejected
// drafts from the target's cache and emit the tokens; n_left: the sequences still live
static int commit(e3_engine * e, int32_t & n_left, e3_error * err) {
    llama_memory_t mem = llama_get_memory(e->ctx);
    const int32_t n_live = (int32_t) std::count_if(e->seqs.begin(), e->seqs.end(),
                                                   [](const sequence & s) { return s.live; });
    n_left = 0;
    for (sequence & s : e->seqs) {
        if (!s.live) {
            continue;
        }
        const int32_t n_acc = (int32_t) s.accepted.size() - 1;
        s.tally.add_round(s.draft_len, n_acc);
        e->total.add_round(s.draft_len, n_acc);
        if (s.drafted) {
            if (int rc = e3_spec_accept(e->spec, s.seq_id, n_acc, err)) {
                return rc;
            }
            if (e->adaptive) {
                e->tuner.add_draft(s.draft_len, n_acc);
                // one longer after a full accept while that teaches something
                // worth knowing (draft_tuner::explore_longer); otherwise the
                // tuner's length or, until it decides, the accepted length + 1
                const int32_t base = e->best_cap > 0 ? e->best_cap : std::max(e->n_min, n_acc + 1);
                const bool longer = n_acc == s.draft_len &&
                                    e->tuner.explore_longer(s.draft_len, e->n_draft, n_live);
                s.cap = longer ? std::min(s.cap + 1, e->n_draft) : base;
            }
        }
        if (e->tracing) {
            e->record_round(s, n_acc);
        }
        int32_t n_emitted = 0;
        for (size_t j = 0; j < s.accepted.size(); ++j) {
            n_emitted++;
            if (!e->emit(s, s.accepted[j], j)) {
                break;
            }
        }
        // a sequence that stops among the accepted tokens keeps in its caches only what it
        // emitted (less its last token): a continuation then finds all of it there
        const int32_t n_keep = std::min(n_acc, n_emitted - 1);
        if (n_keep < n_acc && s.drafted) {
            if (int rc = e3_spec_rewind(e->spec, s.seq_id, n_keep, err)) {
                return rc;
            }
        }
        std::vector<int32_t> & held = e->held[s.seq_id];
        held.push_back(s.id_last);
        held.insert(held.end(), s.draft, s.draft + n_keep);
        s.n_past += n_keep + 1;
        if (n_keep < s.draft_len) {
            llama_memory_seq_rm(mem, s.seq_id, s.n_past, -1);  // the rejected drafts
        }
        s.id_last = s.accepted[n_keep];
        n_left += s.finish == E3_RUNNING;
    }
    return E3_OK;
}

// adaptive: learn from this round, then pick the next draft length
static void tune(e3_engine * e, bool probe, double t_round, double t_process, double t_draft, int32_t n_drafted,
                 int32_t n_live, int32_t n_left) {
    if (probe) {
        e->tuner.add_probe(e->total.c.n_rounds - 1, t_round, t_process, n_live);
    } else {
        e->tuner.add_round(e->total.c.n_rounds - 1, t_round, t_draft, n_drafted, n_live + n_drafted, n_live);
    }
    const int32_t best = e->tuner.best(e->n_min, e->n_draft, std::max(n_left, 1));
    if (best < 0) {
        return;
    }
    const bool changed = best != e->best_cap;
    e->best_cap = best;
    for (sequence & s : e->seqs) {
        if (best == 0 && s.finish == E3_RUNNING) {
            e3_spec_pause_seq(e->spec, s.seq_id);  // its draft side stops following it
            e->in_step[s.seq_id] = 0;
        }
        if (best == 0 || changed) {
            s.cap = best;
        }
    }
    e->plain = best == 0;
}

// One round for every live sequence. In plain mode (adaptive, when drafting
// does not pay) the same round runs without drafts and without process.
static int engine_step(e3_engine * e, e3_error * err) {
    const bool tuning = e->adaptive && !e->plain;
    const auto t0 = clock_type::now();
    const double t_process0 = e->total.c.t_process_s;
    const double t_draft0 = e->total.c.t_draft_s;
    const int64_t n_drafted0 = e->total.c.n_drafted;
    // adaptive: now and then a round without drafts, to measure what one costs
    const bool probe = tuning && e->tuner.probe_due(e->total.c.n_rounds);

    if (e->cancelled()) {
        e->cancel_all();
    }
    const int32_t n_live = plan(e, probe);
    if (n_live == 0) {
        return 0;
    }
    int32_t n_left = 0;
    int rc = draft(e, err);
    if (rc == E3_OK) {
        rc = verify(e, err);
    }
    if (rc == E3_OK) {
        rc = sample(e, err);
    }
    if (rc == E3_OK) {
        rc = process(e, err);
    }
    if (rc == E3_OK) {
        rc = commit(e, n_left, err);
    }
    if (rc == E3_CANCELLED) {
        e->forget_generation();  // the caches may hold part of the round
        e->cancel_all();  // the verify pass stopped: the round is dropped
        return 0;
    }
    if (rc != E3_OK) {
        e->forget_generation();
        return rc;
    }
    if (tuning) {
        tune(e, probe, seconds_since(t0), e->total.c.t_process_s - t_process0, e->total.c.t_draft_s - t_draft0,
             (int32_t) (e->total.c.n_drafted - n_drafted0), n_live, n_left);
    }
    return n_left;
}

extern "C" int e3_engine_step(e3_engine * e, e3_error * err) {
    if (!e) {
        return fail(err, E3_ERR_STATE, "the engine is closed");
    }
    try {
        const int rc = engine_step(e, err);
        e->total.c.t_total_s = seconds_since(e->t_start);
        for (sequence & s : e->seqs) {
            if (s.finish == E3_RUNNING) {
                s.tally.c.t_total_s = e->total.c.t_total_s;
            }
        }
        return rc;
    } catch (const std::exception & ex) {
        e->forget_generation();
        return fail(err, E3_ERR_EXCEPTION, "%s", ex.what());
    }
}

extern "C" int32_t e3_engine_held(const e3_engine * e, int32_t seq, int32_t * tokens, int32_t cap, int32_t * in_step) {
    if (!e || seq < 0 || seq >= e->n_seq_limit || !e->known[seq]) {
        return -1;
    }
    const auto & held = e->held[seq];
    if (tokens) {
        std::copy_n(held.begin(), std::min<size_t>(held.size(), (size_t) std::max(cap, 0)), tokens);
    }
    if (in_step) {
        *in_step = e->in_step[seq];
    }
    return (int32_t) held.size();
}

extern "C" int e3_engine_set_held(e3_engine * e, int32_t seq, const int32_t * tokens, int32_t n, int32_t in_step,
                                  e3_error * err) {
    if (!e) {
        return fail(err, E3_ERR_STATE, "the engine is closed");
    }
    if (seq < 0 || seq >= e->n_seq_limit) {
        return e3::fail_seq(err, seq, e->n_seq_limit);
    }
    if (n > 0 && !tokens) {
        return fail(err, E3_ERR_ARG, "no tokens");
    }
    for (int32_t k = 0; k < n; ++k) {
        if (tokens[k] < 0 || tokens[k] >= e->n_vocab) {
            return fail(err, E3_ERR_ARG, "token %d of sequence %d is outside the vocabulary", (int) tokens[k], (int) seq);
        }
    }
    try {
        e->forget(seq);
        if (n >= 0) {
            e->held[seq].assign(tokens, tokens + n);
            e->known[seq] = 1;
            e->in_step[seq] = e->spec && in_step;
        }
    } catch (const std::exception & ex) {
        return fail(err, E3_ERR_EXCEPTION, "%s", ex.what());
    }
    return E3_OK;
}

extern "C" int32_t e3_engine_trace(const e3_engine * e, int32_t i, e3_trace_round * rounds, int32_t * drafted,
                                   float * draft_p, int32_t cap) {
    if (!e || i < 0 || i >= (int32_t) e->seqs.size()) {
        return 0;
    }
    const sequence & s = e->seqs[i];
    const int32_t n = (int32_t) s.trace.size();
    if (!rounds) {
        return n;
    }
    const size_t width = std::max(e->n_draft_spec, 1);
    const int32_t m = std::min(n, cap);
    std::copy_n(s.trace.begin(), m, rounds);
    std::copy_n(s.trace_tokens.begin(), m * width, drafted);
    std::copy_n(s.trace_p.begin(), m * width, draft_p);
    return m;
}

extern "C" uint64_t e3_engine_setups(const e3_engine * e) { return e ? e->n_setups : 0; }

extern "C" int32_t e3_engine_n_tokens(const e3_engine * e, int32_t i) {
    return e && i >= 0 && i < (int32_t) e->seqs.size() ? e->seqs[i].n_out : 0;
}

extern "C" int32_t e3_engine_finish(const e3_engine * e, int32_t i) {
    return e && i >= 0 && i < (int32_t) e->seqs.size() ? e->seqs[i].finish : E3_RUNNING;
}

extern "C" void e3_engine_counters(const e3_engine * e, int32_t i, e3_counters * out, const e3_histograms * hist) {
    if (!e) {
        e3::tally().copy_to(out, hist);
    } else if (i < 0) {
        e->total.copy_to(out, hist);
    } else if (i < (int32_t) e->seqs.size()) {
        e->seqs[i].tally.copy_to(out, hist);
    } else {
        e3::tally().copy_to(out, hist);
    }
}
