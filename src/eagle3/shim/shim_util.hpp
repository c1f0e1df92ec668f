// Helpers shared by the shim's translation units (not part of the C ABI).
#pragma once

#include "eagle3_shim.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <vector>

namespace e3 {

// Fills err (when given) and returns its status.
inline int fail(e3_error * err, int status, const char * fmt, ...) {
    if (err) {
        err->status = status;
        err->seq_id = -1;
        err->n_seq = 0;
        va_list args;
        va_start(args, fmt);
        std::vsnprintf(err->message, sizeof(err->message), fmt, args);
        va_end(args);
    }
    return status;
}

inline int fail_seq(e3_error * err, int32_t seq_id, int32_t n_seq) {
    fail(err, E3_ERR_SEQ, "sequence id %d out of range (n_seq = %d)", (int) seq_id, (int) n_seq);
    if (err) {
        err->seq_id = seq_id;
        err->n_seq = n_seq;
    }
    return E3_ERR_SEQ;
}

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// e3_counters with its histograms: what a session keeps per sequence and a
// generation per request. Every count is made by one of these methods.
struct tally {
    e3_counters c{};
    std::vector<int64_t> accepted_per_pos;  // n_draft_max entries
    std::vector<int64_t> draft_lengths;     // n_draft_max + 1 entries

    explicit tally(int32_t n_draft_max = 0)
        : accepted_per_pos(std::max(n_draft_max, 0), 0), draft_lengths(std::max(n_draft_max, 0) + 1, 0) {}

    void reset() { *this = tally((int32_t) accepted_per_pos.size()); }

    void add_draft(int32_t n_drafted, double t_s) {
        c.n_draft_calls++;
        c.n_drafted += n_drafted;
        c.t_draft_s += t_s;
    }

    // one sequence-round: a draft of n_drafted tokens (0: none) verified, n_accepted kept
    void add_round(int32_t n_drafted, int32_t n_accepted) {
        c.n_seq_rounds++;
        c.n_accepted += n_accepted;
        draft_lengths[std::min<size_t>((size_t) std::max(n_drafted, 0), draft_lengths.size() - 1)]++;
        for (int32_t k = 0; k < n_accepted && k < (int32_t) accepted_per_pos.size(); ++k) {
            accepted_per_pos[k]++;
        }
    }

    void add(const tally & o) {
        const e3_counters & b = o.c;
#define E3_ADD_COUNTER(type, name) c.name += b.name;
        E3_COUNTER_FIELDS(E3_ADD_COUNTER)
#undef E3_ADD_COUNTER
        add_hist(accepted_per_pos, o.accepted_per_pos);
        add_hist(draft_lengths, o.draft_lengths);
    }

    void copy_to(e3_counters * out, const e3_histograms * hist) const {
        if (out) {
            *out = c;
        }
        if (hist) {
            for (int32_t k = 0; k < hist->n_hist; ++k) {
                if (hist->accepted_per_pos) {
                    hist->accepted_per_pos[k] = k < (int32_t) accepted_per_pos.size() ? accepted_per_pos[k] : 0;
                }
                if (hist->draft_lengths) {
                    hist->draft_lengths[k] = k < (int32_t) draft_lengths.size() ? draft_lengths[k] : 0;
                }
            }
        }
    }

  private:
    static void add_hist(std::vector<int64_t> & a, const std::vector<int64_t> & b) {
        if (a.size() < b.size()) {
            a.resize(b.size(), 0);
        }
        for (size_t k = 0; k < b.size(); ++k) {
            a[k] += b[k];
        }
    }
};

}  // namespace e3
