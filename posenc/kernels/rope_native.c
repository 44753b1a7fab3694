/* posenc's CPU RoPE kernel: one pass over the bytes, fp32 (fp64 for double) math, any layout.
 *
 * Plain C (no Python or torch headers) so it builds in about a second with any C compiler; posenc loads it with
 * ctypes. Each "row" is one head vector of `dim` elements; the first `rdim` are rotated, the rest copied (unless
 * rotating in place). Each element is loaded, widened to float (double for fp64), rotated and rounded back once.
 *
 * Leading dimensions (up to MAX_DIMS) are described by sizes and element strides for x, out and the table; a table
 * stride of 0 broadcasts it (e.g. over heads). The table is either per row (cos/sin rows addressed by those strides)
 * or indexed: the strides then address an int64 position per row, and the row's cos/sin is row `pos` of a
 * contiguous [table_rows, rdim / 2] table. Positions are range-checked before anything is written, so a caller can
 * grow its table and retry. One call runs several launches (q and k, and the blocked pieces of each); rows of a
 * launch are split over `nthreads` pthreads.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE          /* mincore, sysconf under -std=c11 */
#endif
#include <pthread.h>
#include <stdint.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#define MAX_DIMS 8
/* input rows are prefetched this far ahead: the bf16 rows are compute-bound enough that the hardware prefetcher
 * alone leaves memory stalls; 2 KiB beat 0, 1, 4 and 8 KiB on the prefill shape here (docs/performance.md) */
#ifndef PF_BYTES
#define PF_BYTES 2048
#endif

enum { DT_F32 = 0, DT_F64 = 1, DT_BF16 = 2, DT_F16 = 3 };
enum { LAYOUT_INTERLEAVED = 0, LAYOUT_HALF = 1 };

/* one launch's geometry, prepared (and cached per shape) by the caller; pointers come with each call */
typedef struct {
    int32_t which;                       /* 0: the (x0, out0) pair of the call, 1: (x1, out1) */
    int32_t dtype, layout, inverse, copy_tail, stream, ndim, nthreads;
    int64_t x_off, out_off, table_off;   /* element offsets of this launch's first row (table: of its position) */
    int64_t dim, rdim;
    int64_t sizes[MAX_DIMS], xs[MAX_DIMS], os[MAX_DIMS], cs[MAX_DIMS];
} launch_t;

typedef struct {
    const char *x; char *out; const char *cos; const char *sin;
    const int64_t *pos;                  /* NULL: cs addresses table rows; else cs addresses positions */
    int dtype, layout, inverse, copy_tail, stream, ndim;
    int64_t sizes[MAX_DIMS], xs[MAX_DIMS], os[MAX_DIMS], cs[MAX_DIMS];
    int64_t dim, rdim, row_begin, row_end;
} job_t;

/* ---- element conversions ------------------------------------------------------------------------------ */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t f32_to_bf16(float f) {          /* round to nearest even, as torch does */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   /* NaN stays a quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- fused rows: load, convert to the math type, rotate, convert back, store; one pass ------------------- */
/* In place (out == x) is safe: pair j reads and writes only its own two slots, so no iteration touches another's
 * data. The pragma says so to the compiler, which otherwise would not vectorise a loop whose pointers may alias. */
#if defined(__clang__)
#define NO_ALIAS_LOOP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define NO_ALIAS_LOOP _Pragma("GCC ivdep")
#else
#define NO_ALIAS_LOOP
#endif

#define LOAD_F32(p) (p)
#define STORE_F32(v) (v)
#define LOAD_BF16(p) bf16_to_f32(p)
#define STORE_BF16(v) f32_to_bf16(v)
#define LOAD_F16(p) ((float)(p))
#define STORE_F16(v) ((_Float16)(v))

/* rotate one row: x, o point at the row's first element; c, s at its table row; sg = +1 or -1 (inverse) */
#define DEFINE_ROW(NAME, ET, MT, LOAD, STORE)                                                             \
static void NAME(const ET *x, ET *o, const MT *c, const MT *s, int64_t h, int layout, MT sg) {            \
    if (layout == LAYOUT_HALF) {                                                                            \
        NO_ALIAS_LOOP                                                                                       \
        for (int64_t j = 0; j < h; j++) {                                                                   \
            MT a = LOAD(x[j]), b = LOAD(x[j + h]), cj = c[j], sj = sg * s[j];                               \
            o[j] = STORE(a * cj - b * sj); o[j + h] = STORE(a * sj + b * cj);                               \
        }                                                                                                   \
    } else {                                                                                                \
        NO_ALIAS_LOOP                                                                                       \
        for (int64_t j = 0; j < h; j++) {                                                                   \
            MT a = LOAD(x[2 * j]), b = LOAD(x[2 * j + 1]), cj = c[j], sj = sg * s[j];                       \
            o[2 * j] = STORE(a * cj - b * sj); o[2 * j + 1] = STORE(a * sj + b * cj);                       \
        }                                                                                                   \
    }                                                                                                       \
}
DEFINE_ROW(row_f32, float, float, LOAD_F32, STORE_F32)
DEFINE_ROW(row_f64, double, double, LOAD_F32, STORE_F32)
DEFINE_ROW(row_bf16, uint16_t, float, LOAD_BF16, STORE_BF16)
#ifdef __FLT16_MAX__
DEFINE_ROW(row_f16, _Float16, float, LOAD_F16, STORE_F16)
#endif

/* bf16, interleaved, little-endian: one 32-bit word holds a whole pair (x[2j] in its low half), so widening and
 * narrowing are shifts and masks on 32-bit lanes instead of 16-bit shuffles (~2x faster than the generic row). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HAVE_BF16_PAIRS 1
#define LITTLE_ENDIAN_BF16_PAIRS 1
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static void row_bf16_pairs(const char *x, char *o, const float *c, const float *s, int64_t h, float sg) {
    NO_ALIAS_LOOP
    for (int64_t j = 0; j < h; j++) {
        uint32_t u;
        memcpy(&u, x + 4 * j, 4);
        float a = bits_f32(u << 16), b = bits_f32(u & 0xffff0000u), cj = c[j], sj = sg * s[j];
        uint32_t w = (uint32_t)f32_to_bf16(a * cj - b * sj) | ((uint32_t)f32_to_bf16(a * sj + b * cj) << 16);
        memcpy(o + 4 * j, &w, 4);
    }
}
#endif

/* ---- AVX-512 rows (-march=native on a CPU that has it) ------------------------------------------------------
 * The generic rows above vectorise, but for 64-pair rows gcc spends much of the time in alias checks, peeled
 * prologues and 16-bit shuffles. These take 16 pairs per step with the same arithmetic in the same order (mul, mul,
 * sub/add; no FMA) and the same bf16 rounding as f32_to_bf16, so results are bit-identical. Rows whose pair count is
 * not a multiple of 16 use the generic rows. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define HAVE_AVX512_ROWS 1

/* bf16 rounding of 16 floats, keeping each result in the HIGH half of its 32-bit lane (the low half is junk):
 * round to nearest even as f32_to_bf16 does, 4 integer ops. NaN lanes need f32_to_bf16's quiet-NaN fix-up: one
 * compare finds them, and the rare vectors holding any take the extra blend (see bf16_fix_nan). */
static inline __m512i bf16_round_hi(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
}
static inline __m512i bf16_fix_nan(__m512i r, __m512 v, __mmask16 nan) {     /* (u >> 16) | 0x40, in the high half */
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x00400000)));
}
static inline __m512 bf16_widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static void row_f32_half_avx512(const float *x, float *o, const float *restrict c,
                                const float *restrict s, int64_t h, int inverse) {
    const __m512i flip = _mm512_set1_epi32(inverse ? (int)0x80000000u : 0);   /* -s exactly, as sg * s does */
    for (int64_t j = 0; j < h; j += 16) {
        const __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + h), cj = _mm512_loadu_ps(c + j);
        const __m512 sj = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(s + j)), flip));
        _mm512_storeu_ps(o + j, _mm512_sub_ps(_mm512_mul_ps(a, cj), _mm512_mul_ps(b, sj)));
        _mm512_storeu_ps(o + j + h, _mm512_add_ps(_mm512_mul_ps(a, sj), _mm512_mul_ps(b, cj)));
    }
}

/* rotate 16 pairs (a, b) by (c, s) in fp32; flip negates sin for the inverse rotation */
static inline void rotate16(__m512 a, __m512 b, __m512 cj, const float *s, __m512i flip, __m512 *lo, __m512 *up) {
    const __m512 sj = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(s)), flip));
    *lo = _mm512_sub_ps(_mm512_mul_ps(a, cj), _mm512_mul_ps(b, sj));
    *up = _mm512_add_ps(_mm512_mul_ps(a, sj), _mm512_mul_ps(b, cj));
}

/* both results rounded to bf16 by integer ops, each in the high 16 bits of its lane */
static inline void bf16_round_both(__m512 lof, __m512 upf, __m512i *lo, __m512i *up) {
    *lo = bf16_round_hi(lof);
    *up = bf16_round_hi(upf);
    const __mmask16 nlo = _mm512_cmp_ps_mask(lof, lof, _CMP_UNORD_Q), nup = _mm512_cmp_ps_mask(upf, upf, _CMP_UNORD_Q);
    if (nlo | nup) { *lo = bf16_fix_nan(*lo, lof, nlo); *up = bf16_fix_nan(*up, upf, nup); }
}

/* With AVX512-BF16, vcvtne2ps2bf16 rounds 32 floats to bf16 in one instruction, to nearest even with the same quiet
 * NaNs as f32_to_bf16, except that it flushes denormal inputs to zero: a vector holding a denormal (vfpclassps
 * finds it) takes the integer rounding, so the output stays bit-identical either way. */
#if defined(__AVX512BF16__)
#define BF16_FAST_PACK(lof, upf) (!(_mm512_fpclass_ps_mask(lof, 0x20) | _mm512_fpclass_ps_mask(upf, 0x20)))
#else
#define BF16_FAST_PACK(lof, upf) 0
#endif

/* 32 bf16 words: lof's 16 results in the low 256 bits, upf's in the high 256 bits */
static inline __m512i bf16_pack_halves(__m512 lof, __m512 upf) {
#if defined(__AVX512BF16__)
    if (BF16_FAST_PACK(lof, upf)) return (__m512i)_mm512_cvtne2ps_pbh(upf, lof);
#endif
    /* 16-bit word k of the result: high half of lane k of lo (k < 16), then of up: words 2k+1 of lo:up */
    const __m512i odd_words = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                               31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512i lo, up;
    bf16_round_both(lof, upf, &lo, &up);
    return _mm512_permutex2var_epi16(lo, odd_words, up);
}

/* 16 32-bit words, word j = (bf16(upf[j]) << 16) | bf16(lof[j]): the interleaved layout's pairs */
static inline __m512i bf16_pack_pairs(__m512 lof, __m512 upf) {
#if defined(__AVX512BF16__)
    if (BF16_FAST_PACK(lof, upf)) {
        const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                    23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(upf, lof));
    }
#endif
    __m512i lo, up;
    bf16_round_both(lof, upf, &lo, &up);
    /* word = (lo >> 16) | (up & 0xffff0000): one ternary-logic op after the shift (A | (B & C) = 0xF8) */
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(lo, 16), up, _mm512_set1_epi32((int)0xffff0000u), 0xF8);
}

static void row_bf16_half_avx512(const uint16_t *x, uint16_t *o, const float *restrict c,
                                 const float *restrict s, int64_t h, int inverse) {
    const __m512i flip = _mm512_set1_epi32(inverse ? (int)0x80000000u : 0);
    for (int64_t j = 0; j < h; j += 16) {
        const __m512 a = bf16_widen16(x + j), b = bf16_widen16(x + j + h), cj = _mm512_loadu_ps(c + j);
        __m512 lo, up;
        rotate16(a, b, cj, s + j, flip, &lo, &up);
        const __m512i both = bf16_pack_halves(lo, up);
        _mm256_storeu_si256((__m256i *)(o + j), _mm512_castsi512_si256(both));
        _mm256_storeu_si256((__m256i *)(o + j + h), _mm512_extracti64x4_epi64(both, 1));
    }
}

/* interleaved bf16: 16 pairs = 16 32-bit words, x[2j] in the low half of word j (little-endian) */
static void row_bf16_pairs_avx512(const char *x, char *o, const float *restrict c,
                                  const float *restrict s, int64_t h, int inverse) {
    const __m512i flip = _mm512_set1_epi32(inverse ? (int)0x80000000u : 0);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t j = 0; j < h; j += 16) {
        const __m512i u = _mm512_loadu_si512((const void *)(x + 4 * j));
        const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
        const __m512 b = _mm512_castsi512_ps(_mm512_and_si512(u, top));
        const __m512 cj = _mm512_loadu_ps(c + j);
        __m512 lo, up;
        rotate16(a, b, cj, s + j, flip, &lo, &up);
        _mm512_storeu_si512((void *)(o + 4 * j), bf16_pack_pairs(lo, up));
    }
}
#endif

#ifndef LITTLE_ENDIAN_BF16_PAIRS
#define LITTLE_ENDIAN_BF16_PAIRS 0
#endif

/* ---- streaming stores ----------------------------------------------------------------------------------- */
/* An output much larger than the cache is written with non-temporal stores: a normal store first reads the
 * destination line from memory (read-for-ownership), so out-of-place RoPE would move 3 bytes per byte instead of
 * the copy's 2. Rows are rotated into a small aligned buffer, then streamed out. */
static void stream_row(char *dst, const char *src, size_t n) {
#if defined(__AVX512F__)
    if (((uintptr_t)dst & 63) == 0 && (n & 63) == 0) {     /* one 64-byte store per cache line */
        for (size_t i = 0; i < n; i += 64)
            _mm512_stream_si512((void *)(dst + i), _mm512_load_si512((const void *)(src + i)));
        return;
    }
#endif
#if defined(__SSE2__)
    if (((uintptr_t)dst & 15) == 0 && (n & 15) == 0) {
        for (size_t i = 0; i < n; i += 16)
            _mm_stream_si128((__m128i *)(dst + i), _mm_load_si128((const __m128i *)(src + i)));
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* Whether the memory just past `p` is in memory (`p` starts an output of at least 8 MiB, see stream). A fresh output straight from mmap (glibc maps allocations of 32 MiB and
 * more) is not: its first touch faults every page in, and a non-temporal store into a page that is not there yet
 * costs far more than a normal one (fp32 prefill, q+k out: 36 ms streamed against 27 ms not, and 22.6 ms for an
 * allocate-and-copy). Such outputs are written with normal stores; resident ones (reused heap memory) stream. */
static int page_resident(const void *p) {
#if defined(__linux__)
    static long page = 0;
    if (page <= 0) page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return 1;
    unsigned char v = 0;
    /* the page after the one holding p: the allocator's own header sits in the first page of a fresh mapping */
    void *start = (void *)(((uintptr_t)p & ~(uintptr_t)(page - 1)) + (uintptr_t)page);
    if (mincore(start, (size_t)page, &v) != 0) return 1;
    return v & 1;
#else
    (void)p;
    return 1;
#endif
}

static void stream_fence(void) {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/* ---- one row function per (dtype, layout, width), chosen once per launch -------------------------------- */
typedef void (*row_fn)(const char *x, char *o, const char *c, const char *s, int64_t h, int layout, int inverse);

static void rowp_f32(const char *x, char *o, const char *c, const char *s, int64_t h, int layout, int inverse) {
    row_f32((const float *)x, (float *)o, (const float *)c, (const float *)s, h, layout, inverse ? -1.0f : 1.0f);
}
static void rowp_f64(const char *x, char *o, const char *c, const char *s, int64_t h, int layout, int inverse) {
    row_f64((const double *)x, (double *)o, (const double *)c, (const double *)s, h, layout, inverse ? -1.0 : 1.0);
}
static void rowp_bf16(const char *x, char *o, const char *c, const char *s, int64_t h, int layout, int inverse) {
    row_bf16((const uint16_t *)x, (uint16_t *)o, (const float *)c, (const float *)s, h, layout,
             inverse ? -1.0f : 1.0f);
}
#ifdef HAVE_BF16_PAIRS
static void rowp_bf16_pairs(const char *x, char *o, const char *c, const char *s, int64_t h, int layout,
                            int inverse) {
    (void)layout;
    row_bf16_pairs(x, o, (const float *)c, (const float *)s, h, inverse ? -1.0f : 1.0f);
}
#endif
#ifdef __FLT16_MAX__
static void rowp_f16(const char *x, char *o, const char *c, const char *s, int64_t h, int layout, int inverse) {
    row_f16((const _Float16 *)x, (_Float16 *)o, (const float *)c, (const float *)s, h, layout,
            inverse ? -1.0f : 1.0f);
}
#endif
#ifdef HAVE_AVX512_ROWS
static void rowp_f32_half_avx512(const char *x, char *o, const char *c, const char *s, int64_t h, int layout,
                                 int inverse) {
    (void)layout;
    row_f32_half_avx512((const float *)x, (float *)o, (const float *)c, (const float *)s, h, inverse);
}
static void rowp_bf16_half_avx512(const char *x, char *o, const char *c, const char *s, int64_t h, int layout,
                                  int inverse) {
    (void)layout;
    row_bf16_half_avx512((const uint16_t *)x, (uint16_t *)o, (const float *)c, (const float *)s, h, inverse);
}
static void rowp_bf16_pairs_avx512(const char *x, char *o, const char *c, const char *s, int64_t h, int layout,
                                   int inverse) {
    (void)layout;
    row_bf16_pairs_avx512(x, o, (const float *)c, (const float *)s, h, inverse);
}
#endif

static row_fn pick_row(int dtype, int layout, int64_t h) {
    switch (dtype) {
    case DT_F32:
#ifdef HAVE_AVX512_ROWS
        if (layout == LAYOUT_HALF && h % 16 == 0) return rowp_f32_half_avx512;
#endif
        return rowp_f32;
    case DT_F64:
        return rowp_f64;
    case DT_BF16:
#ifdef HAVE_AVX512_ROWS
        if (h % 16 == 0 && layout == LAYOUT_HALF) return rowp_bf16_half_avx512;
        if (h % 16 == 0 && LITTLE_ENDIAN_BF16_PAIRS) return rowp_bf16_pairs_avx512;
#endif
#ifdef HAVE_BF16_PAIRS
        if (layout == LAYOUT_INTERLEAVED) return rowp_bf16_pairs;
#endif
        return rowp_bf16;
#ifdef __FLT16_MAX__
    case DT_F16:
        return rowp_f16;
#endif
    }
    return NULL;
}

/* ---- one thread's share of rows ------------------------------------------------------------------------- */
static void *run_rows(void *arg) {
    const job_t *jb = (const job_t *)arg;
    const int64_t dim = jb->dim, rdim = jb->rdim, h = rdim / 2;
    const int esize = jb->dtype == DT_F64 ? 8 : (jb->dtype == DT_F32 ? 4 : 2);
    const int csize = jb->dtype == DT_F64 ? 8 : 4;
    const int layout = jb->layout, inverse = jb->inverse, tail = jb->copy_tail && dim > rdim;
    const row_fn fn = pick_row(jb->dtype, layout, h);
    if (!fn) return (void *)1;

    char *buf = NULL;                              /* the row before it is streamed out */
    if (jb->stream) {
        buf = (char *)aligned_alloc(64, (size_t)((dim * esize + 63) / 64 * 64));
        if (!buf) return (void *)1;
    }

    /* multi-index of the first row, then advanced like an odometer; the last dim runs as a tight inner loop */
    const int last = jb->ndim - 1;
    int64_t idx[MAX_DIMS] = {0}, rem = jb->row_begin;
    for (int d = last; d >= 0; d--) { idx[d] = rem % jb->sizes[d]; rem /= jb->sizes[d]; }
    int64_t xo = 0, oo = 0, co = 0;                /* element offsets of the current row */
    for (int d = 0; d <= last; d++) { xo += idx[d] * jb->xs[d]; oo += idx[d] * jb->os[d]; co += idx[d] * jb->cs[d]; }
    const int64_t n_in = jb->sizes[last], xs_in = jb->xs[last], os_in = jb->os[last], cs_in = jb->cs[last];
    const size_t tail_bytes = (size_t)(dim - rdim) * esize, out_bytes = (size_t)(jb->copy_tail ? dim : rdim) * esize;
    const int64_t pf_rows = (PF_BYTES + dim * esize - 1) / (dim * esize);

    for (int64_t r = jb->row_begin; r < jb->row_end;) {
        int64_t run = n_in - idx[last];
        if (run > jb->row_end - r) run = jb->row_end - r;
        const char *xr = jb->x + xo * esize;
        char *dest = jb->out + oo * esize;
        int64_t c = co;
        for (int64_t i = 0; i < run; i++, xr += xs_in * esize, dest += os_in * esize, c += cs_in) {
            char *orow = buf ? buf : dest;
            if (i + pf_rows < run)              /* the input row pf_rows ahead, line by line */
                for (int64_t off = 0; off < dim * esize; off += 64)
                    __builtin_prefetch(xr + pf_rows * xs_in * esize + off, 0, 3);
            const int64_t tr = jb->pos ? jb->pos[c] * h : c;      /* element offset of the row's cos/sin */
            fn(xr, orow, jb->cos + tr * csize, jb->sin + tr * csize, h, layout, inverse);
            if (tail)
                memcpy(orow + rdim * esize, xr + rdim * esize, tail_bytes);
            if (buf)
                stream_row(dest, buf, out_bytes);
        }
        r += run;
        idx[last] += run; xo += run * xs_in; oo += run * os_in; co += run * cs_in;
        if (idx[last] == n_in && r < jb->row_end) {   /* carry into the outer dims like an odometer */
            idx[last] = 0; xo -= n_in * xs_in; oo -= n_in * os_in; co -= n_in * cs_in;
            for (int d = last - 1; d >= 0; d--) {
                if (++idx[d] < jb->sizes[d]) { xo += jb->xs[d]; oo += jb->os[d]; co += jb->cs[d]; break; }
                xo -= (jb->sizes[d] - 1) * jb->xs[d]; oo -= (jb->sizes[d] - 1) * jb->os[d];
                co -= (jb->sizes[d] - 1) * jb->cs[d];
                idx[d] = 0;
            }
        }
    }
    if (buf) {
        stream_fence();
        free(buf);
    }
    return (void *)0;
}

/* 1 if this build handles float16 (the compiler knows _Float16), else 0. */
int posenc_rope_has_f16(void) {
#ifdef __FLT16_MAX__
    return 1;
#else
    return 0;
#endif
}

/* Rows of one launch over nthreads threads. Returns 0, or 3 on a failed allocation. */
static int run_job(const job_t *base, int64_t rows, int nthreads) {
    if (rows == 0) return 0;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 256) nthreads = 256;
    if (nthreads > rows) nthreads = (int)rows;
    if (nthreads == 1) {
        job_t one = *base;
        one.row_begin = 0; one.row_end = rows;
        return run_rows(&one) ? 3 : 0;
    }
    job_t jobs[256];
    pthread_t tids[256];
    int started[256] = {0};
    int rc = 0;
    for (int t = 0; t < nthreads; t++) {
        jobs[t] = *base;
        jobs[t].row_begin = rows * t / nthreads;
        jobs[t].row_end = rows * (t + 1) / nthreads;
    }
    for (int t = 1; t < nthreads; t++)
        started[t] = pthread_create(&tids[t], NULL, run_rows, &jobs[t]) == 0;
    for (int t = 1; t < nthreads; t++)      /* a thread that failed to start: do its rows here */
        if (!started[t] && run_rows(&jobs[t])) rc = 3;
    if (run_rows(&jobs[0])) rc = 3;
    for (int t = 1; t < nthreads; t++) {
        void *res = NULL;
        if (started[t]) { pthread_join(tids[t], &res); if (res) rc = 3; }
    }
    return rc;
}

/* Entry point: run `n` launches over one or two tensors (q and k: x0 -> out0, x1 -> out1; pointers as plain
 * arguments, the cheapest thing to pass through ctypes); cos/sin are the table. pos: NULL (per-row table) or
 * `pos_numel` int64 positions, each of which must lie in [0, table_rows): otherwise 4 is returned before anything is
 * written. Returns 0 on success, 2 on a bad argument, 3 on a failed allocation. */
int posenc_rope_run(int n, const launch_t *launches, const void *x0, void *out0, const void *x1, void *out1,
                    const void *cos, const void *sin, const int64_t *pos, int64_t pos_numel, int64_t table_rows) {
    if (pos) {
        int64_t bad = 0;
        for (int64_t i = 0; i < pos_numel; i++)        /* one branch-free pass; any miss -> 4, nothing written */
            bad |= (pos[i] < 0) | (pos[i] >= table_rows);
        if (bad) return 4;
    }
    for (int l = 0; l < n; l++) {
        const launch_t *L = &launches[l];
        if (L->ndim < 1 || L->ndim > MAX_DIMS || L->rdim % 2 || L->rdim > L->dim || L->rdim <= 0 || L->dtype < 0
            || L->dtype > 3 || (L->dtype == DT_F16 && !posenc_rope_has_f16())) return 2;
        const int esize = L->dtype == DT_F64 ? 8 : (L->dtype == DT_F32 ? 4 : 2);
        const int csize = L->dtype == DT_F64 ? 8 : 4;
        job_t base;
        memset(&base, 0, sizeof base);
        if (L->which < 0 || L->which > 1) return 2;
        base.x = (const char *)(L->which ? x1 : x0) + L->x_off * esize;
        base.out = (char *)(L->which ? out1 : out0) + L->out_off * esize;
        if (pos) {
            base.pos = pos + L->table_off;
            base.cos = (const char *)cos; base.sin = (const char *)sin;
        } else {
            base.cos = (const char *)cos + L->table_off * csize; base.sin = (const char *)sin + L->table_off * csize;
        }
        base.dtype = L->dtype; base.layout = L->layout; base.inverse = L->inverse; base.copy_tail = L->copy_tail;
        base.ndim = L->ndim; base.stream = L->stream && base.out != base.x && page_resident(base.out);
        base.dim = L->dim; base.rdim = L->rdim;
        int64_t rows = 1;
        for (int d = 0; d < L->ndim; d++) {
            base.sizes[d] = L->sizes[d]; base.xs[d] = L->xs[d]; base.os[d] = L->os[d]; base.cs[d] = L->cs[d];
            rows *= L->sizes[d];
        }
        int rc = run_job(&base, rows, L->nthreads);
        if (rc) return rc;
    }
    return 0;
}
