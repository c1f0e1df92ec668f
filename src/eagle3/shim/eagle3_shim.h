/*
 * eagle3_shim.h: a small, stable C ABI over llama.cpp's common/speculative.h.
 *
 * This is the only interface the Python extension uses to reach the C++
 * speculative-decoding code. Every entry point catches C++ exceptions and
 * checks the call arguments that would otherwise make llama.cpp abort, so a
 * caller gets a status and a message instead of a dead process. Facts about
 * the model files themselves (layer ids, hidden sizes, vocabularies) are
 * checked from their GGUF headers before a session is made (eagle3.compat).
 *
 * Return codes: E3_OK (0) on success, a negative e3_status otherwise. A
 * failing call fills the caller's e3_error (if non-NULL).
 */
#ifndef EAGLE3_SHIM_H
#define EAGLE3_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The drafters: llama.cpp's common_speculative types a session can run. What
 * each needs (a draft context, the target's hidden states) is one row of the
 * drafter table in eagle3_shim.cpp. */
enum e3_spec_kind {
    E3_SPEC_EAGLE3          = 0, /* separate EAGLE-3 draft model fed with target hidden states */
    E3_SPEC_MTP             = 1, /* NextN (multi-token prediction) heads inside the target */
    E3_SPEC_DRAFT           = 2, /* a separate small model of the target's vocabulary (draft-simple) */
    E3_SPEC_NGRAM_SIMPLE    = 3, /* n-gram lookup in the token history, no draft model */
    E3_SPEC_NGRAM_MAP_K     = 4, /* n-gram keys mapped to the m-grams that followed them */
    E3_SPEC_NGRAM_MAP_K4V   = 5, /* the same, keeping up to 4 m-grams per key */
    E3_SPEC_NGRAM_MOD       = 6, /* a hashed n-gram table shared by the sequences */
    E3_SPEC_NGRAM_CACHE     = 7, /* 1..4-gram statistics of the history, with optional cache files */
    E3_SPEC_KIND_COUNT
};

enum e3_status {
    E3_OK             =  0,
    E3_ERR_INIT       = -1, /* the session could not be created */
    E3_ERR_PROCESS    = -2, /* a draft-side decode inside process() failed */
    E3_ERR_SEQ        = -3, /* sequence id out of range */
    E3_ERR_ARG        = -4, /* another argument out of range */
    E3_ERR_STATE      = -5, /* call out of order (e.g. accept without draft) */
    E3_ERR_EXCEPTION  = -6, /* an unexpected C++ exception was caught */
    E3_ERR_DECODE     = -7, /* a target decode failed */
    E3_ERR_CONFIG     = -8, /* a session configuration value out of range */
};

/* What went wrong: the status, the offending sequence id and its bound
 * (for E3_ERR_SEQ, else -1 and 0), and a message. */
typedef struct e3_error {
    int     status;
    int32_t seq_id;
    int32_t n_seq;
    char    message[1024];
} e3_error;

/* llama.cpp's own limits (LLAMA_MAX_SEQ, LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS). */
int32_t e3_max_seq(void);
int32_t e3_max_layers(void);
int32_t e3_max_experts(void);

/* The n-gram drafters' own parameters, named as llama.cpp names them (its
 * --spec-ngram-* options and common_params_speculative_ngram_*), with its ranges. */
typedef struct e3_ngram_config {
    int32_t size_n;    /* simple, map-k, map-k4v: length of the n-gram looked up, 1..1024 */
    int32_t size_m;    /* ... and of the m-gram drafted after it, 1..1024 */
    int32_t min_hits;  /* ... and how often a key must have been seen, 1..65535 */
    int32_t n_match;   /* mod: lookup length, 1..1024 */
    int32_t mod_n_min; /* mod: drafts shorter than this are dropped, 0..1024 */
    int32_t mod_n_max; /* mod: longest draft, 0..1024 */
    const char * lookup_cache_static;  /* cache: n-gram cache files (llama-lookup-create's), NULL or "": none */
    const char * lookup_cache_dynamic;
} e3_ngram_config;

typedef struct e3_spec_config {
    uint32_t n_seq;       /* number of sequences the session tracks, 1..e3_max_seq() */
    int32_t  n_draft_max; /* maximum draft length per draft call, 1..65535 */
    int32_t  n_min;       /* drafts shorter than this are dropped, 0..n_draft_max */
    float    p_min;       /* stop drafting below this top-candidate probability, 0..1 */
    int32_t  kind;        /* enum e3_spec_kind */
    e3_ngram_config ngram;  /* the n-gram kinds' parameters; ignored by the others */
} e3_spec_config;

/* The kind's name in the Python package ("eagle3", "mtp", "draft", "ngram-simple",
 * ...), or NULL for a kind that does not exist. */
const char * e3_spec_kind_key(int32_t kind);

/* llama.cpp's defaults for the n-gram parameters. */
void e3_ngram_config_default(e3_ngram_config * out);

/* Whether a draft model's vocabulary fits the target's, by llama.cpp's rules for
 * draft-simple (same type, the same add-BOS/EOS tokens, sizes within 128 of each
 * other, the same text for every token from id 5): 1, or 0 with the reason in why. */
int e3_vocab_compatible(const struct llama_model * target, const struct llama_model * draft, char * why,
                        size_t why_len);

/* E3_OK, or E3_ERR_CONFIG with the value that is out of range. */
int e3_spec_check_config(const e3_spec_config * cfg, e3_error * err);

/* Counters of drafting and generation. One struct for every owner: a
 * session keeps one per sequence (the drafting fields), a generation one per
 * request and one for the whole call. Derived figures (acceptance, tau) are
 * defined once, in eagle3.stats. */
/* The counters, listed once: the struct below and e3::tally's sum are made from this
 * list; _shim.pxd and stats.GenerationStats are checked against it by the tests. */
#define E3_COUNTER_FIELDS(X) \
    X(int64_t, n_prompt)        /* prompt tokens (n_reused of them kept in the KV cache, the rest decoded) */ \
    X(int64_t, n_reused)        /* prompt tokens a generation kept from what the contexts held (not decoded) */ \
    X(int64_t, n_generated)     /* tokens generated */ \
    X(int64_t, n_rounds)        /* target verify passes */ \
    X(int64_t, n_seq_rounds)    /* sequences verified, summed over the passes (a session: accept() calls) */ \
    X(int64_t, n_plain_rounds)  /* sequence-rounds decoded without a draft because drafting did not pay */ \
    X(int64_t, n_draft_calls)   /* drafts requested */ \
    X(int64_t, n_drafted)       /* tokens drafted */ \
    X(int64_t, n_accepted)      /* drafted tokens accepted */ \
    X(int64_t, n_process_calls) /* process() calls, per sequence */ \
    X(double,  t_prefill_s) \
    X(double,  t_draft_s) \
    X(double,  t_verify_s)      /* target decodes of verify batches */ \
    X(double,  t_process_s) \
    X(double,  t_accept_s) \
    X(double,  t_sample_s) \
    X(double,  t_total_s)

#define E3_DECLARE_COUNTER(type, name) type name;
typedef struct e3_counters {
    E3_COUNTER_FIELDS(E3_DECLARE_COUNTER)
} e3_counters;
#undef E3_DECLARE_COUNTER

/* Histograms beside the counters, of n_hist entries each (n_draft_max + 1):
 * accepted_per_pos[k]: sequence-rounds that accepted more than k drafted tokens;
 * draft_lengths[k]: sequence-rounds that verified a draft of k tokens. */
typedef struct e3_histograms {
    int64_t * accepted_per_pos;
    int64_t * draft_lengths;
    int32_t   n_hist;
} e3_histograms;

typedef struct e3_spec e3_spec;

/* What a session is, as llama.cpp set it up. */
typedef struct e3_spec_info {
    int32_t kind;
    int32_t n_seq;
    int32_t n_draft_max;       /* effective (MTP may clamp the configured value) */
    int32_t n_min;
    int32_t need_embd;         /* post-norm embeddings on the target (llama_set_embeddings) */
    int32_t need_embd_pre_norm;/* pre-norm hidden states on the target (set up by the session) */
} e3_spec_info;

/* Creates a session over a target context and a draft context (the EAGLE-3
 * draft context, the MTP context of the target model, or a draft model's
 * context; NULL for the n-gram kinds, which draft from the token history).
 * Returns NULL on failure. Create it before the first target decode whose
 * batch will be passed to e3_spec_process(). */
e3_spec * e3_spec_create(struct llama_context * ctx_tgt, struct llama_context * ctx_dft,
                         const e3_spec_config * cfg, e3_error * err);

/* Frees the session. Must run before the draft context is freed. NULL-safe. */
void e3_spec_free(e3_spec * spec);

void e3_spec_get_info(const e3_spec * spec, e3_spec_info * out);

/* The prompt just decoded into the target for seq_id: a new generation. The
 * session keeps each sequence's token history (the n-gram drafters search it)
 * from this and from the batches e3_spec_process() is handed. */
int e3_spec_begin(e3_spec * spec, int32_t seq_id, const int32_t * prompt, int32_t n_prompt, e3_error * err);

/* Hands the session the batch that was just decoded on the target context:
 * n_tokens entries of (token, position, first sequence id), the first
 * n_tokens rows of that batch. Every sequence id must be in [0, n_seq);
 * per-sequence entries must be contiguous. */
int e3_spec_process(e3_spec * spec, int32_t n_tokens, const int32_t * tokens, const int32_t * pos,
                    const int32_t * seq_ids, e3_error * err);

/* Drafts for n_req sequences in one call. For request i: seq_ids[i], n_past[i]
 * (tokens in the target KV of that sequence), id_last[i] (last sampled token,
 * not yet decoded) and n_max[i] (cap, <= 0 for the session's n_draft_max;
 * n_max may be NULL). Writes the draft of request i to out + i * out_stride
 * and its length to out_len[i]; out_stride must be >= the session's
 * n_draft_max. */
int e3_spec_draft(e3_spec * spec, int32_t n_req, const int32_t * seq_ids, const int32_t * n_past,
                  const int32_t * id_last, const int32_t * n_max, int32_t * out, int32_t out_stride,
                  int32_t * out_len, e3_error * err);

/* Picks seq_id's drafted tokens (EAGLE-3 and MTP) in place of the drafter's greedy
 * choice, from row idx of the draft context's outputs: returns the token and sets *p to
 * its probability (compared with p_min). fn NULL: the drafter's own choice again. */
typedef int32_t (*e3_draft_sample_fn)(void * user, struct llama_context * ctx, int32_t idx, float * p);
void e3_spec_set_draft_sampler(e3_spec * spec, int32_t seq_id, e3_draft_sample_fn fn, void * user);

/* The probability the draft gave each token of seq_id's last draft (as many as it
 * drafted), or NULL when it drafted none. Valid until its next draft. */
const float * e3_spec_draft_probs(const e3_spec * spec, int32_t seq_id);

/* Reports how many tokens of the last draft of seq_id the target accepted.
 * Requires a draft for seq_id since the previous accept, and
 * 0 <= n_accepted <= its length. */
int e3_spec_accept(e3_spec * spec, int32_t seq_id, int32_t n_accepted, e3_error * err);

/* Forgets seq_id's draft state and clears its draft-side KV cache, for a new
 * generation on that sequence. */
int e3_spec_reset_seq(e3_spec * spec, int32_t seq_id);

/* seq_id's target goes on without drafts (n_draft_max="auto" chose plain decoding): a
 * drafter with a context of its own (EAGLE-3, a draft model) keeps what it followed so far,
 * for a later e3_spec_keep with in_step 0; the others forget seq_id's draft state. */
int e3_spec_pause_seq(e3_spec * spec, int32_t seq_id);

/* Prefix reuse. seq_id's target holds n_held tokens, of which a new prompt shares the
 * first n_common; in_step: the draft side followed all n_held. Returns how many target
 * positions to keep (<= n_common; 0: none), having trimmed the draft side to match: an
 * EAGLE-3 drafter re-decodes the last common token when the prompt leaves the held tokens
 * early, an MTP drafter goes on only from all n_held, a drafter with a context of its own
 * that is not in step keeps only what it followed, and the others not in step nothing. */
int32_t e3_spec_keep(e3_spec * spec, int32_t seq_id, int32_t n_held, int32_t n_common, int in_step);

/* After e3_spec_accept(seq_id, n): the round keeps only n_accepted <= n drafted tokens
 * (the generation stopped among them); the draft side goes back to match. The session's
 * counters keep what accept() counted. */
int e3_spec_rewind(e3_spec * spec, int32_t seq_id, int32_t n_accepted, e3_error * err);

/* dst's draft side becomes a copy of src's (the draft KV, the drafter's carry-over, the
 * history): a prompt prefix decoded once for several sequences. */
int e3_spec_copy_seq(e3_spec * spec, int32_t src, int32_t dst, e3_error * err);

/* The drafter's own state of seq_id (its history and carry-over; the draft KV is the draft
 * context's): e3_spec_state_get writes *n_out bytes (with out NULL, only says how many);
 * e3_spec_state_set checks all of it before it changes anything (E3_ERR_ARG). */
int e3_spec_state_get(const e3_spec * spec, int32_t seq_id, uint8_t * out, size_t cap, size_t * n_out,
                      e3_error * err);
int e3_spec_state_set(e3_spec * spec, int32_t seq_id, const uint8_t * data, size_t n, e3_error * err);

/* Counters of seq_id, or summed over all sequences when seq_id < 0; hist may be NULL. */
int e3_spec_counters(const e3_spec * spec, int32_t seq_id, e3_counters * out, const e3_histograms * hist,
                     e3_error * err);
void e3_spec_reset_counters(e3_spec * spec);

/* Logs upstream's own statistics line (common/ at trace verbosity). */
void e3_spec_print_upstream_stats(const e3_spec * spec);

/* A context's cancel flag: while it is set, llama.cpp aborts the context's
 * decodes (through its abort callback, checked between graph nodes). Attach
 * once, right after creating the context; free after freeing the context.
 * Setting and reading it is safe from any thread and from a signal handler. */
typedef struct e3_cancel e3_cancel;
e3_cancel * e3_cancel_attach(struct llama_context * ctx);
void e3_cancel_free(e3_cancel * cancel);
void e3_cancel_set(e3_cancel * cancel, int value);
int e3_cancel_get(const e3_cancel * cancel);

/* While watched, SIGINT sets the flag, then reaches the handler installed
 * before (Python's). Install from the main thread, one flag at a time;
 * nothing is installed when SIGINT is ignored or has the default action. */
void e3_cancel_watch_sigint(e3_cancel * cancel);
void e3_cancel_unwatch_sigint(void);

/* llama_tokenize and llama_detokenize, as llama.h has them (*n_out as their
 * return value), but the C++ exceptions a broken vocabulary throws (a
 * "llama" vocabulary without byte tokens, say) become E3_ERR_ARG. */
/* A GBNF grammar for a JSON schema (common/json-schema-to-grammar), or NULL (err
 * filled); free it with e3_free_string. */
char * e3_json_schema_to_grammar(const char * schema_json, e3_error * err);

/* The prompt of a chat: n_messages (role, content) pairs through the model's chat
 * template (template_override, if not NULL or empty, in its place), with the opening
 * of the assistant's turn when add_generation_prompt; NULL on failure (err filled).
 * Free it with e3_free_string. */
char * e3_chat_apply(const struct llama_model * model, const char * template_override, const char * const * roles,
                     const char * const * contents, int32_t n_messages, int add_generation_prompt, e3_error * err);
void e3_free_string(char * s);

int e3_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len, int32_t * tokens,
                int32_t n_tokens_max, int add_special, int parse_special, int32_t * n_out, e3_error * err);
int e3_detokenize(const struct llama_vocab * vocab, const int32_t * tokens, int32_t n_tokens, char * text,
                  int32_t text_len_max, int remove_special, int unparse_special, int32_t * n_out, e3_error * err);

/* EAGLE-3 support of a target architecture (general.architecture): 0 none,
 * 1 its layer inputs (target layer ids < n_layer), 2 also its final hidden
 * state (ids <= n_layer). */
int e3_eagle3_target_support(const char * arch);

/* Capture the input hidden state of layer lid (0 <= lid < n_layer) at every
 * later decode of ctx, for all tokens of the batch (what EAGLE-3 reads).
 * Capture stays on for the context's life, as an EAGLE-3 session leaves it.
 * E3_ERR_ARG for an architecture whose graph does not record layer inputs. */
int e3_capture_layer_input(struct llama_context * ctx, int32_t lid, e3_error * err);
/* Rows [n_tokens of the last decode, n_embd] of a captured layer's input, in
 * the order llama.cpp computed the batch's tokens. */
const float * e3_layer_input(struct llama_context * ctx, int32_t lid);

/* What the CPU's multi-token kernels did since the process started: weight-row
 * by token products, and the weight rows they unpacked for them. Returns 0
 * (and zeros) in a build without them. */
int e3_multi_token_counts(uint64_t * products, uint64_t * row_loads);

/* Logging: one callback for llama.cpp, ggml and common/ messages. */
typedef void (*e3_log_callback)(int level, const char * text, void * user_data);
void e3_log_set(e3_log_callback cb, void * user_data);
/* Threshold for common/ messages, as in common_log (-1 silent ... 5 debug). */
void e3_log_set_common_verbosity(int verbosity);

/* llama_process(ctx, DECODE, batch) with its C++ exceptions caught (a compute
 * buffer that cannot be allocated is thrown): E3_OK with llama.cpp's return
 * code in *rc, or E3_ERR_EXCEPTION with the message. */
struct llama_batch_ext;
int e3_decode(struct llama_context * ctx, struct llama_batch_ext * batch, int32_t * rc, e3_error * err);

/* llama_state_seq_get_size/_get_data/_set_data of seq_id (seq_id < 0: llama_state_* of the
 * whole context) with their C++ exceptions caught. e3_state_get with out NULL only says how
 * many bytes there are. e3_state_set clears the sequence (or the context) first; a state
 * llama.cpp refuses leaves it cleared (E3_ERR_ARG). llama.cpp asserts on some malformed
 * states: give it only bytes it wrote for a context like this one. */
int e3_state_get(struct llama_context * ctx, int32_t seq_id, uint8_t * out, size_t cap, size_t * n_out,
                 e3_error * err);
int e3_state_set(struct llama_context * ctx, int32_t seq_id, const uint8_t * data, size_t n, e3_error * err);

/* --- Remote devices: llama.cpp's RPC backend (eagle3_remote.cpp) ---------
 * A connection that fails never aborts: its first error is kept, it fails every
 * later request, and e3_rpc_failed() reports it, so a caller checks after each
 * step that ran on a remote device. */
typedef struct ggml_backend_device * e3_device;

/* 1 when the extension was built with the RPC backend. */
int e3_rpc_available(void);
/* Connect to the server at endpoint ("host:port") and put its devices into
 * out (at most cap); returns their number, or E3_ERR_ARG with the reason.
 * Called before a model load: failures of earlier connections are forgotten,
 * so that e3_rpc_failed() reports those met from here on. */
int32_t e3_rpc_devices(const char * endpoint, e3_device * out, int32_t cap, e3_error * err);
/* 1 (and err filled with E3_ERR_DECODE and the reason) when the connection to
 * endpoint has failed, else 0. */
int e3_rpc_failed(const char * endpoint, e3_error * err);
/* Serve this machine's CPU at endpoint until e3_rpc_stop(); E3_OK or E3_ERR_ARG. */
int e3_rpc_serve(const char * endpoint, const char * cache_dir, int32_t n_threads, e3_error * err);
void e3_rpc_stop(void);

/* Where the model is: the device of layer il (il = -1: the output layer) as
 * ggml names it ("CPU", "RPC0", ...) with its description (an RPC device's
 * endpoint); E3_ERR_ARG for a layer the model does not have. */
int e3_model_layer_device(const struct llama_model * model, int32_t il, const char ** name,
                          const char ** description);
/* The bytes of the model's weights per device (names as above), at most cap
 * entries; returns the number of devices. */
int32_t e3_model_device_bytes(const struct llama_model * model, const char ** names, uint64_t * bytes, int32_t cap);

#ifdef __cplusplus
}
#endif

#endif /* EAGLE3_SHIM_H */
