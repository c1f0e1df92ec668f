// draft_tuner.hpp: how n_draft_max="auto" chooses the draft length, from what a
// session measures as it runs (the engine feeds it each round's time and acceptance).
#ifndef EAGLE3_DRAFT_TUNER_HPP
#define EAGLE3_DRAFT_TUNER_HPP

#include <algorithm>
#include <cstdint>
#include <vector>

namespace e3 {

// n_draft_max="auto": the draft length that gives the most tokens per second,
// from the session's own measurements. A round with k drafted tokens per
// sequence is modelled as t_fixed + (tokens drafted) * t_per_draft(k), where
// t_fixed is a measured round without drafts (verify + process) and
// t_per_draft(k) what each drafted token added in the rounds that drafted k
// per sequence (a verify pass's cost grows faster than its size on a CPU:
// the second token of a pass can cost half what the third does), never less
// than the draft call that made it (a probe slowed by another process would
// otherwise make drafting look free): the lower third of the latest
// cost_window such rounds. Another process can only slow a round, and a
// probe's figure is the faster of its two rounds: an average of every round
// charged drafting for the machine's noise that the plain step was spared,
// and tipped near calls to plain decoding. A length not measured yet takes
// the average over all lengths. A round yields
// 1 + sum_j prod_{i<j} p_i tokens per sequence, p_i being the acceptance of
// draft position i once reached (its prior: the position before it, weighted
// as two drafts; 1/2 for the first). Plain decoding (no draft and no process)
// costs t_plain a step; when it beats every draft length the generation goes
// on plainly (see best() for when that may be decided). Costs carry over to
// the session's next generations (acceptance at half weight), and every
// relearn_every-th generation measures afresh.
struct draft_tuner {
    static constexpr int32_t probe_every = 64;   // rounds between fixed-cost probes (the first ones first)
    static constexpr int32_t relearn_every = 8;  // generations between fresh starts
    static constexpr double  smoothing = 0.3;    // weight of a new measurement
    static constexpr int32_t position_samples = 16;  // drafts reaching a position before its acceptance is known
    static constexpr int32_t rounds_to_decide = 6;   // rounds at the shortest length before plain decoding can win
    static constexpr double  close_call = 0.95;      // speculation within this of plain decoding is tried again
    static constexpr double  reprobe_below = 0.9;    // a round with drafts this much cheaper than t_fixed: probe again
    static constexpr size_t  cost_window = 15;       // the latest rounds whose per-draft costs are kept, per length

    double t_fixed = 0.0;      // a round without drafts: one-token verify + process
    double t_plain = 0.0;      // a plain step: one-token verify
    double t_per_draft = 0.0;  // each drafted token: its draft step, verify row, process row
    double probe_fixed = 0.0, probe_plain = 0.0;  // the probe under way: its fastest round so far
    int64_t reprobe_at = -1;   // the first round of an extra probe (-1: none due)
    std::vector<std::vector<double>> costs_at;  // the same from the latest rounds that drafted k per sequence
    std::vector<double> lower_third_at;  // the lower third of costs_at[k] (cost_per_draft), kept as rounds come
    std::vector<int32_t> n_rounds_at;    // how many such rounds (index k)
    int32_t n_spec_rounds = 0;
    int32_t n_gen_spec_rounds = 0;  // the same, in this generation
    int32_t last_pass = 0;     // the tokens of the last verify pass
    bool skipped = false;      // the last round was not counted
    std::vector<char> seen;    // verify pass sizes met so far
    std::vector<int64_t> reached, accepted;  // per draft position

    void reset(int32_t n_draft) {
        *this = draft_tuner{};
        reached.assign(std::max(n_draft, 1), 0);
        accepted.assign(std::max(n_draft, 1), 0);
        costs_at.assign(std::max(n_draft, 1) + 1, {});
        lower_third_at.assign(std::max(n_draft, 1) + 1, 0.0);
        n_rounds_at.assign(std::max(n_draft, 1) + 1, 0);
    }

    // a new generation of the same session: the costs stand, acceptance counts half
    void carry_over(int32_t n_draft) {
        if ((int32_t) reached.size() != std::max(n_draft, 1)) {
            reset(n_draft);
            return;
        }
        for (size_t i = 0; i < reached.size(); ++i) {
            reached[i] /= 2;
            accepted[i] /= 2;
        }
        n_gen_spec_rounds = 0;
        reprobe_at = -1;  // a generation's rounds count from 0, and its first probe is due
    }

    static void blend(double & avg, double x) { avg = avg == 0.0 ? x : avg + smoothing * (x - avg); }

    // A probe is three rounds without drafts: the first rebuilds the target's
    // graph for a one-token pass (as every change of pass size does), the
    // other two are timed and the faster counts (another process taking the
    // CPU can only slow a round). One opens every probe_every rounds, and one
    // more as soon as a round with drafts costs less than t_fixed says a
    // round without them does: the last probe was slowed, and its figure
    // would make drafting look free (it is dropped, see add_round).
    static constexpr int32_t probe_rounds = 3;

    int32_t probe_step(int64_t round) const {
        return reprobe_at >= 0 && round >= reprobe_at ? (int32_t) (round - reprobe_at) : (int32_t) (round % probe_every);
    }

    bool probe_due(int64_t round) const { return probe_step(round) < probe_rounds; }

    void add_probe(int64_t round, double t_round, double t_process, int32_t n_pass) {
        last_pass = n_pass;
        const int32_t step = probe_step(round);
        if (step == 1) {
            probe_fixed = t_round;
            probe_plain = t_round - t_process;
        } else if (step == 2) {
            probe_fixed = std::min(probe_fixed, t_round);
            probe_plain = std::min(probe_plain, t_round - t_process);
            reprobe_at = -1;
            blend(t_fixed, probe_fixed);
            blend(t_plain, probe_plain);
        }
    }

    void add_draft(int32_t draft_len, int32_t n_acc) {
        for (int32_t i = 0; i < draft_len && i <= n_acc && i < (int32_t) reached.size(); ++i) {
            reached[i]++;
            accepted[i] += i < n_acc;
        }
    }

    // whether draft position i (0: the first) has been reached too few times to
    // know its acceptance (see explore_longer)
    bool learning(int32_t i) const {
        return i < (int32_t) reached.size() && reached[i] < position_samples;
    }

    // A round whose verify pass is of a size not met before grows llama.cpp's
    // compute buffers, and one whose size differs from the last rebuilds the
    // target's graph (llama.cpp reuses only the last): neither is what a round
    // costs. Where the size changes every round, every other round counts.
    void add_round(int64_t round, double t_round, double t_draft, int32_t n_drafted, int32_t n_pass, int32_t n_live) {
        if ((size_t) n_pass >= seen.size()) {
            seen.resize(n_pass + 1, 0);
        }
        const bool skip = !seen[n_pass] || (n_pass != last_pass && !skipped);
        seen[n_pass] = 1;
        last_pass = n_pass;
        skipped = skip;
        if (n_drafted > 0 && t_fixed > 0.0 && !skip) {
            if (t_round < reprobe_below * t_fixed) {
                // the figures came from a slowed probe: unknown (nothing is
                // counted or decided) until the next probe, which sets them
                t_fixed = t_plain = 0.0;
                reprobe_at = round + 1;
                return;
            }
            const double per_draft = std::max(t_draft, t_round - t_fixed) / n_drafted;
            blend(t_per_draft, per_draft);
            const int32_t k = std::min((n_drafted + n_live - 1) / std::max(n_live, 1), (int32_t) n_rounds_at.size() - 1);
            if (k >= 0) {
                std::vector<double> & costs = costs_at[k];
                if (costs.size() == cost_window) {
                    costs.erase(costs.begin());
                }
                costs.push_back(per_draft);
                std::vector<double> sorted = costs;
                const auto third = sorted.begin() + (sorted.size() - 1) / 3;
                std::nth_element(sorted.begin(), third, sorted.end());
                lower_third_at[k] = *third;
                n_rounds_at[k]++;
            }
            n_spec_rounds++;
            n_gen_spec_rounds++;
        }
    }

    // what each drafted token costs in a round that drafts k per sequence
    double cost_per_draft(int32_t k) const {
        if (k >= (int32_t) costs_at.size() || costs_at[k].size() < 2) {
            return t_per_draft;
        }
        return lower_third_at[k];
    }

    // tokens per second and sequence when each of n_live sequences drafts k
    // (k >= 1), from the costs measured so far; with optimistic, the last
    // position's acceptance is taken as 1 (what a length not yet learned could
    // give at best)
    double rate(int32_t k, int32_t n_live, bool optimistic) const {
        double tokens = 1.0, reach = 1.0, p = 0.5;
        for (int32_t j = 1; j <= k; ++j) {
            const int32_t i = std::min(j - 1, (int32_t) reached.size() - 1);
            p = (accepted[i] + 2.0 * p) / (reached[i] + 2.0);
            reach *= optimistic && j == k ? 1.0 : p;
            tokens += reach;
        }
        return tokens / (t_fixed + n_live * k * cost_per_draft(k));
    }

    // whether a sequence that drafted len tokens, all accepted, should draft
    // one more next round to learn position len's acceptance: only while it is
    // unknown and while len + 1 could beat len even if every such draft were
    // accepted (on a CPU, where a longer verify pass costs more, often it cannot)
    bool explore_longer(int32_t len, int32_t n_draft, int32_t n_live) const {
        if (len >= n_draft || !learning(len)) {
            return false;
        }
        if (n_spec_rounds < 1 || t_fixed <= 0.0 || len < 1) {
            return true;
        }
        return rate(len + 1, n_live, true) > rate(len, n_live, false);
    }

    // the best draft length in [n_min, n_draft] for n_live sequences (0:
    // plain decoding), or -1 while there is too little to go on. Plain
    // decoding is final for the generation, so it must win by a margin while
    // measurements are few; once they are many, speculation must win by 2%
    // (a gain inside the timing noise is not worth the risk of a loss; a
    // larger margin gave up on a head that ran 8-10% faster than plain
    // decoding, whose estimate had come out at 3-5% after a few rounds).
    // Nor is plain decoding chosen before the shortest length has had
    // rounds_to_decide rounds of its own (an average over longer drafts
    // overstates what a short one costs), nor, where speculation came within
    // close_call of it, before this generation has had as many rounds of its
    // own: acceptance differs from prompt to prompt, and a near tie decided on
    // one prompt would otherwise hold for the next ones.
    int32_t best(int32_t n_min, int32_t n_draft, int32_t n_live) const {
        if (n_spec_rounds < 1 || t_plain <= 0.0) {
            return -1;
        }
        const int32_t k_min = std::max(n_min, 1);
        int32_t best_k = 0, best_spec_k = 0;
        double best_rate = (1.02 - 0.42 / n_spec_rounds) / t_plain, best_spec_rate = 0.0;
        for (int32_t k = k_min; k <= n_draft; ++k) {
            const double r = rate(k, n_live, false);
            if (r > best_spec_rate) {
                best_spec_rate = r;
                best_spec_k = k;
            }
            if (r > best_rate) {
                best_rate = r;
                best_k = k;
            }
        }
        if (best_k == 0 && best_spec_k > 0) {
            if (k_min < (int32_t) n_rounds_at.size() && n_rounds_at[k_min] < rounds_to_decide) {
                return k_min;  // the shortest length, not yet measured on its own
            }
            if (best_spec_rate * t_plain >= close_call && n_gen_spec_rounds < rounds_to_decide) {
                return best_spec_k;  // a near tie, not yet measured on this generation's prompt
            }
        }
        return best_k;
    }
};

}  // namespace e3

#endif  // EAGLE3_DRAFT_TUNER_HPP
