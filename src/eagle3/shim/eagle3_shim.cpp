// eagle3_shim.cpp: the C ABI of eagle3_shim.h over common/speculative.h.
//
// The only translation unit that includes llama.cpp's C++ headers. Each entry
// point validates what upstream would abort on, catches every exception and
// keeps the small state machine (draft -> accept) that upstream leaves to the
// caller.

#include "eagle3_shim.h"
#include "shim_util.hpp"

#include "common.h"
#include "log.h"
#include "speculative.h"
#include "llama-ext.h"

#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------------------
// Logging: llama.cpp, ggml and common/ all end up in one callback, one
// complete line at a time (llama.cpp continues lines with GGML_LOG_LEVEL_CONT).
// ---------------------------------------------------------------------------

std::atomic<e3_log_callback> g_log_cb{nullptr};
std::atomic<void *>          g_log_ud{nullptr};

void log_emit_lines(int level, const char * text) {
    thread_local std::string pending;
    thread_local int         pending_level = GGML_LOG_LEVEL_INFO;

    if (level != GGML_LOG_LEVEL_CONT) {
        if (!pending.empty()) {
            // a new message while the previous one lacked its newline
            if (e3_log_callback cb = g_log_cb.load()) {
                cb(pending_level, pending.c_str(), g_log_ud.load());
            }
            pending.clear();
        }
        pending_level = level;
    }
    pending += text;

    size_t start = 0;
    size_t nl;
    while ((nl = pending.find('\n', start)) != std::string::npos) {
        if (nl > start) {
            const std::string line = pending.substr(start, nl - start);
            if (e3_log_callback cb = g_log_cb.load()) {
                cb(pending_level, line.c_str(), g_log_ud.load());
            }
        }
        start = nl + 1;
    }
    pending.erase(0, start);
}

void log_from_llama(enum ggml_log_level level, const char * text, void * /*user_data*/) {
    log_emit_lines((int) level, text);
}

#ifdef E3_HAVE_COMMON_LOG_CALLBACK
void log_from_common(enum ggml_log_level level, const char * text, void * /*user_data*/) {
    log_emit_lines((int) level, text);
}
#endif

void log_abort(const char * message) {
    // ggml is about to abort(): at least leave the reason where the user looks
    if (e3_log_callback cb = g_log_cb.load()) {
        cb(GGML_LOG_LEVEL_ERROR, message, g_log_ud.load());
    }
    std::fprintf(stderr, "%s\n", message);
}

void log_line(int level, const char * fmt, ...) {
    char buf[1024];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, args);
    va_end(args);
    if (e3_log_callback cb = g_log_cb.load()) {
        cb(level, buf, g_log_ud.load());
    }
}

// ---------------------------------------------------------------------------
// Errors, timing, model facts
// ---------------------------------------------------------------------------

using e3::clock_type;
using e3::fail;

double us_since(clock_type::time_point t0) {
    return e3::seconds_since(t0) * 1e6;
}

std::string model_arch(const llama_model * model) {
    char buf[128] = {0};
    if (llama_model_meta_val_str(model, "general.architecture", buf, sizeof(buf)) < 0) {
        return "";
    }
    return buf;
}

}  // namespace

// ---------------------------------------------------------------------------
// Which targets EAGLE-3 can draft for
// ---------------------------------------------------------------------------

extern "C" int e3_eagle3_target_support(const char * arch) {
    // Attention-only architectures whose graph records each layer's input
    // (res->t_layer_inp, which EAGLE-3 reads; any other target aborts at the
    // first decode). Those that also record the final pre-norm hidden state
    // (t_h_nextn) accept a target layer id equal to n_layer. Hybrid and
    // recurrent architectures that record them are left out: they cannot
    // roll back rejected drafts.
    static const struct { const char * arch; int support; } archs[] = {
        {"llama", 1},      {"qwen3", 1},    {"qwen3moe", 1},     {"minimax-m2", 1}, {"hunyuan_vl", 1},
        {"nanbeige", 1},   {"muse-glimmer", 1}, {"gpt-oss", 2},  {"gemma4", 2},     {"mimo2", 2},
    };
    if (!arch) {
        return 0;
    }
    for (const auto & a : archs) {
        if (std::strcmp(arch, a.arch) == 0) {
            return a.support;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Session
// ---------------------------------------------------------------------------

struct e3_spec {
    common_speculative * spec = nullptr;
    llama_context * ctx_tgt = nullptr;
    llama_context * ctx_dft = nullptr;
    e3_spec_config cfg{};
    int32_t n_draft_max = 0;  // effective (MTP may clamp the configured value)
    int32_t n_vocab = 0;

    std::vector<llama_tokens> prompts;   // per seq, from begin()
    std::vector<llama_tokens> results;   // per seq, scratch for draft()
    std::vector<int32_t> pending;        // per seq: length of the draft awaiting accept(), -1 none
    std::vector<int32_t> pending_pos0;   // per seq: n_past of that draft
    std::vector<e3_spec_counters> counters;
    std::vector<std::vector<int64_t>> accept_per_pos;  // per seq, n_draft_max entries

    bool seq_ok(int32_t seq_id) const { return seq_id >= 0 && seq_id < (int32_t) cfg.n_seq; }
};

static int check_config(const e3_spec_config * cfg, char * err, size_t n_err) {
    if (!cfg) {
        return fail(err, n_err, E3_ERR_ARG, "no session config given");
    }
    if (cfg->type != E3_SPEC_EAGLE3 && cfg->type != E3_SPEC_MTP) {
        return fail(err, n_err, E3_ERR_ARG, "unknown session type %d", (int) cfg->type);
    }
    if (cfg->n_seq == 0) {
        return fail(err, n_err, E3_ERR_ARG, "n_seq must be > 0");
    }
    if (cfg->n_draft_max <= 0) {
        return fail(err, n_err, E3_ERR_ARG, "n_draft_max must be > 0");
    }
    if (cfg->n_min < 0 || cfg->n_min > cfg->n_draft_max) {
        return fail(err, n_err, E3_ERR_ARG, "n_min must be in [0, n_draft_max=%d], got %d", (int) cfg->n_draft_max,
                    (int) cfg->n_min);
    }
    if (!(cfg->p_min >= 0.0f && cfg->p_min <= 1.0f)) {
        return fail(err, n_err, E3_ERR_ARG, "p_min must be in [0, 1], got %g", (double) cfg->p_min);
    }
    return E3_OK;
}

static int check_contexts(llama_context * ctx_tgt, llama_context * ctx_dft, const e3_spec_config & cfg,
                          char * err, size_t n_err) {
    if (!ctx_tgt || !ctx_dft) {
        return fail(err, n_err, E3_ERR_INIT, "both a target and a draft context are required");
    }
    if (ctx_tgt == ctx_dft) {
        return fail(err, n_err, E3_ERR_INIT, "the draft context must be a different context than the target");
    }
    const llama_model * model_tgt = llama_get_model(ctx_tgt);
    const llama_model * model_dft = llama_get_model(ctx_dft);

    const uint32_t n_seq_tgt = llama_n_seq_max(ctx_tgt);
    const uint32_t n_seq_dft = llama_n_seq_max(ctx_dft);
    if (cfg.n_seq > n_seq_tgt || cfg.n_seq > n_seq_dft) {
        return fail(err, n_err, E3_ERR_INIT,
                    "n_seq=%u exceeds the contexts' n_seq_max (target %u, draft %u); create both contexts with "
                    "n_seq_max >= %u",
                    cfg.n_seq, n_seq_tgt, n_seq_dft, cfg.n_seq);
    }
    const uint32_t n_batch_tgt = llama_n_batch(ctx_tgt);
    const uint32_t n_batch_dft = llama_n_batch(ctx_dft);
    if (n_batch_dft < n_batch_tgt) {
        return fail(err, n_err, E3_ERR_INIT,
                    "the draft context's n_batch (%u) is smaller than the target's (%u); create the draft context "
                    "with the target's n_ctx and n_batch",
                    n_batch_dft, n_batch_tgt);
    }
    if (llama_n_ctx(ctx_dft) < llama_n_ctx(ctx_tgt)) {
        return fail(err, n_err, E3_ERR_INIT,
                    "the draft context's n_ctx (%u) is smaller than the target's (%u)", llama_n_ctx(ctx_dft),
                    llama_n_ctx(ctx_tgt));
    }
    const uint64_t verify_rows = (uint64_t) cfg.n_seq * (1 + (uint64_t) cfg.n_draft_max);
    if (verify_rows > n_batch_tgt) {
        return fail(err, n_err, E3_ERR_INIT,
                    "a verify batch of n_seq*(1+n_draft_max) = %llu tokens does not fit the target's n_batch (%u)",
                    (unsigned long long) verify_rows, n_batch_tgt);
    }

    const int32_t n_vocab_tgt = llama_vocab_n_tokens(llama_model_get_vocab(model_tgt));
    const int32_t n_vocab_dft = llama_vocab_n_tokens(llama_model_get_vocab(model_dft));
    if (n_vocab_tgt != n_vocab_dft) {
        return fail(err, n_err, E3_ERR_INIT,
                    "vocabulary sizes differ: target %d tokens, draft %d; the draft must be built for this target",
                    n_vocab_tgt, n_vocab_dft);
    }

    const std::string arch_tgt = model_arch(model_tgt);
    if (llama_model_is_recurrent(model_tgt) || llama_model_is_hybrid(model_tgt)) {
        return fail(err, n_err, E3_ERR_INIT,
                    "target architecture '%s' has recurrent state, which cannot roll back rejected drafts; only "
                    "attention-only targets are supported",
                    arch_tgt.c_str());
    }

    if (cfg.type == E3_SPEC_EAGLE3) {
        const std::string arch_dft = model_arch(model_dft);
        if (arch_dft != "eagle3") {
            return fail(err, n_err, E3_ERR_INIT,
                        "the draft model's architecture is '%s', not 'eagle3'; pass a context over an EAGLE-3 draft "
                        "model (3 extract layers) built for this target",
                        arch_dft.c_str());
        }
        const int support = e3_eagle3_target_support(arch_tgt.c_str());
        if (support == 0) {
            return fail(err, n_err, E3_ERR_INIT,
                        "target architecture '%s' does not expose the per-layer hidden states EAGLE-3 drafts from",
                        arch_tgt.c_str());
        }
        const llama_context * other = llama_get_ctx_other(ctx_dft);
        if (other != nullptr && other != ctx_tgt) {
            return fail(err, n_err, E3_ERR_INIT,
                        "the draft context was created against a different target context (ctx_other)");
        }
        const uint32_t n_ids = llama_model_target_layer_ids_n(model_dft);
        const int32_t * ids = llama_model_target_layer_ids(model_dft);
        if (n_ids != 3 || ids == nullptr) {
            return fail(err, n_err, E3_ERR_INIT, "the EAGLE-3 draft must name exactly 3 target layers, it names %u",
                        n_ids);
        }
        const int32_t n_layer_tgt = llama_model_n_layer(model_tgt);
        const int32_t id_max = support == 2 ? n_layer_tgt : n_layer_tgt - 1;
        for (uint32_t k = 0; k < n_ids; ++k) {
            if (ids[k] < 0 || ids[k] > id_max) {
                return fail(err, n_err, E3_ERR_INIT,
                            "the EAGLE-3 draft reads target layer %d, but the target ('%s') has layers 0..%d; the "
                            "draft was trained for a different target",
                            ids[k], arch_tgt.c_str(), id_max);
            }
        }
        char buf[64] = {0};
        if (llama_model_meta_val_str(model_dft, "eagle3.target_hidden_size", buf, sizeof(buf)) >= 0) {
            const long hidden = std::strtol(buf, nullptr, 10);
            if (hidden != llama_model_n_embd(model_tgt)) {
                return fail(err, n_err, E3_ERR_INIT,
                            "the EAGLE-3 draft expects target hidden size %ld, the target has %d", hidden,
                            llama_model_n_embd(model_tgt));
            }
        }
    } else {
        if (llama_model_n_layer_nextn(model_dft) <= 0) {
            return fail(err, n_err, E3_ERR_INIT,
                        "the model has no NextN (MTP) layers; MTP needs a model with nextn_predict_layers > 0 "
                        "loaded with load_mtp=True");
        }
        if (llama_model_n_embd_out(model_dft) != llama_model_n_embd_out(model_tgt)) {
            return fail(err, n_err, E3_ERR_INIT, "MTP hidden sizes differ: target %d, draft %d",
                        llama_model_n_embd_out(model_tgt), llama_model_n_embd_out(model_dft));
        }
    }
    return E3_OK;
}

extern "C" e3_spec * e3_spec_create(llama_context * ctx_tgt, llama_context * ctx_dft, const e3_spec_config * cfg,
                                    char * err, size_t n_err) {
    if (check_config(cfg, err, n_err) != E3_OK || check_contexts(ctx_tgt, ctx_dft, *cfg, err, n_err) != E3_OK) {
        return nullptr;
    }
    try {
        common_params_speculative params;
        params.types = {cfg->type == E3_SPEC_EAGLE3 ? COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3
                                                    : COMMON_SPECULATIVE_TYPE_DRAFT_MTP};
        params.draft.ctx_tgt = ctx_tgt;
        params.draft.ctx_dft = ctx_dft;
        params.draft.n_max = cfg->n_draft_max;
        params.draft.n_min = cfg->n_min;
        params.draft.p_min = cfg->p_min;
        params.draft.backend_sampling = false;

        common_speculative * spec = common_speculative_init(params, cfg->n_seq);
        if (!spec) {
            fail(err, n_err, E3_ERR_INIT, "llama.cpp created no speculative implementation for these contexts");
            return nullptr;
        }

        auto * s = new e3_spec;
        s->spec = spec;
        s->ctx_tgt = ctx_tgt;
        s->ctx_dft = ctx_dft;
        s->cfg = *cfg;
        s->n_draft_max = std::min<int32_t>(cfg->n_draft_max, common_speculative_n_max(spec));
        s->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx_tgt)));
        s->prompts.assign(cfg->n_seq, {});
        s->results.assign(cfg->n_seq, {});
        s->pending.assign(cfg->n_seq, -1);
        s->pending_pos0.assign(cfg->n_seq, 0);
        s->counters.assign(cfg->n_seq, e3_spec_counters{});
        s->accept_per_pos.assign(cfg->n_seq, std::vector<int64_t>(s->n_draft_max, 0));
        for (auto & r : s->results) {
            r.reserve(cfg->n_draft_max);
        }
        return s;
    } catch (const std::exception & e) {
        fail(err, n_err, E3_ERR_INIT, "%s", e.what());
    } catch (...) {
        fail(err, n_err, E3_ERR_INIT, "unknown C++ exception while creating the session");
    }
    return nullptr;
}

extern "C" void e3_spec_free(e3_spec * s) {
    if (!s) {
        return;
    }
    try {
        common_speculative_free(s->spec);
    } catch (...) {
    }
    delete s;
}

extern "C" int32_t e3_spec_n_seq(const e3_spec * s) { return s ? (int32_t) s->cfg.n_seq : 0; }
extern "C" int32_t e3_spec_n_draft_max(const e3_spec * s) { return s ? s->n_draft_max : 0; }
extern "C" int32_t e3_spec_n_min(const e3_spec * s) { return s ? s->cfg.n_min : 0; }
extern "C" int32_t e3_spec_type(const e3_spec * s) { return s ? s->cfg.type : -1; }

static int check_tokens(const e3_spec * s, const int32_t * tokens, int32_t n, const char * what, char * err,
                        size_t n_err) {
    for (int32_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= s->n_vocab) {
            return fail(err, n_err, E3_ERR_ARG, "%s[%d] = %d is not a token id of this vocabulary (0..%d)", what,
                        (int) i, (int) tokens[i], (int) s->n_vocab - 1);
        }
    }
    return E3_OK;
}

extern "C" int e3_spec_begin(e3_spec * s, int32_t seq_id, const int32_t * prompt, int32_t n_prompt, char * err,
                             size_t n_err) {
    if (!s) {
        return fail(err, n_err, E3_ERR_STATE, "the session is closed");
    }
    if (!s->seq_ok(seq_id)) {
        return fail(err, n_err, E3_ERR_SEQ, "sequence id %d out of range (n_seq = %u)", (int) seq_id, s->cfg.n_seq);
    }
    if (n_prompt < 0 || (n_prompt > 0 && !prompt)) {
        return fail(err, n_err, E3_ERR_ARG, "invalid prompt");
    }
    if (int rc = check_tokens(s, prompt, n_prompt, "prompt", err, n_err)) {
        return rc;
    }
    try {
        s->prompts[seq_id].assign(prompt, prompt + n_prompt);
        s->pending[seq_id] = -1;
        common_speculative_begin(s->spec, seq_id, s->prompts[seq_id]);
    } catch (const std::exception & e) {
        return fail(err, n_err, E3_ERR_EXCEPTION, "begin: %s", e.what());
    }
    return E3_OK;
}

extern "C" int e3_spec_process(e3_spec * s, int32_t n_tokens, const int32_t * tokens, const int32_t * pos,
                               const int32_t * seq_ids, char * err, size_t n_err) {
    if (!s) {
        return fail(err, n_err, E3_ERR_STATE, "the session is closed");
    }
    if (n_tokens < 0 || (n_tokens > 0 && (!tokens || !pos || !seq_ids))) {
        return fail(err, n_err, E3_ERR_ARG, "invalid batch");
    }
    const int32_t n_batch = (int32_t) std::min(llama_n_batch(s->ctx_tgt), llama_n_batch(s->ctx_dft));
    if (n_tokens > n_batch) {
        return fail(err, n_err, E3_ERR_ARG, "the batch has %d entries, more than n_batch = %d", (int) n_tokens,
                    (int) n_batch);
    }
    if (int rc = check_tokens(s, tokens, n_tokens, "batch token", err, n_err)) {
        return rc;
    }
    // per-sequence entries must be contiguous: upstream pairs each entry with
    // its neighbour of the same sequence
    std::vector<int32_t> last_index(s->cfg.n_seq, -1);
    for (int32_t i = 0; i < n_tokens; ++i) {
        const int32_t seq = seq_ids[i];
        if (!s->seq_ok(seq)) {
            return fail(err, n_err, E3_ERR_SEQ, "sequence id %d out of range (n_seq = %u)", (int) seq,
                        s->cfg.n_seq);
        }
        if (last_index[seq] >= 0 && (last_index[seq] != i - 1 || pos[i] != pos[i - 1] + 1)) {
            return fail(err, n_err, E3_ERR_ARG,
                        "the entries of sequence %d are not contiguous with consecutive positions (batch index %d)",
                        (int) seq, (int) i);
        }
        last_index[seq] = i;
    }

    try {
        common_batch batch;  // process() reads only the entries, never the llama_batch_ext
        batch.tokens.reserve(n_tokens);
        for (int32_t i = 0; i < n_tokens; ++i) {
            batch.add(tokens[i], pos[i], seq_ids[i], false);
        }
        const auto t0 = clock_type::now();
        const bool ok = common_speculative_process(s->spec, batch);
        const double dt = us_since(t0);
        for (int32_t i = 0; i < n_tokens; ++i) {
            if (i == 0 || seq_ids[i] != seq_ids[i - 1]) {
                s->counters[seq_ids[i]].n_process_calls++;
                s->counters[seq_ids[i]].t_process_us += dt;
            }
        }
        if (!ok) {
            return fail(err, n_err, E3_ERR_PROCESS,
                        "the draft model failed to decode the processed batch (see the eagle3 log)");
        }
    } catch (const std::exception & e) {
        return fail(err, n_err, E3_ERR_EXCEPTION, "process: %s", e.what());
    }
    return E3_OK;
}

extern "C" int e3_spec_draft(e3_spec * s, int32_t n_req, const int32_t * seq_ids, const int32_t * n_past,
                             const int32_t * id_last, const int32_t * n_max, int32_t * out, int32_t out_stride,
                             int32_t * out_len, char * err, size_t n_err) {
    if (!s) {
        return fail(err, n_err, E3_ERR_STATE, "the session is closed");
    }
    if (n_req < 0 || n_req > (int32_t) s->cfg.n_seq || (n_req > 0 && (!seq_ids || !n_past || !id_last || !out ||
                                                                       !out_len))) {
        return fail(err, n_err, E3_ERR_ARG, "invalid draft request");
    }
    if (out_stride < s->n_draft_max) {
        return fail(err, n_err, E3_ERR_ARG, "output rows of %d tokens cannot hold drafts of up to %d", out_stride,
                    s->n_draft_max);
    }
    std::vector<char> seen(s->cfg.n_seq, 0);
    for (int32_t i = 0; i < n_req; ++i) {
        const int32_t seq = seq_ids[i];
        if (!s->seq_ok(seq)) {
            return fail(err, n_err, E3_ERR_SEQ, "sequence id %d out of range (n_seq = %u)", (int) seq, s->cfg.n_seq);
        }
        if (seen[seq]) {
            return fail(err, n_err, E3_ERR_ARG, "sequence %d requested twice in one draft call", (int) seq);
        }
        seen[seq] = 1;
        if (id_last[i] < 0 || id_last[i] >= s->n_vocab) {
            return fail(err, n_err, E3_ERR_ARG, "id_last = %d is not a token id of this vocabulary (0..%d)",
                        (int) id_last[i], (int) s->n_vocab - 1);
        }
        if (n_past[i] < 0) {
            return fail(err, n_err, E3_ERR_ARG, "n_past must be >= 0, got %d", (int) n_past[i]);
        }
    }

    try {
        for (int32_t i = 0; i < n_req; ++i) {
            const int32_t seq = seq_ids[i];
            auto & result = s->results[seq];
            result.clear();
            int32_t cap = s->n_draft_max;
            if (n_max && n_max[i] > 0 && n_max[i] < cap) {
                cap = n_max[i];
            }
            common_speculative_draft_params & dp = common_speculative_get_draft_params(s->spec, seq);
            dp.drafting = true;
            dp.n_max = cap;
            dp.pos0 = n_past[i];
            dp.id_last = id_last[i];
            dp.prompt = &s->prompts[seq];
            dp.result = &result;
        }
        const auto t0 = clock_type::now();
        common_speculative_draft(s->spec);
        const double dt = us_since(t0);

        llama_memory_t mem_dft = llama_get_memory(s->ctx_dft);
        for (int32_t i = 0; i < n_req; ++i) {
            const int32_t seq = seq_ids[i];
            const auto & result = s->results[seq];
            // drop what drafting wrote at and after n_past: the verify batch's
            // process() writes those positions (EAGLE-3 keeps its seed row at n_past - 1)
            llama_memory_seq_rm(mem_dft, seq, n_past[i], -1);
            s->pending_pos0[seq] = n_past[i];
            const int32_t n = (int32_t) std::min<size_t>(result.size(), (size_t) s->n_draft_max);
            std::memcpy(out + (size_t) i * out_stride, result.data(), (size_t) n * sizeof(int32_t));
            out_len[i] = n;
            s->pending[seq] = n;
            auto & c = s->counters[seq];
            c.n_draft_calls++;
            c.n_drafted += (uint64_t) n;
            c.t_draft_us += dt / n_req;
        }
    } catch (const std::exception & e) {
        return fail(err, n_err, E3_ERR_EXCEPTION, "draft: %s", e.what());
    }
    return E3_OK;
}

extern "C" int e3_spec_accept(e3_spec * s, int32_t seq_id, int32_t n_accepted, char * err, size_t n_err) {
    if (!s) {
        return fail(err, n_err, E3_ERR_STATE, "the session is closed");
    }
    if (!s->seq_ok(seq_id)) {
        return fail(err, n_err, E3_ERR_SEQ, "sequence id %d out of range (n_seq = %u)", (int) seq_id, s->cfg.n_seq);
    }
    const int32_t pending = s->pending[seq_id];
    if (pending < 0) {
        return fail(err, n_err, E3_ERR_STATE,
                    "accept() for sequence %d without a draft() since the last accept()", (int) seq_id);
    }
    if (n_accepted < 0 || n_accepted > pending) {
        return fail(err, n_err, E3_ERR_ARG,
                    "n_accepted = %d, but the last draft of sequence %d has %d tokens", (int) n_accepted,
                    (int) seq_id, (int) pending);
    }
    try {
        const auto t0 = clock_type::now();
        common_speculative_accept(s->spec, seq_id, (uint16_t) n_accepted);
        // drop the draft-side rows of rejected tokens. EAGLE-3 also drops the
        // row at the new n_past - 1: its pair holds a rejected token, and the
        // next draft() or process() rewrites it
        const int32_t keep = s->pending_pos0[seq_id] + n_accepted + (s->cfg.type == E3_SPEC_EAGLE3 ? 0 : 1);
        llama_memory_seq_rm(llama_get_memory(s->ctx_dft), seq_id, keep, -1);
        auto & c = s->counters[seq_id];
        c.t_accept_us += us_since(t0);
        c.n_accept_calls++;
        c.n_accepted += (uint64_t) n_accepted;
        auto & per_pos = s->accept_per_pos[seq_id];
        for (int32_t k = 0; k < n_accepted && k < (int32_t) per_pos.size(); ++k) {
            per_pos[k]++;
        }
        s->pending[seq_id] = -1;
    } catch (const std::exception & e) {
        return fail(err, n_err, E3_ERR_EXCEPTION, "accept: %s", e.what());
    }
    return E3_OK;
}

extern "C" int e3_spec_reset_seq(e3_spec * s, int32_t seq_id) {
    if (!s || !s->seq_ok(seq_id)) {
        return E3_ERR_SEQ;
    }
    s->pending[seq_id] = -1;
    s->prompts[seq_id].clear();
    llama_memory_seq_rm(llama_get_memory(s->ctx_dft), seq_id, -1, -1);
    return E3_OK;
}

extern "C" int32_t e3_spec_pending(const e3_spec * s, int32_t seq_id) {
    if (!s || !s->seq_ok(seq_id)) {
        return -1;
    }
    return s->pending[seq_id];
}

extern "C" int e3_spec_counters_get(const e3_spec * s, int32_t seq_id, e3_spec_counters * out) {
    if (!s || !out || seq_id >= (int32_t) s->cfg.n_seq) {
        return E3_ERR_ARG;
    }
    if (seq_id >= 0) {
        *out = s->counters[seq_id];
        return E3_OK;
    }
    e3_spec_counters sum{};
    for (const auto & c : s->counters) {
        sum.n_draft_calls += c.n_draft_calls;
        sum.n_drafted += c.n_drafted;
        sum.n_accept_calls += c.n_accept_calls;
        sum.n_accepted += c.n_accepted;
        sum.n_process_calls += c.n_process_calls;
        sum.t_process_us += c.t_process_us;
        sum.t_draft_us += c.t_draft_us;
        sum.t_accept_us += c.t_accept_us;
    }
    *out = sum;
    return E3_OK;
}

extern "C" int e3_spec_accept_per_pos(const e3_spec * s, int32_t seq_id, int64_t * out, int32_t n) {
    if (!s || !out || n < 0 || seq_id >= (int32_t) s->cfg.n_seq) {
        return E3_ERR_ARG;
    }
    for (int32_t k = 0; k < n; ++k) {
        out[k] = 0;
    }
    for (int32_t seq = 0; seq < (int32_t) s->cfg.n_seq; ++seq) {
        if (seq_id >= 0 && seq != seq_id) {
            continue;
        }
        const auto & per_pos = s->accept_per_pos[seq];
        for (int32_t k = 0; k < n && k < (int32_t) per_pos.size(); ++k) {
            out[k] += per_pos[k];
        }
    }
    return E3_OK;
}

extern "C" void e3_spec_reset_counters(e3_spec * s) {
    if (!s) {
        return;
    }
    for (auto & c : s->counters) {
        c = e3_spec_counters{};
    }
    for (auto & p : s->accept_per_pos) {
        std::fill(p.begin(), p.end(), 0);
    }
}

extern "C" void e3_spec_print_stats(const e3_spec * s) {
    if (!s) {
        return;
    }
    e3_spec_counters c{};
    e3_spec_counters_get(s, -1, &c);
    std::vector<int64_t> per_pos(s->n_draft_max);
    e3_spec_accept_per_pos(s, -1, per_pos.data(), s->n_draft_max);

    std::string rates;
    for (size_t k = 0; k < per_pos.size(); ++k) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%s%.3f", k ? ", " : "",
                      c.n_accept_calls ? (double) per_pos[k] / (double) c.n_accept_calls : 0.0);
        rates += buf;
    }
    log_line(GGML_LOG_LEVEL_INFO,
             "%s session: draft calls %llu, drafted %llu, accepted %llu (%.1f%%), mean accepted length %.3f, "
             "acceptance per position (%s), time draft/process/accept %.3f/%.3f/%.3f ms",
             s->cfg.type == E3_SPEC_EAGLE3 ? "EAGLE-3" : "MTP", (unsigned long long) c.n_draft_calls,
             (unsigned long long) c.n_drafted, (unsigned long long) c.n_accepted,
             c.n_drafted ? 100.0 * (double) c.n_accepted / (double) c.n_drafted : 0.0,
             c.n_accept_calls ? 1.0 + (double) c.n_accepted / (double) c.n_accept_calls : 0.0, rates.c_str(),
             c.t_draft_us / 1000.0, c.t_process_us / 1000.0, c.t_accept_us / 1000.0);
    try {
        common_speculative_print_stats(s->spec);  // upstream's line, at trace verbosity
    } catch (...) {
    }
}

// ---------------------------------------------------------------------------
// Logging setup
// ---------------------------------------------------------------------------

extern "C" void e3_log_set(e3_log_callback cb, void * user_data) {
    g_log_ud.store(user_data);
    g_log_cb.store(cb);
    llama_log_set(log_from_llama, nullptr);  // also sets ggml's logger
    ggml_set_abort_callback(log_abort);
#ifdef E3_HAVE_COMMON_LOG_CALLBACK
    common_log_set_callback(common_log_main(), cb ? log_from_common : nullptr, nullptr);
#endif
}

extern "C" void e3_log_set_common_verbosity(int verbosity) {
    common_log_set_verbosity_thold(verbosity);
}
