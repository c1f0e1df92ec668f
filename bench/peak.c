/* The machine's peak rate of the two operations eagle3's kernels are made of,
 * with THREADS threads busy at once: 8-bit integer multiply-adds (an unsigned
 * byte times a signed byte, summed into 32 bits, as every quantized kernel
 * multiplies a weight block by a token's q8 block) and 32-bit float fused
 * multiply-adds (f32, f16 and bf16 weights). For each, the widest form this CPU
 * has, the one the kernels use: vpdpbusd on 512 bits (AVX512-VNNI) or 256 bits
 * (AVX-VNNI); without VNNI, maddubs + madd + add, the AVX2 idiom. Compiled
 * for this machine by bench/common.py (machine_peaks); prints one JSON line:
 *
 *     peak THREADS  ->  {"int8": {"op": ..., "per_s": MACs/s}, "f32": {...}}
 *
 * Every loop keeps 12 independent sums, more than any of these instructions'
 * latency times its throughput, so the figure is throughput, not latency. */

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHAINS 12
#define ROUNDS 4000000L

typedef long (*kernel_fn)(long rounds);  /* returns a value that depends on every sum */

#if defined(__AVX512F__)
typedef __m512i vec_i;
typedef __m512 vec_f;
#define LANES_F 16
#define SET1_I8 _mm512_set1_epi8
#define SET1_F _mm512_set1_ps
#define FMA_F _mm512_fmadd_ps
#define FOLD_F(v) ((long) _mm512_reduce_add_ps(v))
#define FOLD_I(v) ((long) _mm512_reduce_add_epi32(v))
#define ZERO_I _mm512_setzero_si512
#else
typedef __m256i vec_i;
typedef __m256 vec_f;
#define LANES_F 8
#define SET1_I8 _mm256_set1_epi8
#define SET1_F _mm256_set1_ps
#define FMA_F _mm256_fmadd_ps
#define FOLD_F(v) ((long) _mm256_cvtss_f32(v))
#define FOLD_I(v) ((long) _mm256_extract_epi32(v, 0))
#define ZERO_I _mm256_setzero_si256
#endif

#if defined(__AVX512VNNI__)
#define INT8_OP "vpdpbusd, 512 bits (AVX512-VNNI)"
#define INT8_STEP(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#elif defined(__AVXVNNI__)
#define INT8_OP "vpdpbusd, 256 bits (AVX-VNNI)"
#define INT8_STEP(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#elif defined(__AVX512BW__)
#define INT8_OP "vpmaddubsw + vpmaddwd + vpaddd, 512 bits (AVX512-BW)"
#define INT8_STEP(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), _mm512_set1_epi16(1)))
#else
#define INT8_OP "vpmaddubsw + vpmaddwd + vpaddd, 256 bits (AVX2)"
#define INT8_STEP(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
#endif
#define LANES_I8 ((int) sizeof(vec_i))

static long int8_loop(long rounds) {
    vec_i acc[CHAINS], b[CHAINS];
    vec_i a = SET1_I8(3);
    for (int c = 0; c < CHAINS; c++) {
        acc[c] = ZERO_I();
        b[c] = SET1_I8(-5 - c);  /* a product of its own per chain: the same one would be computed once */
    }
    for (long r = 0; r < rounds; r++) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) {
            acc[c] = INT8_STEP(acc[c], a, b[c]);
        }
        __asm__ volatile("" : "+v"(a));  /* the operands are not constants to the compiler */
    }
    long out = 0;
    for (int c = 0; c < CHAINS; c++) {
        out += FOLD_I(acc[c]);
    }
    return out;
}

static long f32_loop(long rounds) {
    vec_f acc[CHAINS];
    vec_f a = SET1_F(0.999f), b = SET1_F(1e-3f);
    for (int c = 0; c < CHAINS; c++) {
        acc[c] = SET1_F((float) c);
    }
    for (long r = 0; r < rounds; r++) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) {
            acc[c] = FMA_F(acc[c], a, b);
        }
        __asm__ volatile("" : "+v"(a));
    }
    long out = 0;
    for (int c = 0; c < CHAINS; c++) {
        out += FOLD_F(acc[c]);
    }
    return out;
}

struct job {
    kernel_fn fn;
    long rounds;
    long result;
};

static void * run_job(void * arg) {
    struct job * j = arg;
    j->result = j->fn(j->rounds);
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

/* operations per second, threads busy at once; the best of 5 tries */
static double rate(kernel_fn fn, int threads, double ops_per_round) {
    double best = 0.0;
    for (int attempt = 0; attempt < 5; attempt++) {
        pthread_t ids[256];
        struct job jobs[256];
        const double t0 = now();
        for (int t = 0; t < threads; t++) {
            jobs[t] = (struct job) { fn, ROUNDS, 0 };
            pthread_create(&ids[t], NULL, run_job, &jobs[t]);
        }
        long sink = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(ids[t], NULL);
            sink += jobs[t].result;
        }
        const double spent = now() - t0;
        __asm__ volatile("" : : "r"(sink));
        const double r = ops_per_round * (double) ROUNDS * threads / spent;
        best = r > best ? r : best;
    }
    return best;
}

int main(int argc, char ** argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "usage: peak THREADS (1-256)\n");
        return 2;
    }
    /* an int8 step multiplies LANES_I8 byte pairs; an f32 step, LANES_F floats */
    const double int8 = rate(int8_loop, threads, (double) CHAINS * LANES_I8);
    const double f32 = rate(f32_loop, threads, (double) CHAINS * LANES_F);
    printf("{\"threads\": %d, \"int8\": {\"op\": \"%s\", \"per_s\": %.6g}, "
           "\"f32\": {\"op\": \"vfmadd, %d bits\", \"per_s\": %.6g}}\n",
           threads, INT8_OP, int8, 32 * LANES_F, f32);
    return 0;
}
