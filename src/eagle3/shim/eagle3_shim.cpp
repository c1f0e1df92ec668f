// eagle3_shim.cpp: the C ABI of eagle3_shim.h over common/speculative.h.
//
// The only translation unit that includes llama.cpp's C++ headers. Each entry
// point checks the call arguments upstream would abort on, catches every
// exception and keeps the small state machine (draft -> accept) and the
// counters that upstream leaves to the caller.

#include "eagle3_shim.h"
#include "eagle3_sampling.hpp"
#include "shim_util.hpp"

#include "common.h"
#include "log.h"
#include "speculative.h"
#include "ngram-cache.h"  // LLAMA_NGRAM_MAX: the n-gram cache file's record
#include "llama-ext.h"
#include "llama-cparams.h"  // LLAMA_MAX_SEQ
#include "llama-hparams.h"  // LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS
#include "ggml-cpu.h"

#include <atomic>
#include <csignal>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <new>
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

// ---------------------------------------------------------------------------
// Errors, timing, limits
// ---------------------------------------------------------------------------

using e3::clock_type;
using e3::fail;
using e3::fail_seq;
using e3::seconds_since;

constexpr int32_t max_draft = 65535;  // common_speculative_accept takes a uint16_t

}  // namespace

extern "C" int32_t e3_max_seq(void) { return LLAMA_MAX_SEQ; }
extern "C" int32_t e3_max_layers(void) { return LLAMA_MAX_LAYERS; }
extern "C" int32_t e3_max_experts(void) { return LLAMA_MAX_EXPERTS; }

extern "C" int e3_multi_token_counts(uint64_t * products, uint64_t * row_loads) {
#ifdef E3_HAVE_MULTI_TOKEN_COUNTS
    return ggml_cpu_multi_token_counts(products, row_loads) ? 1 : 0;
#else
    *products = 0;
    *row_loads = 0;
    return 0;
#endif
}

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
        {"llama", 1},      {"qwen2", 1},    {"qwen3", 1},    {"qwen3moe", 1},     {"minimax-m2", 1}, {"hunyuan_vl", 1},
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

extern "C" int e3_capture_layer_input(struct llama_context * ctx, int32_t lid, e3_error * err) {
    // llama.cpp aborts at the next decode when the graph does not record the
    // layer's input, and asserts on an id past n_layer: refuse both here.
    const llama_model * model = llama_get_model(ctx);
    char arch[64] = "";
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    if (e3_eagle3_target_support(arch) < 1) {
        return fail(err, E3_ERR_ARG, "the '%s' architecture's graph does not record its layers' inputs", arch);
    }
    const int32_t n_layer = llama_model_n_layer(model);
    if (lid < 0 || lid >= n_layer) {
        return fail(err, E3_ERR_ARG, "layer %d is not a layer of this model (0..%d)", (int) lid, (int) n_layer - 1);
    }
    llama_set_embeddings_layer_inp(ctx, (uint32_t) lid, true);
    return E3_OK;
}

extern "C" const float * e3_layer_input(struct llama_context * ctx, int32_t lid) {
    return llama_get_embeddings_layer_inp(ctx, (uint32_t) lid);
}

// ---------------------------------------------------------------------------
// Session
// ---------------------------------------------------------------------------

namespace {
struct drafter_row;
}

struct e3_spec {
    common_speculative * spec = nullptr;
    const drafter_row * row = nullptr;  // what this kind of drafter needs
    llama_context * ctx_tgt = nullptr;
    llama_context * ctx_dft = nullptr;
    e3_spec_config cfg{};
    int32_t n_draft_max = 0;  // effective (MTP may clamp the configured value)
    int32_t n_vocab = 0;

    // per seq: the tokens at positions 0 .. n_past - 1 of the target, from the
    // batches process() is handed (the n-gram drafters search it)
    std::vector<llama_tokens> history;
    std::vector<size_t> drafter_len;     // per seq: the history's length when the drafter last saw it
    std::vector<llama_tokens> results;   // per seq, scratch for draft()
    std::vector<std::vector<float>> result_p;  // per seq: the probability of each drafted token
    struct draft_sampler {
        e3_draft_sample_fn fn = nullptr;
        void * user = nullptr;
    };
    std::vector<draft_sampler> samplers;  // per seq: the engine's, or none (the drafter's greedy choice)
    std::vector<int32_t> pending;        // per seq: length of the draft awaiting accept(), -1 none
    std::vector<int32_t> pending_pos0;   // per seq: n_past of that draft
    std::vector<int32_t> accepted_pos0;  // per seq: n_past of the draft the last accept() took, -1 none
    std::vector<int32_t> accepted_n;     // ... and how many of its tokens it took
    std::vector<e3::tally> tallies;      // per seq

    bool seq_ok(int32_t seq_id) const { return seq_id >= 0 && seq_id < (int32_t) cfg.n_seq; }

    // seq_id's draft side starts over: no draft pending, no history, no carry-over, no draft KV
    void forget(int32_t seq_id) {
        pending[seq_id] = -1;
        accepted_pos0[seq_id] = -1;
        history[seq_id].clear();
        common_speculative_set_carry(spec, seq_id, {});
        if (ctx_dft) {
            llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, -1, -1);
        }
    }

    // A new history for the drafter of seq_id. The n-gram drafters keep indexes into the
    // history and assume it only grows from what their begin() saw (map-k aborts when it
    // shrinks, and keeps an old history's entries): they are emptied first.
    void restart(int32_t seq_id) {
        if (!ctx_dft) {  // (the n-gram kinds, which have none)
            common_speculative_begin(spec, seq_id, {});
        }
        common_speculative_begin(spec, seq_id, history[seq_id]);
        drafter_len[seq_id] = history[seq_id].size();
    }
    int bad_seq(int32_t seq_id, e3_error * err) const { return fail_seq(err, seq_id, (int32_t) cfg.n_seq); }

    int check_tokens(const int32_t * tokens, int32_t n, const char * what, e3_error * err) const {
        for (int32_t i = 0; i < n; ++i) {
            if (tokens[i] < 0 || tokens[i] >= n_vocab) {
                return fail(err, E3_ERR_ARG, "%s[%d] = %d is not a token id of this vocabulary (0..%d)", what,
                            (int) i, (int) tokens[i], (int) n_vocab - 1);
            }
        }
        return E3_OK;
    }
};

// ---------------------------------------------------------------------------
// The drafter table: one row per kind, and the rules a pair of contexts meets
// ---------------------------------------------------------------------------

namespace {

using context_rule = int (*)(llama_context *, llama_context *, const e3_spec_config &, e3_error *);

struct drafter_row {
    int32_t kind;
    common_speculative_type type;
    const char * key;    // e3_spec_kind_key(): how the Python package names the kind
    const char * name;   // in messages
    bool draft_ctx;      // drafts on a context of its own (else from the token history alone)
    bool hidden_states;  // reads the target's pre-norm hidden states
    int32_t keep_extra;  // draft-side rows accept() keeps past pos0 + n_accepted
    context_rule check;  // what this kind asks of the contexts
};

int check_eagle3(llama_context * tgt, llama_context * dft, const e3_spec_config &, e3_error * err) {
    // the draft graph reads the target layers its model names: without
    // them (not an EAGLE-3 model) common/speculative aborts
    if (llama_model_target_layer_ids_n(llama_get_model(dft)) != 3 || !llama_model_target_layer_ids(llama_get_model(dft))) {
        return fail(err, E3_ERR_INIT, "the draft model is not an EAGLE-3 draft with 3 target layers");
    }
    const llama_context * other = llama_get_ctx_other(dft);
    if (other != nullptr && other != tgt) {
        return fail(err, E3_ERR_INIT, "the draft context was created against a different target context (ctx_other)");
    }
    return E3_OK;
}

int check_mtp(llama_context * tgt, llama_context * dft, const e3_spec_config &, e3_error * err) {
    const llama_model * model_tgt = llama_get_model(tgt);
    const llama_model * model_dft = llama_get_model(dft);
    if (llama_model_n_layer_nextn(model_dft) <= 0) {
        return fail(err, E3_ERR_INIT,
                    "the model has no NextN (MTP) layers; MTP needs a model with nextn_predict_layers > 0 loaded "
                    "with load_mtp=True");
    }
    if (llama_model_n_embd_out(model_dft) != llama_model_n_embd_out(model_tgt)) {
        return fail(err, E3_ERR_INIT, "MTP hidden sizes differ: target %d, draft %d",
                    llama_model_n_embd_out(model_tgt), llama_model_n_embd_out(model_dft));
    }
    return E3_OK;
}

int check_draft_model(llama_context * tgt, llama_context * dft, const e3_spec_config & cfg, e3_error * err) {
    if (llama_model_target_layer_ids_n(llama_get_model(dft)) > 0) {
        return fail(err, E3_ERR_INIT, "the draft model is an EAGLE-3 draft, which drafts from the target's hidden "
                    "states: use an EAGLE-3 session for it");
    }
    char why[512];
    if (!e3_vocab_compatible(llama_get_model(tgt), llama_get_model(dft), why, sizeof(why))) {
        return fail(err, E3_ERR_INIT, "the draft model's vocabulary does not fit the target's: %s", why);
    }
    if (llama_n_seq_max(dft) != cfg.n_seq) {  // draft-simple decodes every sequence on its context
        return fail(err, E3_ERR_INIT, "the draft context has n_seq_max=%u; a draft model session of n_seq=%u needs "
                    "exactly that many", llama_n_seq_max(dft), cfg.n_seq);
    }
    return E3_OK;
}

// An n-gram cache file as llama.cpp writes it (common_ngram_cache_save): records of
// LLAMA_NGRAM_MAX tokens, a count n > 0, and n (token, count > 0) pairs. Its
// loader asserts on anything else, so the file is read here first.
int check_ngram_cache_file(const char * path, int32_t n_vocab, e3_error * err) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        return fail(err, E3_ERR_INIT, "cannot open the n-gram cache file '%s'", path);
    }
    auto token_ok = [&](int32_t t, bool null_ok) { return (null_ok && t == LLAMA_TOKEN_NULL) || (t >= 0 && t < n_vocab); };
    int32_t ngram[LLAMA_NGRAM_MAX];
    uint64_t n_records = 0;
    while (in.read(reinterpret_cast<char *>(ngram), sizeof(ngram))) {
        int32_t n = 0;
        bool ok = (bool) in.read(reinterpret_cast<char *>(&n), sizeof(n)) && n > 0;
        for (int32_t t : ngram) {
            ok = ok && token_ok(t, true);
        }
        for (int32_t i = 0; ok && i < n; ++i) {
            int32_t pair[2];
            ok = in.read(reinterpret_cast<char *>(pair), sizeof(pair)) && token_ok(pair[0], false) && pair[1] > 0;
        }
        if (!ok) {
            return fail(err, E3_ERR_INIT, "the n-gram cache file '%s' is not one for this vocabulary (record %llu is "
                        "truncated, or holds a token outside 0..%d or a count <= 0)", path,
                        (unsigned long long) n_records, (int) n_vocab - 1);
        }
        n_records++;
    }
    if (in.gcount() != 0) {
        return fail(err, E3_ERR_INIT, "the n-gram cache file '%s' ends inside a record", path);
    }
    if (!in.eof()) {  // (a directory opens, and cannot be read)
        return fail(err, E3_ERR_INIT, "cannot read the n-gram cache file '%s'", path);
    }
    return E3_OK;
}

int check_ngram(llama_context * tgt, llama_context *, const e3_spec_config & cfg, e3_error * err) {
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(tgt)));
    for (const char * path : {cfg.ngram.lookup_cache_static, cfg.ngram.lookup_cache_dynamic}) {
        if (cfg.kind == E3_SPEC_NGRAM_CACHE && path && path[0]) {
            if (int rc = check_ngram_cache_file(path, n_vocab, err)) {
                return rc;
            }
        }
    }
    return E3_OK;
}

constexpr drafter_row drafters[] = {
//  kind                   llama.cpp type                          key              name             draft   hidden keep  rule
    {E3_SPEC_EAGLE3,        COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3,   "eagle3",        "EAGLE-3",       true,  true,  0, check_eagle3},
    {E3_SPEC_MTP,           COMMON_SPECULATIVE_TYPE_DRAFT_MTP,      "mtp",           "MTP",           true,  true,  1, check_mtp},
    {E3_SPEC_DRAFT,         COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE,   "draft",         "draft-model",   true,  false, 1, check_draft_model},
    {E3_SPEC_NGRAM_SIMPLE,  COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE,   "ngram-simple",  "ngram-simple",  false, false, 0, check_ngram},
    {E3_SPEC_NGRAM_MAP_K,   COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K,    "ngram-map-k",   "ngram-map-k",   false, false, 0, check_ngram},
    {E3_SPEC_NGRAM_MAP_K4V, COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V,  "ngram-map-k4v", "ngram-map-k4v", false, false, 0, check_ngram},
    {E3_SPEC_NGRAM_MOD,     COMMON_SPECULATIVE_TYPE_NGRAM_MOD,      "ngram-mod",     "ngram-mod",     false, false, 0, check_ngram},
    {E3_SPEC_NGRAM_CACHE,   COMMON_SPECULATIVE_TYPE_NGRAM_CACHE,    "ngram-cache",   "ngram-cache",   false, false, 0, check_ngram},
};
static_assert(sizeof(drafters) / sizeof(drafters[0]) == E3_SPEC_KIND_COUNT, "one row per e3_spec_kind");

const drafter_row * find_drafter(int32_t kind) {
    for (const drafter_row & row : drafters) {
        if (row.kind == kind) {
            return &row;
        }
    }
    return nullptr;
}

}  // namespace

extern "C" const char * e3_spec_kind_key(int32_t kind) {
    const drafter_row * row = find_drafter(kind);
    return row ? row->key : nullptr;
}

extern "C" void e3_ngram_config_default(e3_ngram_config * out) {
    const common_params_speculative d;
    out->size_n = d.ngram_simple.size_n;
    out->size_m = d.ngram_simple.size_m;
    out->min_hits = d.ngram_simple.min_hits;
    out->n_match = d.ngram_mod.n_match;
    out->mod_n_min = d.ngram_mod.n_min;
    out->mod_n_max = d.ngram_mod.n_max;
    out->lookup_cache_static = nullptr;
    out->lookup_cache_dynamic = nullptr;
}

extern "C" int e3_vocab_compatible(const llama_model * target, const llama_model * draft, char * why, size_t why_len) {
    // the rules of common_speculative_are_compatible (common/speculative.cpp), which
    // draft-simple applies when it is created
    const llama_vocab * vt = llama_model_get_vocab(target);
    const llama_vocab * vd = llama_model_get_vocab(draft);
    auto no = [&](const char * fmt, auto... args) {
        if (why && why_len) {
            std::snprintf(why, why_len, fmt, args...);
        }
        return 0;
    };
    if (llama_vocab_type(vt) != llama_vocab_type(vd)) {
        return no("tokenizer types differ (target %d, draft %d)", (int) llama_vocab_type(vt), (int) llama_vocab_type(vd));
    }
    const bool bos = llama_vocab_get_add_bos(vt);
    if (bos != llama_vocab_get_add_bos(vd) || (bos && llama_vocab_bos(vt) != llama_vocab_bos(vd))) {
        return no("BOS differs (target adds %d, id %d; draft adds %d, id %d)", (int) bos, (int) llama_vocab_bos(vt),
                  (int) llama_vocab_get_add_bos(vd), (int) llama_vocab_bos(vd));
    }
    const bool eos = llama_vocab_get_add_eos(vt);
    if (eos != llama_vocab_get_add_eos(vd) || (eos && llama_vocab_eos(vt) != llama_vocab_eos(vd))) {
        return no("EOS differs (target adds %d, id %d; draft adds %d, id %d)", (int) eos, (int) llama_vocab_eos(vt),
                  (int) llama_vocab_get_add_eos(vd), (int) llama_vocab_eos(vd));
    }
    constexpr int max_size_difference = 128;  // SPEC_VOCAB_MAX_SIZE_DIFFERENCE
    constexpr int first_checked_id = 5;       // SPEC_VOCAB_CHECK_START_TOKEN_ID
    const int nt = llama_vocab_n_tokens(vt);
    const int nd = llama_vocab_n_tokens(vd);
    if (std::abs(nt - nd) > max_size_difference) {
        return no("sizes differ by more than %d (target %d tokens, draft %d)", max_size_difference, nt, nd);
    }
    for (int i = first_checked_id; i < std::min(nt, nd); ++i) {
        if (std::strcmp(llama_vocab_get_text(vt, i), llama_vocab_get_text(vd, i)) != 0) {
            return no("token %d differs (target '%s', draft '%s')", i, llama_vocab_get_text(vt, i),
                      llama_vocab_get_text(vd, i));
        }
    }
    return 1;
}

extern "C" int e3_spec_check_config(const e3_spec_config * cfg, e3_error * err) {
    if (!cfg) {
        return fail(err, E3_ERR_CONFIG, "no session config given");
    }
    const drafter_row * row = find_drafter(cfg->kind);
    if (!row) {
        return fail(err, E3_ERR_CONFIG, "unknown session kind %d", (int) cfg->kind);
    }
    if (cfg->n_seq == 0) {
        return fail(err, E3_ERR_CONFIG, "n_seq must be > 0");
    }
    if (cfg->n_seq > LLAMA_MAX_SEQ) {
        return fail(err, E3_ERR_CONFIG, "n_seq must be <= %d", LLAMA_MAX_SEQ);
    }
    if (cfg->n_draft_max <= 0) {
        return fail(err, E3_ERR_CONFIG, "n_draft_max must be > 0");
    }
    if (cfg->n_draft_max > max_draft) {
        return fail(err, E3_ERR_CONFIG, "n_draft_max must be <= %d", max_draft);
    }
    if (cfg->n_min < 0 || cfg->n_min > cfg->n_draft_max) {
        return fail(err, E3_ERR_CONFIG, "n_min must be in [0, n_draft_max]");
    }
    if (!(cfg->p_min >= 0.0f && cfg->p_min <= 1.0f)) {
        return fail(err, E3_ERR_CONFIG, "p_min must be in [0, 1]");
    }
    if (row->draft_ctx) {
        return E3_OK;
    }
    // the n-gram drafters' own parameters, with llama.cpp's ranges (common/arg.cpp)
    const e3_ngram_config & g = cfg->ngram;
    const struct { int32_t value, lo, hi; const char * name; } ranges[] = {
        {g.size_n, 1, 1024, "size_n"},       {g.size_m, 1, 1024, "size_m"},
        {g.min_hits, 1, 65535, "min_hits"},  {g.n_match, 1, 1024, "n_match"},
        {g.mod_n_min, 0, 1024, "mod_n_min"}, {g.mod_n_max, 0, 1024, "mod_n_max"},
    };
    for (const auto & r : ranges) {
        if (r.value < r.lo || r.value > r.hi) {
            return fail(err, E3_ERR_CONFIG, "%s must be in [%d, %d], got %d", r.name, (int) r.lo, (int) r.hi,
                        (int) r.value);
        }
    }
    return E3_OK;
}

// The rules every pair of contexts meets, then its kind's own.
namespace {

int check_distinct(llama_context * tgt, llama_context * dft, const e3_spec_config & cfg, e3_error * err) {
    const drafter_row & row = *find_drafter(cfg.kind);
    if (!tgt) {
        return fail(err, E3_ERR_INIT, "a target context is required");
    }
    if (!row.draft_ctx) {
        return dft ? fail(err, E3_ERR_INIT, "the %s drafter has no draft context: pass none", row.name) : E3_OK;
    }
    if (!dft) {
        return fail(err, E3_ERR_INIT, "the %s drafter needs a draft context", row.name);
    }
    if (tgt == dft) {
        return fail(err, E3_ERR_INIT, "the draft context must be a different context than the target");
    }
    return E3_OK;
}

int check_sizes(llama_context * tgt, llama_context * dft, const e3_spec_config & cfg, e3_error * err) {
    const uint32_t n_seq_tgt = llama_n_seq_max(tgt);
    const uint32_t n_seq_dft = dft ? llama_n_seq_max(dft) : n_seq_tgt;
    if (cfg.n_seq > n_seq_tgt || cfg.n_seq > n_seq_dft) {
        return fail(err, E3_ERR_INIT,
                    "n_seq=%u exceeds the contexts' n_seq_max (target %u, draft %u); create the contexts with "
                    "n_seq_max >= %u",
                    cfg.n_seq, n_seq_tgt, n_seq_dft, cfg.n_seq);
    }
    const uint32_t n_batch_tgt = llama_n_batch(tgt);
    if (dft && llama_n_batch(dft) < n_batch_tgt) {
        return fail(err, E3_ERR_INIT,
                    "the draft context's n_batch (%u) is smaller than the target's (%u); create the draft context "
                    "with the target's n_ctx and n_batch",
                    llama_n_batch(dft), n_batch_tgt);
    }
    if (dft && llama_n_ctx(dft) < llama_n_ctx(tgt)) {
        return fail(err, E3_ERR_INIT, "the draft context's n_ctx (%u) is smaller than the target's (%u)",
                    llama_n_ctx(dft), llama_n_ctx(tgt));
    }
    const uint64_t verify_rows = (uint64_t) cfg.n_seq * (1 + (uint64_t) cfg.n_draft_max);
    if (verify_rows > n_batch_tgt) {
        return fail(err, E3_ERR_INIT,
                    "a verify batch of n_seq*(1+n_draft_max) = %llu tokens does not fit the target's n_batch (%u)",
                    (unsigned long long) verify_rows, n_batch_tgt);
    }
    return E3_OK;
}

int check_rollback(llama_context * tgt, llama_context *, const e3_spec_config &, e3_error * err) {
    const llama_model * model = llama_get_model(tgt);
    if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model)) {
        char arch[128] = {0};
        llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
        return fail(err, E3_ERR_INIT,
                    "target architecture '%s' has recurrent state, which cannot roll back rejected drafts; only "
                    "attention-only targets are supported",
                    arch);
    }
    return E3_OK;
}

int check_kind(llama_context * tgt, llama_context * dft, const e3_spec_config & cfg, e3_error * err) {
    return find_drafter(cfg.kind)->check(tgt, dft, cfg, err);
}

constexpr context_rule context_rules[] = {check_distinct, check_sizes, check_rollback, check_kind};

int check_contexts(llama_context * tgt, llama_context * dft, const e3_spec_config & cfg, e3_error * err) {
    for (context_rule rule : context_rules) {
        if (int rc = rule(tgt, dft, cfg, err)) {
            return rc;
        }
    }
    return E3_OK;
}

common_params_speculative spec_params(llama_context * ctx_tgt, llama_context * ctx_dft, const e3_spec_config & cfg) {
    common_params_speculative params;
    params.types = {find_drafter(cfg.kind)->type};
    params.draft.ctx_tgt = ctx_tgt;
    params.draft.ctx_dft = ctx_dft;
    params.draft.n_max = cfg.n_draft_max;
    params.draft.n_min = cfg.n_min;
    params.draft.p_min = cfg.p_min;
    params.draft.backend_sampling = false;
    const e3_ngram_config & g = cfg.ngram;
    for (common_params_speculative_ngram_map * m : {&params.ngram_simple, &params.ngram_map_k, &params.ngram_map_k4v}) {
        m->size_n = (uint16_t) g.size_n;
        m->size_m = (uint16_t) g.size_m;
        m->min_hits = (uint16_t) g.min_hits;
    }
    params.ngram_mod.n_match = g.n_match;
    params.ngram_mod.n_min = g.mod_n_min;
    params.ngram_mod.n_max = g.mod_n_max;
    params.ngram_cache.lookup_cache_static = g.lookup_cache_static ? g.lookup_cache_static : "";
    params.ngram_cache.lookup_cache_dynamic = g.lookup_cache_dynamic ? g.lookup_cache_dynamic : "";
    return params;
}

e3_spec * make_spec(llama_context * ctx_tgt, llama_context * ctx_dft, const e3_spec_config & cfg, e3_error * err) {
    common_params_speculative params = spec_params(ctx_tgt, ctx_dft, cfg);
    common_speculative * spec = common_speculative_init(params, cfg.n_seq);
    if (!spec) {
        fail(err, E3_ERR_INIT, "llama.cpp created no speculative implementation for these contexts");
        return nullptr;
    }
    auto * s = new e3_spec;
    s->spec = spec;
    s->row = find_drafter(cfg.kind);
    s->ctx_tgt = ctx_tgt;
    s->ctx_dft = ctx_dft;
    s->cfg = cfg;
    s->cfg.ngram.lookup_cache_static = s->cfg.ngram.lookup_cache_dynamic = nullptr;  // read once, not kept
    s->n_draft_max = std::min<int32_t>(cfg.n_draft_max, common_speculative_n_max(spec));
    s->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx_tgt)));
    s->history.assign(cfg.n_seq, {});
    s->drafter_len.assign(cfg.n_seq, 0);
    s->results.assign(cfg.n_seq, {});
    s->result_p.assign(cfg.n_seq, {});
    s->samplers.assign(cfg.n_seq, {});
    s->pending.assign(cfg.n_seq, -1);
    s->pending_pos0.assign(cfg.n_seq, 0);
    s->accepted_pos0.assign(cfg.n_seq, -1);
    s->accepted_n.assign(cfg.n_seq, 0);
    s->tallies.assign(cfg.n_seq, e3::tally(s->n_draft_max));
    for (auto & r : s->results) {
        r.reserve(cfg.n_draft_max);
    }
    return s;
}

}  // namespace

extern "C" e3_spec * e3_spec_create(llama_context * ctx_tgt, llama_context * ctx_dft, const e3_spec_config * cfg,
                                    e3_error * err) {
    if (e3_spec_check_config(cfg, err) != E3_OK || check_contexts(ctx_tgt, ctx_dft, *cfg, err) != E3_OK) {
        return nullptr;
    }
    try {
        return make_spec(ctx_tgt, ctx_dft, *cfg, err);
    } catch (const std::exception & e) {
        fail(err, E3_ERR_INIT, "%s", e.what());
    } catch (...) {
        fail(err, E3_ERR_INIT, "unknown C++ exception while creating the session");
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

extern "C" void e3_spec_get_info(const e3_spec * s, e3_spec_info * out) {
    if (!s || !out) {
        return;
    }
    out->kind = s->cfg.kind;
    out->n_seq = (int32_t) s->cfg.n_seq;
    out->n_draft_max = s->n_draft_max;
    out->n_min = s->cfg.n_min;
    // EAGLE-3 and MTP read pre-norm hidden states of the target, which
    // common_speculative_init turned on (llama_set_embeddings_layer_inp/_nextn)
    out->need_embd = 0;
    out->need_embd_pre_norm = s->row->hidden_states ? 1 : 0;
}

#define E3_GUARD(where)                                                   \
    catch (const std::exception & e) {                                   \
        return fail(err, E3_ERR_EXCEPTION, where ": %s", e.what());      \
    }                                                                    \
    catch (...) {                                                        \
        return fail(err, E3_ERR_EXCEPTION, where ": unknown C++ exception"); \
    }

extern "C" int e3_decode(llama_context * ctx, llama_batch_ext * batch, int32_t * rc, e3_error * err) {
    try {
        *rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
        return E3_OK;
    }
    E3_GUARD("llama_decode")
}

extern "C" int e3_state_get(llama_context * ctx, int32_t seq_id, uint8_t * out, size_t cap, size_t * n_out,
                            e3_error * err) {
    if (!ctx || !n_out) {
        return fail(err, E3_ERR_ARG, "no context");
    }
    if (seq_id >= (int32_t) llama_n_seq_max(ctx)) {
        return fail_seq(err, seq_id, (int32_t) llama_n_seq_max(ctx));
    }
    try {
        const size_t need = seq_id < 0 ? llama_state_get_size(ctx) : llama_state_seq_get_size(ctx, seq_id);
        *n_out = need;
        if (!out) {
            return E3_OK;
        }
        if (cap < need) {
            return fail(err, E3_ERR_ARG, "%zu bytes cannot hold the state's %zu", cap, need);
        }
        const size_t got = seq_id < 0 ? llama_state_get_data(ctx, out, cap) : llama_state_seq_get_data(ctx, out, cap, seq_id);
        if (got == 0 || got > cap) {
            return fail(err, E3_ERR_EXCEPTION, "llama.cpp could not write the context's state");
        }
        *n_out = got;
    }
    E3_GUARD("state_get")
    return E3_OK;
}

extern "C" int e3_state_set(llama_context * ctx, int32_t seq_id, const uint8_t * data, size_t n, e3_error * err) {
    if (!ctx || (n > 0 && !data)) {
        return fail(err, E3_ERR_ARG, "no context or no data");
    }
    if (seq_id >= (int32_t) llama_n_seq_max(ctx)) {
        return fail_seq(err, seq_id, (int32_t) llama_n_seq_max(ctx));
    }
    try {
        llama_memory_t mem = llama_get_memory(ctx);
        llama_memory_seq_rm(mem, seq_id < 0 ? -1 : seq_id, -1, -1);  // (an empty saved sequence clears nothing)
        const size_t used = seq_id < 0 ? llama_state_set_data(ctx, data, n) : llama_state_seq_set_data(ctx, data, n, seq_id);
        if (used != n) {
            llama_memory_seq_rm(mem, seq_id < 0 ? -1 : seq_id, -1, -1);
            return fail(err, E3_ERR_ARG, "llama.cpp refused the state (read %zu of %zu bytes); the %s is now empty",
                        used, n, seq_id < 0 ? "context" : "sequence");
        }
    }
    E3_GUARD("state_set")
    return E3_OK;
}

extern "C" int e3_spec_begin(e3_spec * s, int32_t seq_id, const int32_t * prompt, int32_t n_prompt, e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (!s->seq_ok(seq_id)) {
        return s->bad_seq(seq_id, err);
    }
    if (n_prompt < 0 || (n_prompt > 0 && !prompt)) {
        return fail(err, E3_ERR_ARG, "invalid prompt");
    }
    if (int rc = s->check_tokens(prompt, n_prompt, "prompt", err)) {
        return rc;
    }
    try {
        s->history[seq_id].assign(prompt, prompt + n_prompt);
        s->pending[seq_id] = -1;
        s->restart(seq_id);
    }
    E3_GUARD("begin")
    return E3_OK;
}

static int check_process_batch(const e3_spec * s, int32_t n_tokens, const int32_t * tokens, const int32_t * pos,
                               const int32_t * seq_ids, e3_error * err) {
    if (n_tokens < 0 || (n_tokens > 0 && (!tokens || !pos || !seq_ids))) {
        return fail(err, E3_ERR_ARG, "invalid batch");
    }
    const int32_t n_batch = (int32_t) (s->ctx_dft ? std::min(llama_n_batch(s->ctx_tgt), llama_n_batch(s->ctx_dft))
                                                  : llama_n_batch(s->ctx_tgt));
    if (n_tokens > n_batch) {
        return fail(err, E3_ERR_ARG, "the batch has %d entries, more than n_batch = %d", (int) n_tokens,
                    (int) n_batch);
    }
    if (int rc = s->check_tokens(tokens, n_tokens, "batch token", err)) {
        return rc;
    }
    // per-sequence entries must be contiguous: upstream pairs each entry with
    // its neighbour of the same sequence
    std::vector<int32_t> last_index(s->cfg.n_seq, -1);
    for (int32_t i = 0; i < n_tokens; ++i) {
        const int32_t seq = seq_ids[i];
        if (!s->seq_ok(seq)) {
            return s->bad_seq(seq, err);
        }
        if (last_index[seq] >= 0 && (last_index[seq] != i - 1 || pos[i] != pos[i - 1] + 1)) {
            return fail(err, E3_ERR_ARG,
                        "the entries of sequence %d are not contiguous with consecutive positions (batch index %d)",
                        (int) seq, (int) i);
        }
        last_index[seq] = i;
    }
    return E3_OK;
}

extern "C" int e3_spec_process(e3_spec * s, int32_t n_tokens, const int32_t * tokens, const int32_t * pos,
                               const int32_t * seq_ids, e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (int rc = check_process_batch(s, n_tokens, tokens, pos, seq_ids, err)) {
        return rc;
    }
    try {
        common_batch batch;  // process() reads only the entries, never the llama_batch_ext
        batch.tokens.reserve(n_tokens);
        for (int32_t i = 0; i < n_tokens; ++i) {
            batch.add(tokens[i], pos[i], seq_ids[i], false);
            // a position the history holds already is a rewrite (the rows of rejected drafts)
            auto & history = s->history[seq_ids[i]];
            if (pos[i] >= 0 && (size_t) pos[i] <= history.size()) {
                history.resize(pos[i]);
                history.push_back(tokens[i]);
            }
        }
        const auto t0 = clock_type::now();
        const bool ok = common_speculative_process(s->spec, batch);
        const double dt = seconds_since(t0);
        for (int32_t i = 0; i < n_tokens; ++i) {
            if (i == 0 || seq_ids[i] != seq_ids[i - 1]) {
                s->tallies[seq_ids[i]].c.n_process_calls++;
                s->tallies[seq_ids[i]].c.t_process_s += dt;
            }
        }
        if (!ok) {
            return fail(err, E3_ERR_PROCESS, "the draft model failed to decode the processed batch");
        }
    }
    E3_GUARD("process")
    return E3_OK;
}

static int check_draft_request(const e3_spec * s, int32_t n_req, const int32_t * seq_ids, const int32_t * n_past,
                               const int32_t * id_last, const int32_t * out, int32_t out_stride,
                               const int32_t * out_len, e3_error * err) {
    if (n_req < 0 || n_req > (int32_t) s->cfg.n_seq ||
        (n_req > 0 && (!seq_ids || !n_past || !id_last || !out || !out_len))) {
        return fail(err, E3_ERR_ARG, "invalid draft request");
    }
    if (out_stride < s->n_draft_max) {
        return fail(err, E3_ERR_ARG, "output rows of %d tokens cannot hold drafts of up to %d", out_stride,
                    s->n_draft_max);
    }
    std::vector<char> seen(s->cfg.n_seq, 0);
    for (int32_t i = 0; i < n_req; ++i) {
        const int32_t seq = seq_ids[i];
        if (!s->seq_ok(seq)) {
            return s->bad_seq(seq, err);
        }
        if (seen[seq]) {
            return fail(err, E3_ERR_ARG, "sequence %d requested twice in one draft call", (int) seq);
        }
        seen[seq] = 1;
        if (id_last[i] < 0 || id_last[i] >= s->n_vocab) {
            return fail(err, E3_ERR_ARG, "id_last = %d is not a token id of this vocabulary (0..%d)",
                        (int) id_last[i], (int) s->n_vocab - 1);
        }
        if (n_past[i] < 0) {
            return fail(err, E3_ERR_ARG, "n_past must be >= 0, got %d", (int) n_past[i]);
        }
        const llama_pos held = llama_memory_seq_pos_max(llama_get_memory(s->ctx_tgt), seq) + 1;
        if (n_past[i] != held) {
            return fail(err, E3_ERR_ARG,
                        "n_past = %d, but the target holds %d tokens of sequence %d; n_past must be the number of "
                        "tokens in the target's KV cache for that sequence",
                        (int) n_past[i], (int) held, (int) seq);
        }
    }
    return E3_OK;
}

// the drafters' own greedy choice (e3::greedy_draft_pick), without their sampler chain
static int32_t greedy_draft(void *, llama_context * ctx, int32_t idx, float * p) {
    const float * logits = llama_get_logits_ith(ctx, idx);
    if (!logits) {
        *p = -1.0f;
        return 0;
    }
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
    int32_t n_suppressed = 0;
    const llama_token * suppressed = llama_vocab_get_suppress_tokens(vocab, &n_suppressed);
    return e3::greedy_draft_pick(logits, llama_vocab_n_tokens(vocab), suppressed, n_suppressed, p);
}

extern "C" int e3_spec_draft(e3_spec * s, int32_t n_req, const int32_t * seq_ids, const int32_t * n_past,
                             const int32_t * id_last, const int32_t * n_max, int32_t * out, int32_t out_stride,
                             int32_t * out_len, e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (int rc = check_draft_request(s, n_req, seq_ids, n_past, id_last, out, out_stride, out_len, err)) {
        return rc;
    }
    try {
        for (int32_t i = 0; i < n_req; ++i) {
            const int32_t seq = seq_ids[i];
            auto & result = s->results[seq];
            result.clear();
            s->result_p[seq].clear();
            int32_t cap = s->n_draft_max;
            if (n_max && n_max[i] > 0 && n_max[i] < cap) {
                cap = n_max[i];
            }
            common_speculative_draft_params & dp = common_speculative_get_draft_params(s->spec, seq);
            dp.drafting = true;
            dp.n_max = cap;
            dp.pos0 = n_past[i];
            dp.id_last = id_last[i];
            // the history holds the tokens before n_past (fewer when the caller skipped
            // begin() or accept(): the n-gram drafters then see less of it)
            auto & history = s->history[seq];
            if ((int32_t) history.size() > n_past[i]) {
                history.resize(n_past[i]);
            }
            if (!s->row->draft_ctx && history.size() < s->drafter_len[seq]) {
                s->restart(seq);  // the caller went back: the n-gram drafter starts over
            }
            s->drafter_len[seq] = history.size();
            dp.prompt = &history;
            dp.result = &result;
            dp.result_p = &s->result_p[seq];
            dp.sample = s->samplers[seq].fn ? s->samplers[seq].fn : greedy_draft;
            dp.sample_user = s->samplers[seq].user;
        }
        const auto t0 = clock_type::now();
        common_speculative_draft(s->spec);
        const double dt = seconds_since(t0);

        for (int32_t i = 0; i < n_req; ++i) {
            const int32_t seq = seq_ids[i];
            const auto & result = s->results[seq];
            if (s->ctx_dft) {
                // drop what drafting wrote at and after n_past: the verify batch's
                // process() writes those positions (EAGLE-3 keeps its seed row at n_past - 1)
                llama_memory_seq_rm(llama_get_memory(s->ctx_dft), seq, n_past[i], -1);
            }
            s->pending_pos0[seq] = n_past[i];
            // a draft model's vocabulary may be larger than the target's: its draft
            // ends before the first token the target does not have
            int32_t n = (int32_t) std::min<size_t>(result.size(), (size_t) s->n_draft_max);
            for (int32_t k = 0; k < n; ++k) {
                if (result[k] < 0 || result[k] >= s->n_vocab) {
                    n = k;
                }
            }
            if (n < s->cfg.n_min) {
                n = 0;  // (the n-gram drafters do not apply n_min themselves)
            }
            std::memcpy(out + (size_t) i * out_stride, result.data(), (size_t) n * sizeof(int32_t));
            out_len[i] = n;
            s->pending[seq] = n;
            s->tallies[seq].add_draft(n, dt / n_req);
        }
    }
    E3_GUARD("draft")
    return E3_OK;
}

extern "C" void e3_spec_set_draft_sampler(e3_spec * s, int32_t seq_id, e3_draft_sample_fn fn, void * user) {
    if (s && s->seq_ok(seq_id)) {
        s->samplers[seq_id] = {fn, user};
    }
}

extern "C" const float * e3_spec_draft_probs(const e3_spec * s, int32_t seq_id) {
    return s && s->seq_ok(seq_id) && !s->result_p[seq_id].empty() ? s->result_p[seq_id].data() : nullptr;
}

extern "C" int e3_spec_accept(e3_spec * s, int32_t seq_id, int32_t n_accepted, e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (!s->seq_ok(seq_id)) {
        return s->bad_seq(seq_id, err);
    }
    const int32_t pending = s->pending[seq_id];
    if (pending < 0) {
        return fail(err, E3_ERR_STATE, "accept() for sequence %d without a draft() since the last accept()",
                    (int) seq_id);
    }
    if (n_accepted < 0 || n_accepted > pending) {
        return fail(err, E3_ERR_ARG, "n_accepted = %d, but the last draft of sequence %d has %d tokens",
                    (int) n_accepted, (int) seq_id, (int) pending);
    }
    try {
        const auto t0 = clock_type::now();
        common_speculative_accept(s->spec, seq_id, (uint16_t) n_accepted);
        // drop the draft-side rows of rejected tokens. EAGLE-3 also drops the
        // row at the new n_past - 1: its pair holds a rejected token, and the
        // next draft() or process() rewrites it
        if (s->ctx_dft) {
            const int32_t keep = s->pending_pos0[seq_id] + n_accepted + s->row->keep_extra;
            llama_memory_seq_rm(llama_get_memory(s->ctx_dft), seq_id, keep, -1);
        }
        auto & t = s->tallies[seq_id];
        t.c.t_accept_s += seconds_since(t0);
        t.add_round(pending, n_accepted);
        s->pending[seq_id] = -1;
        s->accepted_pos0[seq_id] = s->pending_pos0[seq_id];
        s->accepted_n[seq_id] = n_accepted;
    }
    E3_GUARD("accept")
    return E3_OK;
}

extern "C" int e3_spec_reset_seq(e3_spec * s, int32_t seq_id) {
    if (!s || !s->seq_ok(seq_id)) {
        return E3_ERR_SEQ;
    }
    s->forget(seq_id);
    return E3_OK;
}

extern "C" int e3_spec_pause_seq(e3_spec * s, int32_t seq_id) {
    if (!s || !s->seq_ok(seq_id)) {
        return E3_ERR_SEQ;
    }
    if (s->row->draft_ctx) {
        s->pending[seq_id] = -1;
        s->accepted_pos0[seq_id] = -1;
    } else {
        s->forget(seq_id);
    }
    return E3_OK;
}

extern "C" int32_t e3_spec_keep(e3_spec * s, int32_t seq_id, int32_t n_held, int32_t n_common, int in_step) {
    if (!s || !s->seq_ok(seq_id)) {
        return 0;
    }
    try {
        int32_t keep = std::max(0, std::min(n_common, n_held));
        if (s->row->draft_ctx && !in_step) {
            // the draft side stopped following the target after the tokens its history holds
            // (e3_spec_pause_seq): both keep no more than those but the last, and the target
            // decodes the rest again, which the draft side then follows
            keep = std::min(keep, std::max(0, (int32_t) s->history[seq_id].size() - 1));
        }
        if (s->row->kind == E3_SPEC_EAGLE3 && keep < n_held) {
            // the draft KV's pair at P is (t_{P+1}, g_P): the pair at keep - 1 holds the token
            // after the common prefix, and g there is gone. Re-decoding the last common token
            // rebuilds it; the pair before it holds only common tokens
            keep = std::max(0, keep - 1);
        } else if (s->row->kind == E3_SPEC_MTP && keep < n_held) {
            keep = 0;  // its next process() pairs the first token with the hidden row of the one
                       // before, which only the carry-over at n_held holds
        }
        s->pending[seq_id] = -1;
        s->accepted_pos0[seq_id] = -1;
        if (keep == 0) {
            s->forget(seq_id);
            return 0;
        }
        if (s->ctx_dft && keep < n_held) {
            // (EAGLE-3's pairs before keep hold common tokens only; its stale carry-over sits
            // past them, where process() builds no bridge from it)
            llama_memory_seq_rm(llama_get_memory(s->ctx_dft), seq_id, keep, -1);
        }
        if ((int32_t) s->history[seq_id].size() > keep) {
            s->history[seq_id].resize(keep);
        }
        return keep;
    } catch (...) {
        s->forget(seq_id);
        return 0;
    }
}

extern "C" int e3_spec_rewind(e3_spec * s, int32_t seq_id, int32_t n_accepted, e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (!s->seq_ok(seq_id)) {
        return s->bad_seq(seq_id, err);
    }
    const int32_t pos0 = s->accepted_pos0[seq_id];
    if (pos0 < 0 || s->pending[seq_id] >= 0 || n_accepted < 0 || n_accepted > s->accepted_n[seq_id]) {
        return fail(err, E3_ERR_STATE, "rewind of sequence %d to %d tokens without an accept() of at least as many",
                    (int) seq_id, (int) n_accepted);
    }
    try {
        if (s->row->hidden_states) {
            // accept() again: the drafter takes its carry-over from the same verify snapshot
            common_speculative_accept(s->spec, seq_id, (uint16_t) n_accepted);
        }
        if (s->ctx_dft) {
            const int32_t keep = pos0 + n_accepted + s->row->keep_extra;
            llama_memory_seq_rm(llama_get_memory(s->ctx_dft), seq_id, keep, -1);
        }
        auto & history = s->history[seq_id];
        if (history.size() > (size_t) pos0 + n_accepted + 1) {
            history.resize((size_t) pos0 + n_accepted + 1);
        }
        s->accepted_n[seq_id] = n_accepted;
    }
    E3_GUARD("rewind")
    return E3_OK;
}

extern "C" int e3_spec_copy_seq(e3_spec * s, int32_t src, int32_t dst, e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (!s->seq_ok(src)) {
        return s->bad_seq(src, err);
    }
    if (!s->seq_ok(dst)) {
        return s->bad_seq(dst, err);
    }
    if (src == dst) {
        return E3_OK;
    }
    try {
        std::vector<uint8_t> carry;
        common_speculative_get_carry(s->spec, src, carry);
        if (!common_speculative_set_carry(s->spec, dst, carry)) {
            return fail(err, E3_ERR_STATE, "the drafter refused the carry-over of sequence %d", (int) src);
        }
        if (s->ctx_dft) {
            llama_memory_t mem = llama_get_memory(s->ctx_dft);
            llama_memory_seq_rm(mem, dst, -1, -1);
            llama_memory_seq_cp(mem, src, dst, -1, -1);  // whole: sequences may live in streams of their own
        }
        s->history[dst] = s->history[src];
        s->pending[dst] = -1;
        s->accepted_pos0[dst] = -1;
        if (!s->ctx_dft) {
            s->restart(dst);
        }
    }
    E3_GUARD("copy_seq")
    return E3_OK;
}

// The drafter's state of one sequence: a magic, the history's length and tokens, the
// carry-over's length and bytes. The draft KV travels beside it (llama_state_seq_*).
static constexpr uint32_t spec_state_magic = 0x45335331;  // "E3S1"

extern "C" int e3_spec_state_get(const e3_spec * s, int32_t seq_id, uint8_t * out, size_t cap, size_t * n_out,
                                 e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (!s->seq_ok(seq_id)) {
        return s->bad_seq(seq_id, err);
    }
    try {
        std::vector<uint8_t> carry;
        common_speculative_get_carry(s->spec, seq_id, carry);
        const auto & history = s->history[seq_id];
        const uint32_t n_hist = (uint32_t) history.size();
        const uint32_t n_carry = (uint32_t) carry.size();
        const size_t need = 3 * sizeof(uint32_t) + history.size() * sizeof(int32_t) + carry.size();
        *n_out = need;
        if (!out) {
            return E3_OK;
        }
        if (cap < need) {
            return fail(err, E3_ERR_ARG, "%zu bytes cannot hold the drafter's state of %zu", cap, need);
        }
        uint8_t * p = out;
        auto put = [&](const void * data, size_t n) {
            if (n) {
                std::memcpy(p, data, n);
            }
            p += n;
        };
        put(&spec_state_magic, sizeof(uint32_t));
        put(&n_hist, sizeof(uint32_t));
        put(history.data(), history.size() * sizeof(int32_t));
        put(&n_carry, sizeof(uint32_t));
        put(carry.data(), carry.size());
    }
    E3_GUARD("state_get")
    return E3_OK;
}

extern "C" int e3_spec_state_set(e3_spec * s, int32_t seq_id, const uint8_t * data, size_t n, e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (!s->seq_ok(seq_id)) {
        return s->bad_seq(seq_id, err);
    }
    // every field is checked before anything changes
    const uint8_t * p = data;
    const uint8_t * end = data ? data + n : data;
    auto take = [&](void * dst, size_t k) {
        if (!p || (size_t) (end - p) < k) {
            return false;
        }
        if (k) {
            std::memcpy(dst, p, k);
        }
        p += k;
        return true;
    };
    uint32_t magic = 0, n_hist = 0, n_carry = 0;
    if (!take(&magic, sizeof(magic)) || magic != spec_state_magic || !take(&n_hist, sizeof(n_hist)) ||
        (size_t) (end - p) / sizeof(int32_t) < n_hist) {
        return fail(err, E3_ERR_ARG, "the drafter's state of sequence %d is malformed", (int) seq_id);
    }
    llama_tokens history(n_hist);
    take(history.data(), (size_t) n_hist * sizeof(int32_t));
    if (!take(&n_carry, sizeof(n_carry)) || (size_t) (end - p) != n_carry) {
        return fail(err, E3_ERR_ARG, "the drafter's state of sequence %d is malformed", (int) seq_id);
    }
    if (int rc = s->check_tokens(history.data(), (int32_t) std::min<uint32_t>(n_hist, INT32_MAX), "history", err)) {
        return rc;
    }
    try {
        const std::vector<uint8_t> carry(p, p + n_carry);
        if (!common_speculative_set_carry(s->spec, seq_id, carry)) {
            return fail(err, E3_ERR_ARG, "the drafter's carry-over of sequence %d does not fit this drafter "
                        "(%u bytes)", (int) seq_id, (unsigned) n_carry);
        }
        s->history[seq_id] = std::move(history);
        s->pending[seq_id] = -1;
        s->accepted_pos0[seq_id] = -1;
        s->restart(seq_id);
    }
    E3_GUARD("state_set")
    return E3_OK;
}

extern "C" int e3_spec_counters(const e3_spec * s, int32_t seq_id, e3_counters * out, const e3_histograms * hist,
                                e3_error * err) {
    if (!s) {
        return fail(err, E3_ERR_STATE, "the session is closed");
    }
    if (seq_id < -1 || seq_id >= (int32_t) s->cfg.n_seq) {
        return s->bad_seq(seq_id, err);
    }
    if (seq_id >= 0) {
        s->tallies[seq_id].copy_to(out, hist);
        return E3_OK;
    }
    e3::tally sum(s->n_draft_max);
    for (const auto & t : s->tallies) {
        sum.add(t);
    }
    sum.copy_to(out, hist);
    return E3_OK;
}

extern "C" void e3_spec_reset_counters(e3_spec * s) {
    if (!s) {
        return;
    }
    for (auto & t : s->tallies) {
        t.reset();
    }
}

extern "C" void e3_spec_print_upstream_stats(const e3_spec * s) {
    if (!s) {
        return;
    }
    try {
        common_speculative_print_stats(s->spec);
    } catch (...) {
    }
}

// ---------------------------------------------------------------------------
// The tokenizer, with its exceptions caught
// ---------------------------------------------------------------------------

extern "C" int e3_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len, int32_t * tokens,
                           int32_t n_tokens_max, int add_special, int parse_special, int32_t * n_out,
                           e3_error * err) {
    try {
        *n_out = llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special, parse_special);
    } catch (const std::exception & e) {
        return fail(err, E3_ERR_ARG, "this model's vocabulary cannot tokenize the text (llama.cpp's tokenizer "
                    "failed: %s); the file's tokenizer is incomplete", e.what());
    }
    return E3_OK;
}

extern "C" int e3_detokenize(const llama_vocab * vocab, const int32_t * tokens, int32_t n_tokens, char * text,
                             int32_t text_len_max, int remove_special, int unparse_special, int32_t * n_out,
                             e3_error * err) {
    try {
        *n_out = llama_detokenize(vocab, tokens, n_tokens, text, text_len_max, remove_special, unparse_special);
    } catch (const std::exception & e) {
        return fail(err, E3_ERR_ARG, "this model's vocabulary cannot render the tokens (llama.cpp's tokenizer "
                    "failed: %s)", e.what());
    }
    return E3_OK;
}

// ---------------------------------------------------------------------------
// Cancellation: a flag llama.cpp's abort callback reads, and SIGINT
// ---------------------------------------------------------------------------

struct e3_cancel {
    std::atomic<bool> flag{false};
};

static bool cancel_requested(void * data) {
    return static_cast<e3_cancel *>(data)->flag.load(std::memory_order_relaxed);
}

extern "C" e3_cancel * e3_cancel_attach(llama_context * ctx) {
    if (!ctx) {
        return nullptr;
    }
    auto * c = new (std::nothrow) e3_cancel;
    if (c) {
        llama_set_abort_callback(ctx, cancel_requested, c);
    }
    return c;
}

extern "C" void e3_cancel_free(e3_cancel * c) { delete c; }
extern "C" void e3_cancel_set(e3_cancel * c, int value) {
    if (c) {
        c->flag.store(value != 0);
    }
}
extern "C" int e3_cancel_get(const e3_cancel * c) { return c && c->flag.load() ? 1 : 0; }

namespace {

std::atomic<e3_cancel *> g_sigint_cancel{nullptr};
struct sigaction g_sigint_previous;

void on_sigint(int sig, siginfo_t * info, void * context) {
    if (e3_cancel * c = g_sigint_cancel.load()) {
        c->flag.store(true);
    }
    if (g_sigint_previous.sa_flags & SA_SIGINFO) {
        g_sigint_previous.sa_sigaction(sig, info, context);
    } else if (g_sigint_previous.sa_handler != SIG_DFL && g_sigint_previous.sa_handler != SIG_IGN) {
        g_sigint_previous.sa_handler(sig);
    }
}

bool is_ours(const struct sigaction & a) {
    return (a.sa_flags & SA_SIGINFO) && a.sa_sigaction == on_sigint;
}

}  // namespace

extern "C" void e3_cancel_watch_sigint(e3_cancel * c) {
    struct sigaction current;
    if (!c || sigaction(SIGINT, nullptr, &current) != 0) {
        return;
    }
    if (is_ours(current)) {
        g_sigint_cancel.store(c);
        return;
    }
    if (!(current.sa_flags & SA_SIGINFO) && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) {
        return;  // ignored, or the default action: nothing to chain to
    }
    struct sigaction ours = {};
    ours.sa_sigaction = on_sigint;
    ours.sa_flags = SA_SIGINFO | (current.sa_flags & SA_RESTART);
    sigemptyset(&ours.sa_mask);
    g_sigint_previous = current;
    g_sigint_cancel.store(c);
    sigaction(SIGINT, &ours, nullptr);
}

extern "C" void e3_cancel_unwatch_sigint(void) {
    struct sigaction current;
    if (sigaction(SIGINT, nullptr, &current) == 0 && is_ours(current)) {
        sigaction(SIGINT, &g_sigint_previous, nullptr);
    }
    g_sigint_cancel.store(nullptr);
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
