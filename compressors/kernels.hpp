// The element-wise loops the codecs spend their time in, compiled for every SIMD level and run at
// the level in use (simd.hpp): the compiler vectorizes each for the baseline, AVX2 and AVX-512,
// and the half-precision conversions use F16C (AVX2) and AVX-512 instructions directly. All give
// the same bytes at every level. Functions that "check" return true when they met a NaN or Inf.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gcomp::detail {

// v = x + e, checked (the sum).
bool add_checked(const float* x, const float* e, std::size_t n, float* v) noexcept;
// v = x + e, unchecked.
void add(const float* x, const float* e, std::size_t n, float* v) noexcept;
// Whether x[0..n) holds a NaN or Inf; whether x + e does.
bool any_nonfinite(const float* x, std::size_t n) noexcept;
bool any_nonfinite_sum(const float* x, const float* e, std::size_t n) noexcept;
// The largest |x| (of x + e; of v = x + e, written) as its bits, abs_bits: monotone in |x| for
// finite values and >= kInfBits exactly when a NaN or Inf is among them. One pass, the check and
// the magnitude together.
std::uint32_t max_abs_bits(const float* x, std::size_t n) noexcept;
std::uint32_t max_abs_bits_sum(const float* x, const float* e, std::size_t n) noexcept;
std::uint32_t add_max_abs_bits(const float* x, const float* e, std::size_t n, float* v) noexcept;
// keys = abs_bits(v) (monotone in |v|), checked.
bool abs_keys(const float* v, std::size_t n, std::uint32_t* keys) noexcept;
// The positions i (ascending) of the keys[i] >= t, into pos; returns their count. pos must have
// room for n + 16 (the SIMD form stores whole vectors).
std::size_t positions_at_least(const std::uint32_t* keys, std::size_t n, std::uint32_t t,
                               std::uint32_t* pos) noexcept;

// The cast codecs' one pass (none, fp16, bf16): v = x (+ e when e is not null), written to out (any
// alignment) as little-endian float32, fp16 or bf16 (round to nearest even, saturating: half.hpp);
// with error feedback (e and e_new not null) also e_new = v - the value sent. Checked (v).
bool encode_f32(const float* x, const float* e, std::size_t n, std::byte* out,
                float* e_new) noexcept;
bool encode_half(const float* x, const float* e, std::size_t n, std::byte* out,
                 float* e_new) noexcept;
bool encode_bf16(const float* x, const float* e, std::size_t n, std::byte* out,
                 float* e_new) noexcept;

// acc += alpha * v for the n little-endian float32, fp16 or bf16 values at v (any alignment).
void add_scaled_f32(float* acc, const std::byte* v, float alpha, std::size_t n) noexcept;
void add_scaled_half(float* acc, const std::byte* v, float alpha, std::size_t n) noexcept;
void add_scaled_bf16(float* acc, const std::byte* v, float alpha, std::size_t n) noexcept;
// acc[idx_j] += alpha * value_j for a sparse payload's nnz entries: little-endian indices of
// index_bytes (4 or 8) at ip, values at vp as float32 or (fp16) IEEE half.
void scatter_add(float* acc, const std::byte* ip, const std::byte* vp, std::size_t nnz,
                 std::size_t index_bytes, bool fp16, float alpha) noexcept;
// Whether the nnz little-endian indices of `bytes` bytes each (4 or 8) at ip are strictly
// increasing and below n.
bool indices_valid(const std::byte* ip, std::size_t nnz, std::size_t bytes,
                   std::uint64_t n) noexcept;
// The sign codec's residual: e -= (e < 0 ? -scale : scale), i.e. v minus its decode.
void subtract_signs(float* e, std::size_t n, float scale) noexcept;
// Whether the n little-endian words of `bytes` bytes each (2 or 4) at d hold a value whose
// exponent bits (`inf`: 0x7c00 fp16, 0x7f80 bf16, 0x7f800000 float32) are all set.
bool any_inf_bits(const std::byte* d, std::size_t n, std::size_t bytes, std::uint32_t inf) noexcept;

}  // namespace gcomp::detail
