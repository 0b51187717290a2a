// PowerSGD's arithmetic on one matrix (Vogels et al., NeurIPS 2019; docs/algorithms.md,
// "low_rank"): the codec's parameters, which matrices it compresses, and the kernels the
// collectives' low_rank algorithm runs on host memory. A gradient of shape (d0, d1, ...) is the
// row-major matrix rows = d0, cols = d1 * ...; its factors P (rows x r) and Q (cols x r) are
// row-major too.
//
// Every rank must reach the same bits from the same allreduced factors, whatever SIMD level or
// thread count each rank runs with: the kernels are plain loops in one fixed order of operations
// (no runtime-dispatched kernels, no reassociation: gcomp_core builds with -ffp-contract=off),
// accumulating in float64. A product of two floats is exact in float64, so an output element's
// only roundings are its k - 1 float64 additions and the final rounding to float32:
//   |computed - exact| <= 2^-24 |exact| + (k - 1) 2^-53 sum |terms| (1 + O(2^-53))
// which is what the tests hold the kernels to.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gcomp/codec.hpp"

namespace gcomp::detail {

// The powersgd codec's parameters (its spec's keys).
struct LowRankSpec {
  std::size_t rank = 1;
  bool warm_start = true;
  double min_compression_rate = 2;
  bool fp16 = false;        // values=fp16: the factors travel as binary16
  bool alternate = false;   // ACP-SGD: P on one step, Q on the next, one allreduce a step
  std::uint64_t start = 0;  // dense steps before the first compressed one
};

// The parameters of a powersgd codec; Error(internal) for any other codec.
const LowRankSpec& low_rank_spec(const Codec& codec);

// The rank a rows x cols matrix is compressed at, or 0 when it goes dense: a 1-D tensor (rows
// or cols 1) or one whose factors, (rows + cols) r, are not at least min_compression_rate times
// smaller than rows x cols.
std::size_t low_rank_of(std::uint64_t rows, std::uint64_t cols, const LowRankSpec& spec);

// p = m q: m rows x cols, q cols x r, p rows x r.
void lr_multiply(const float* m, std::size_t rows, std::size_t cols, const float* q, std::size_t r,
                 float* p);
// q = m^T p: m rows x cols, p rows x r, q cols x r; acc holds cols * r doubles of scratch.
void lr_multiply_t(const float* m, std::size_t rows, std::size_t cols, const float* p,
                   std::size_t r, float* q, double* acc);
// The columns of p (rows x r) made orthonormal by modified Gram-Schmidt in float64 (work: rows *
// r doubles): column j divided by its norm, then its projection taken from the later columns. A
// column whose norm is 0 (it lies in the span of the earlier ones, or the matrix is zero) becomes
// zero; NaN and Inf propagate.
void lr_orthonormalize(float* p, std::size_t rows, std::size_t r, double* work);
// Each column of q (n x r) divided by its norm (zero columns stay zero): the form of the
// warm-start Q that the fp16 factors start from, so that P = M Q keeps the scale of M.
void lr_normalize_columns(float* q, std::size_t n, std::size_t r);
// a b^T (a rows x r, b cols x r) as s, in float64. out (may be null) = s * out_scale; e (may be
// null) = m - float(s * share_scale), where m may be e itself. out may alias m only when e is null.
// bwork: r * cols doubles of scratch.
void lr_reconstruct(const float* a, const float* b, std::size_t rows, std::size_t cols,
                    std::size_t r, double out_scale, float* out, double share_scale, const float* m,
                    float* e, double* bwork);
// count draws uniform on [-1, 1), exact multiples of 2^-23, from the Philox stream of seed (the
// same on every rank and on the GPU): a random start for Q.
void lr_random(float* q, std::size_t count, std::uint64_t seed);

}  // namespace gcomp::detail
