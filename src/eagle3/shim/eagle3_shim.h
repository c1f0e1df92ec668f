/*
 * eagle3_shim.h: a small, stable C ABI over llama.cpp's common/speculative.h.
 *
 * This is the only interface the Python extension uses to reach the C++
 * speculative-decoding code. Every entry point catches C++ exceptions and
 * validates the arguments that would otherwise make llama.cpp abort, so a
 * caller gets an error code and a message instead of a dead process.
 *
 * Return codes: E3_OK (0) on success, a negative E3_ERR_* otherwise. When a
 * function fails it writes a NUL-terminated message into `err` (if non-NULL).
 */
#ifndef EAGLE3_SHIM_H
#define EAGLE3_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

enum e3_spec_type {
    E3_SPEC_EAGLE3 = 0, /* separate EAGLE-3 draft model fed with target hidden states */
    E3_SPEC_MTP    = 1, /* NextN (multi-token prediction) heads inside the target */
};

enum e3_status {
    E3_OK             =  0,
    E3_ERR_INIT       = -1, /* the session could not be created */
    E3_ERR_PROCESS    = -2, /* a draft-side decode inside process() failed */
    E3_ERR_SEQ        = -3, /* sequence id out of range */
    E3_ERR_ARG        = -4, /* another argument out of range */
    E3_ERR_STATE      = -5, /* call out of order (e.g. accept without draft) */
    E3_ERR_EXCEPTION  = -6, /* an unexpected C++ exception was caught */
};

typedef struct e3_spec_config {
    uint32_t n_seq;       /* number of sequences the session tracks (>= 1) */
    int32_t  n_draft_max; /* maximum draft length per draft call (>= 1) */
    int32_t  n_min;       /* drafts shorter than this are dropped (>= 0) */
    float    p_min;       /* stop drafting below this top-candidate probability */
    int32_t  type;        /* enum e3_spec_type */
} e3_spec_config;

/* Counters of one sequence, or of the whole session (seq_id = -1). */
typedef struct e3_spec_counters {
    uint64_t n_draft_calls;  /* draft requests for this sequence */
    uint64_t n_drafted;      /* tokens proposed */
    uint64_t n_accept_calls; /* accept() calls */
    uint64_t n_accepted;     /* draft tokens accepted */
    uint64_t n_process_calls;
    double   t_process_us;
    double   t_draft_us;
    double   t_accept_us;
} e3_spec_counters;

typedef struct e3_spec e3_spec;

/* Creates a session over a target context and a draft context (the EAGLE-3
 * draft context, or the MTP context of the target model). Returns NULL on
 * failure with the reason in `err`. Create it before the first target decode
 * whose batch will be passed to e3_spec_process(). */
e3_spec * e3_spec_create(struct llama_context * ctx_tgt, struct llama_context * ctx_dft,
                         const e3_spec_config * cfg, char * err, size_t n_err);

/* Frees the session. Must run before the draft context is freed. NULL-safe. */
void e3_spec_free(e3_spec * spec);

int32_t e3_spec_n_seq(const e3_spec * spec);
int32_t e3_spec_n_draft_max(const e3_spec * spec);
int32_t e3_spec_n_min(const e3_spec * spec);
int32_t e3_spec_type(const e3_spec * spec);

/* Optional: the prompt just decoded into the target for seq_id. */
int e3_spec_begin(e3_spec * spec, int32_t seq_id, const int32_t * prompt, int32_t n_prompt,
                  char * err, size_t n_err);

/* Hands the session the batch that was just decoded on the target context:
 * n_tokens entries of (token, position, first sequence id). Every sequence id
 * must be in [0, n_seq); per-sequence entries must be contiguous. */
int e3_spec_process(e3_spec * spec, int32_t n_tokens, const int32_t * tokens,
                    const int32_t * pos, const int32_t * seq_ids, char * err, size_t n_err);

/* Drafts for n_req sequences in one call. For request i: seq_ids[i], n_past[i]
 * (tokens in the target KV of that sequence), id_last[i] (last sampled token,
 * not yet decoded) and n_max[i] (cap, <= 0 for the session's n_draft_max).
 * Writes the draft of request i to out + i * out_stride and its length to
 * out_len[i]; out_stride must be >= the session's n_draft_max. */
int e3_spec_draft(e3_spec * spec, int32_t n_req, const int32_t * seq_ids,
                  const int32_t * n_past, const int32_t * id_last, const int32_t * n_max,
                  int32_t * out, int32_t out_stride, int32_t * out_len,
                  char * err, size_t n_err);

/* Reports how many tokens of the last draft of seq_id the target accepted.
 * Requires a draft for seq_id since the previous accept, and
 * 0 <= n_accepted <= its length. */
int e3_spec_accept(e3_spec * spec, int32_t seq_id, int32_t n_accepted, char * err, size_t n_err);

/* Forgets seq_id's draft state and clears its draft-side KV cache, for a new
 * generation on that sequence. */
int e3_spec_reset_seq(e3_spec * spec, int32_t seq_id);

/* Length of the draft awaiting accept() for seq_id, or -1 if none. */
int32_t e3_spec_pending(const e3_spec * spec, int32_t seq_id);

/* Counters of seq_id, or summed over all sequences when seq_id < 0. */
int e3_spec_counters_get(const e3_spec * spec, int32_t seq_id, e3_spec_counters * out);

/* Accepted-length histogram: out[k] = accept() calls that accepted more than
 * k tokens (k < n). Summed over all sequences when seq_id < 0. */
int e3_spec_accept_per_pos(const e3_spec * spec, int32_t seq_id, int64_t * out, int32_t n);

void e3_spec_reset_counters(e3_spec * spec);

/* Logs upstream's statistics line and the session's own counters. */
void e3_spec_print_stats(const e3_spec * spec);

/* EAGLE-3 support of a target architecture (general.architecture): 0 none,
 * 1 its layer inputs (target layer ids < n_layer), 2 also its final hidden
 * state (ids <= n_layer). */
int e3_eagle3_target_support(const char * arch);

/* Logging: one callback for llama.cpp, ggml and common/ messages. */
typedef void (*e3_log_callback)(int level, const char * text, void * user_data);
void e3_log_set(e3_log_callback cb, void * user_data);
/* Threshold for common/ messages, as in common_log (-1 silent ... 5 debug). */
void e3_log_set_common_verbosity(int verbosity);

#ifdef __cplusplus
}
#endif

#endif /* EAGLE3_SHIM_H */
