/* gcomp C API: gradient compressors behind an opaque handle, usable from C99.
 *
 * A codec is built from a spec string ("topk:ratio=0.01", "qsgd:bits=4", "sign", ...; `gcomp list`
 * prints them all). It encodes a float32 tensor into a self-describing payload
 * (docs/wire-format.md) and any payload can be added back into a dense accumulator with
 * gcomp_decode_add(), which needs no codec handle because the payload names its codec.
 *
 * Errors: every call that can fail returns a gcomp_status; on failure gcomp_last_error() returns a
 * message for this thread that names the offending value. No C++ exception crosses this API.
 *
 * Threads: a gcomp_codec may be used by several threads at once (it is immutable once created).
 * A gcomp_ef belongs to one tensor and may be used by one thread at a time. The library's own
 * threading is set by gcomp_set_num_threads() or the GCOMP_NUM_THREADS environment variable
 * (default 1; a malformed value makes gcomp_codec_create and gcomp_decode_add fail with
 * GCOMP_ERR_INVALID_ARGUMENT).
 */
#ifndef GCOMP_GCOMP_H
#define GCOMP_GCOMP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  GCOMP_OK = 0,
  GCOMP_ERR_INVALID_ARGUMENT, /* a bad spec, a null pointer, sizes that do not agree */
  GCOMP_ERR_BAD_PAYLOAD,      /* a payload that is truncated, corrupt or of an unknown version */
  GCOMP_ERR_BUFFER_TOO_SMALL, /* the output capacity is below what the encoding needs */
  GCOMP_ERR_NONFINITE,        /* the input holds NaN or Inf (the message names the first index) */
  GCOMP_ERR_MPI,
  GCOMP_ERR_CUDA,
  GCOMP_ERR_MISMATCH, /* two parties disagree: a payload's element count and the caller's n */
  GCOMP_ERR_INTERNAL,
  GCOMP_ERR_TIMEOUT, /* a collective waited past GCOMP_TIMEOUT_SECONDS for a rank that did not
                        come (gcomp_mpi.h) */
  GCOMP_ERR_TRANSPORT /* the Gloo transport failed: a connection closed (a process gone) */
} gcomp_status;

typedef struct gcomp_codec_s* gcomp_codec; /* a compressor built from a spec string */
typedef struct gcomp_ef_s* gcomp_ef;       /* error-feedback memory for one tensor */

/* Builds a codec from `spec`. On failure *out is set to NULL and the message names the spec and
 * the bad part (unknown name, unknown key, value out of range). */
gcomp_status gcomp_codec_create(const char* spec, gcomp_codec* out);

/* Frees a codec; NULL is ignored. */
void gcomp_codec_destroy(gcomp_codec codec);

/* An upper bound of the bytes an encoding of n floats takes (exact for every codec but threshold,
 * whose bound assumes every element passes). Returns 0 for a NULL codec and for n above 2^60 (whose
 * bound would not fit); gcomp_last_error() then says which. */
size_t gcomp_codec_max_bytes(gcomp_codec codec, size_t n);

/* Encodes x[0..n) into out. `seed` drives the stochastic codecs (same seed, same bytes).
 * *written receives the payload size; on GCOMP_ERR_BUFFER_TOO_SMALL it receives
 * gcomp_codec_max_bytes(codec, n), a capacity that is always enough.
 * Non-finite input fails with GCOMP_ERR_NONFINITE. */
gcomp_status gcomp_encode(gcomp_codec codec, const float* x, size_t n, uint64_t seed, void* out,
                          size_t capacity, size_t* written);

/* Creates zeroed error-feedback memory for a tensor of n floats. GCOMP_ERR_INVALID_ARGUMENT for
 * n above 2^60, GCOMP_ERR_INTERNAL when memory runs out (the message names this call). */
gcomp_status gcomp_ef_create(size_t n, gcomp_ef* out);

/* Frees error-feedback memory; NULL is ignored. */
void gcomp_ef_destroy(gcomp_ef ef);

/* Error-feedback encode: v = x + e; payload = C(v); e = v - D(payload). n must equal the size the
 * memory was created with. On any failure the memory is left exactly as it was. */
gcomp_status gcomp_encode_ef(gcomp_codec codec, gcomp_ef ef, const float* x, size_t n,
                             uint64_t seed, void* out, size_t capacity, size_t* written);

/* acc[i] += alpha * decode(payload)[i]; n must equal the payload's element count.
 * The payload is validated in full before acc is touched: on any error acc is unchanged. */
gcomp_status gcomp_decode_add(const void* payload, size_t bytes, float* acc, size_t n, float alpha);

/* This thread's message for its last failed call ("" when none failed yet). */
const char* gcomp_last_error(void);

/* Threads the library may use inside one call (>= 1; default from GCOMP_NUM_THREADS, else 1). */
gcomp_status gcomp_set_num_threads(int threads);

/* The library's version, "MAJOR.MINOR.PATCH". */
const char* gcomp_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GCOMP_GCOMP_H */
