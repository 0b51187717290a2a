// QSGD (Alistarh et al., NeurIPS 2017): per bucket of D values its L2 norm, and per value a sign
// and a level in 0..s (s = 2^(B-1) - 1), rounded stochastically so that the decode is unbiased:
//   r = |v| * (s / norm)   (or (|v| / norm) * s when s / norm overflows), clamped to s
//   level = floor(r) + [u < r - floor(r)],   u = (16-bit Philox draw of the element) / 2^16
//   decode = (norm / s) * level, negated when the code's sign bit (v < 0) is set
// E||Q(v) - v||^2 <= min(D/s^2, sqrt(D)/s) ||v||^2 (Lemma 3.1). The norm is the canonical
// double-lane sum of squares (reduce.hpp); norms above 2^127 saturate there.
//
// Payload: params u8 bits, u8 norm kind (0 = L2), u16 zero, u32 bucket;
//          sections: ceil(n/D) float32 norms, then the codes, B bits each (bits.hpp).
// The AVX-512 kernels handle buckets whose length is a multiple of 16 (so a SIMD lane is a
// reduction lane); everything else goes through the scalar reference, which defines the bytes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "bits.hpp"
#include "bytes.hpp"
#include "chunks.hpp"
#include "codec_impl.hpp"
#include "kernels.hpp"
#include "nonfinite.hpp"
#include "philox.hpp"
#include "reduce.hpp"
#include "reduce_simd.hpp"
#include "rounding.hpp"
#include "simd.hpp"

namespace gcomp::detail {

// QSGD's payload: bits and bucket, two sections (the norms, the levels).
constexpr Layout kQsgdPayload{8, 2};

namespace {

constexpr std::size_t kWindow = 2048;  // elements of random draws generated at once (64-aligned)

// A bucket's scale (rounding.hpp) with what the kernels need beside it.
struct Quant : QsgdScale {
  int bits;
  std::uint64_t bucket;
  float levels;  // s
};

inline Quant make_quant(int bits, std::uint64_t bucket, float norm) {
  Quant q{};
  q.bits = bits;
  q.bucket = bucket;
  q.levels = qsgd_levels(bits);
  static_cast<QsgdScale&>(q) = qsgd_scale(q.levels, norm);
  return q;
}

inline float norm_from(double sum_squares) { return qsgd_norm(sum_squares); }

// One element: the code (sign bit above the level) and the decoded value.
inline std::uint32_t quantize_one(const Quant& q, float v, std::uint16_t draw, float* decoded) {
  return qsgd_code(q, q.levels, q.bits, v, draw, decoded);
}

// Draws of the elements [ws, min(ws + kWindow, end)) rounded out to 64: ws is 64-aligned.
inline void window_draws(const PhiloxStream& st, std::uint64_t ws, std::uint64_t end,
                         std::uint32_t* words) {
  const std::uint64_t stop = std::min<std::uint64_t>(ws + kWindow, (end + 63) & ~std::uint64_t{63});
  philox_fill(st, ws / 2, static_cast<std::size_t>(stop - ws) / 2, words);
}

// Scalar reference for one bucket [bs, bs + len) of src. ef (when not null) receives v - decode.
bool bucket_scalar(const PhiloxStream& st, int bits, std::uint64_t bucket, const float* src,
                   std::uint64_t bs, std::size_t len, float* norm_out, BitWriter& w, float* ef) {
  const double ss = lane_sum(
      src + bs, len, [](float a) { return static_cast<double>(a) * static_cast<double>(a); });
  if (!std::isfinite(ss)) return false;
  const Quant q = make_quant(bits, bucket, norm_from(ss));
  *norm_out = q.norm;
  std::uint32_t words[kWindow / 2];
  const std::uint64_t end = bs + len;
  for (std::uint64_t ws = bs & ~std::uint64_t{63}; ws < end; ws += kWindow) {
    window_draws(st, ws, end, words);
    const std::uint64_t lo = std::max(ws, bs);
    const std::uint64_t hi = std::min(ws + kWindow, end);
    for (std::uint64_t i = lo; i < hi; ++i) {
      const std::uint32_t word = words[(i - ws) >> 1];
      const auto draw = static_cast<std::uint16_t>((i & 1) ? word >> 16 : word & 0xffffu);
      float dec;
      w.put(quantize_one(q, src[i], draw, &dec), bits);
      if (ef) ef[i] = src[i] - dec;
    }
  }
  return true;
}

#if GCOMP_X86
GCOMP_TARGET_AVX512 inline double norm_avx512(const float* x, std::size_t len) {
  Lanes16 lanes;
  for (std::size_t i = 0; i < len; i += 16) lanes.add_squares(load_once(x + i));
  return lanes.fold();
}

// f(std::integral_constant<int, B>{}) for the code width B in 2..8 that bits names: how the SIMD
// kernels, templates on B, are picked at run time.
template <class F>
GCOMP_ALWAYS_INLINE decltype(auto) with_bits(int bits, F&& f) {
  switch (bits) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

template <int B>
inline std::uint64_t byte_mask() {
  return 0x0101010101010101ull * ((1ull << B) - 1);
}

// One bucket whose length is a multiple of 16; codes written whole bytes at a time.
template <int B>
GCOMP_TARGET_AVX512 bool bucket_avx512(const PhiloxStream& st, std::uint64_t bucket,
                                       const float* src, std::uint64_t bs, std::size_t len,
                                       float* norm_out, std::byte* codes, float* ef) {
  const double ss = norm_avx512(src + bs, len);
  if (!std::isfinite(ss)) return false;
  const Quant q = make_quant(B, bucket, norm_from(ss));
  *norm_out = q.norm;
  if (!q.use_inv) {  // tiny norms: the reference's divide form, same bytes
    BitWriter w(codes + bs * B / 8);
    return bucket_scalar(st, B, bucket, src, bs, len, norm_out, w, ef);
  }
  const __m512 inv = _mm512_set1_ps(q.inv);
  const __m512 levels = _mm512_set1_ps(q.levels);
  const __m512 step = _mm512_set1_ps(q.step);
  const __m512 scale16 = _mm512_set1_ps(0x1p-16f);
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i signbit = _mm512_set1_epi32(1 << (B - 1));
  const __m512i fsign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512 zero = _mm512_setzero_ps();
  const std::uint64_t pmask = byte_mask<B>();
  alignas(64) std::uint32_t words[kWindow / 2];
  const std::uint64_t end = bs + len;
  for (std::uint64_t ws = bs & ~std::uint64_t{63}; ws < end; ws += kWindow) {
    window_draws(st, ws, end, words);
    const std::uint64_t lo = std::max(ws, bs);
    const std::uint64_t hi = std::min(ws + kWindow, end);
    for (std::uint64_t i = lo; i < hi; i += 16) {
      const __m512 v = load_once(src + i);
      const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), absmask));
      const __m512 r = _mm512_min_ps(_mm512_mul_ps(a, inv), levels);
      const __m512 l = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      const __m512 frac = _mm512_sub_ps(r, l);
      const __m256i d16 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + (i - ws) / 2));
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(d16)), scale16);
      const __mmask16 up = _mm512_cmp_ps_mask(u, frac, _CMP_LT_OQ);
      __m512i level = _mm512_cvttps_epi32(l);
      level = _mm512_mask_add_epi32(level, up, level, one);
      const __mmask16 neg = _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
      const __m512i code = _mm512_mask_or_epi32(level, neg, level, signbit);
      const __m128i bytes = _mm512_cvtepi32_epi8(code);
      if constexpr (B == 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), bytes);
      } else {
        const std::uint64_t w0 =
            _pext_u64(static_cast<std::uint64_t>(_mm_cvtsi128_si64(bytes)), pmask);
        const std::uint64_t w1 =
            _pext_u64(static_cast<std::uint64_t>(_mm_extract_epi64(bytes, 1)), pmask);
        std::byte* o = codes + i * B / 8;
        std::memcpy(o, &w0, B);
        std::memcpy(o + B, &w1, B);
      }
      if (ef) {
        __m512 dec = _mm512_mul_ps(step, _mm512_cvtepi32_ps(level));
        dec = _mm512_castsi512_ps(
            _mm512_mask_xor_epi32(_mm512_castps_si512(dec), neg, _mm512_castps_si512(dec), fsign));
        _mm512_storeu_ps(ef + i, _mm512_sub_ps(v, dec));
      }
    }
  }
  return true;
}

GCOMP_TARGET_AVX2 inline double norm_avx2(const float* x, std::size_t len) {
  Lanes16Avx2 lanes;
  for (std::size_t i = 0; i < len; i += 16)
    lanes.add_squares(load_once8(x + i), load_once8(x + i + 8));
  return lanes.fold();
}

// The low byte of each of 8 32-bit lanes, as 8 bytes (lane 0 lowest).
GCOMP_TARGET_AVX2 inline std::uint64_t low_bytes(__m256i v) {
  const __m256i pick =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i b = _mm256_shuffle_epi8(v, pick);
  return static_cast<std::uint32_t>(_mm256_extract_epi32(b, 0)) |
         static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm256_extract_epi32(b, 4))) << 32;
}

// The same bucket kernel with AVX2, 8 elements (B bytes of codes) at a time.
template <int B>
GCOMP_TARGET_AVX2 bool bucket_avx2(const PhiloxStream& st, std::uint64_t bucket, const float* src,
                                   std::uint64_t bs, std::size_t len, float* norm_out,
                                   std::byte* codes, float* ef) {
  const double ss = norm_avx2(src + bs, len);
  if (!std::isfinite(ss)) return false;
  const Quant q = make_quant(B, bucket, norm_from(ss));
  *norm_out = q.norm;
  if (!q.use_inv) {  // tiny norms: the reference's divide form, same bytes
    BitWriter w(codes + bs * B / 8);
    return bucket_scalar(st, B, bucket, src, bs, len, norm_out, w, ef);
  }
  const __m256 inv = _mm256_set1_ps(q.inv);
  const __m256 levels = _mm256_set1_ps(q.levels);
  const __m256 step = _mm256_set1_ps(q.step);
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i signbit = _mm256_set1_epi32(1 << (B - 1));
  const __m256i fsign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256 zero = _mm256_setzero_ps();
  const std::uint64_t pmask = byte_mask<B>();
  alignas(64) std::uint32_t words[kWindow / 2];
  const std::uint64_t end = bs + len;
  for (std::uint64_t ws = bs & ~std::uint64_t{63}; ws < end; ws += kWindow) {
    window_draws(st, ws, end, words);
    const std::uint64_t lo = std::max(ws, bs);
    const std::uint64_t hi = std::min(ws + kWindow, end);
    for (std::uint64_t i = lo; i < hi; i += 8) {
      const __m256 v = load_once8(src + i);
      const __m256 a = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), absmask));
      const __m256 r = _mm256_min_ps(_mm256_mul_ps(a, inv), levels);
      const __m256 l = _mm256_floor_ps(r);
      const __m256 up =
          _mm256_cmp_ps(draws8(words + (i - ws) / 2), _mm256_sub_ps(r, l), _CMP_LT_OQ);
      // up is all ones (-1) where the level rounds up.
      const __m256i level = _mm256_sub_epi32(_mm256_cvttps_epi32(l), _mm256_castps_si256(up));
      const __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(v, zero, _CMP_LT_OQ));
      const __m256i code = _mm256_or_si256(level, _mm256_and_si256(neg, signbit));
      const std::uint64_t bytes = low_bytes(code);
      if constexpr (B == 8) {
        std::memcpy(codes + i, &bytes, 8);
      } else {
        const std::uint64_t w = _pext_u64(bytes, pmask);
        std::memcpy(codes + i * B / 8, &w, B);
      }
      if (ef) {
        __m256 dec = _mm256_mul_ps(step, _mm256_cvtepi32_ps(level));
        dec = _mm256_xor_ps(dec, _mm256_castsi256_ps(_mm256_and_si256(neg, fsign)));
        _mm256_storeu_ps(ef + i, _mm256_sub_ps(v, dec));
      }
    }
  }
  return true;
}

using BucketKernel = bool (*)(const PhiloxStream&, std::uint64_t, const float*, std::uint64_t,
                              std::size_t, float*, std::byte*, float*);
BucketKernel avx2_kernel(int bits) {
  return with_bits(bits, [](auto b) -> BucketKernel { return bucket_avx2<decltype(b)::value>; });
}

BucketKernel avx512_kernel(int bits) {
  return with_bits(bits, [](auto b) -> BucketKernel { return bucket_avx512<decltype(b)::value>; });
}

// acc[i] += alpha * decode(code i) for i in [begin, end) in steps of 8 (begin a multiple of 8);
// returns where it stopped.
template <int B>
GCOMP_TARGET_AVX2 std::uint64_t decode_range_avx2(const std::byte* codes, float step, float alpha,
                                                  std::uint64_t begin, std::uint64_t end,
                                                  float* acc) {
  const __m256 vstep = _mm256_set1_ps(step);
  const __m256 valpha = _mm256_set1_ps(alpha);
  const __m256i lmask = _mm256_set1_epi32((1 << (B - 1)) - 1);
  const std::uint64_t pmask = byte_mask<B>();
  std::uint64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    std::uint64_t r = 0;
    std::memcpy(&r, codes + i * B / 8, B);
    if constexpr (B != 8) r = _pdep_u64(r, pmask);
    const __m256i c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(r)));
    const __m256i level = _mm256_and_si256(c, lmask);
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(c, B - 1), 31);
    __m256 d = _mm256_mul_ps(vstep, _mm256_cvtepi32_ps(level));
    d = _mm256_xor_ps(d, _mm256_castsi256_ps(sign));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(valpha, d)));
  }
  return i;
}

// acc[i] += alpha * decode(code i) for i in [begin, end) in steps of 16 (begin a multiple of 16);
// returns where it stopped.
template <int B>
GCOMP_TARGET_AVX512 std::uint64_t decode_range_avx512(const std::byte* codes, float step,
                                                      float alpha, std::uint64_t begin,
                                                      std::uint64_t end, float* acc) {
  const __m512 vstep = _mm512_set1_ps(step);
  const __m512 valpha = _mm512_set1_ps(alpha);
  const __m512i lmask = _mm512_set1_epi32((1 << (B - 1)) - 1);
  const std::uint64_t pmask = byte_mask<B>();
  std::uint64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m128i bytes;
    if constexpr (B == 8) {
      bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    } else {
      std::uint64_t r0 = 0;
      std::uint64_t r1 = 0;
      std::memcpy(&r0, codes + i * B / 8, B);
      std::memcpy(&r1, codes + i * B / 8 + B, B);
      bytes = _mm_set_epi64x(static_cast<long long>(_pdep_u64(r1, pmask)),
                             static_cast<long long>(_pdep_u64(r0, pmask)));
    }
    const __m512i c = _mm512_cvtepu8_epi32(bytes);
    const __m512i level = _mm512_and_si512(c, lmask);
    const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(c, B - 1), 31);
    __m512 d = _mm512_mul_ps(vstep, _mm512_cvtepi32_ps(level));
    d = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(d), sign));
    const __m512 a = _mm512_loadu_ps(acc + i);
    _mm512_storeu_ps(acc + i, _mm512_add_ps(a, _mm512_mul_ps(valpha, d)));
  }
  return i;
}

// The SIMD part of a bucket's decode at each level: from begin (a multiple of the vector width)
// as far as whole vectors go; returns where it stopped.
struct DecodeAvx2 {
  static constexpr std::uint64_t kWidth = 8;
  GCOMP_TARGET_AVX2 static std::uint64_t run(int bits, const std::byte* codes, float step,
                                             float alpha, std::uint64_t begin, std::uint64_t end,
                                             float* acc) {
    return with_bits(bits, [&](auto b) {
      return decode_range_avx2<decltype(b)::value>(codes, step, alpha, begin, end, acc);
    });
  }
};
struct DecodeAvx512 {
  static constexpr std::uint64_t kWidth = 16;
  GCOMP_TARGET_AVX512 static std::uint64_t run(int bits, const std::byte* codes, float step,
                                               float alpha, std::uint64_t begin, std::uint64_t end,
                                               float* acc) {
    return with_bits(bits, [&](auto b) {
      return decode_range_avx512<decltype(b)::value>(codes, step, alpha, begin, end, acc);
    });
  }
};
#endif

// Chunks hold whole buckets and start on a byte boundary of the codes (a multiple of 8 elements).
std::uint64_t chunk_elements(std::uint64_t bucket) {
  std::uint64_t unit = bucket;
  while (unit % 8 != 0) unit += bucket;  // lcm(bucket, 8)
  const std::uint64_t per = std::max<std::uint64_t>(1, (std::uint64_t{1} << 15) / unit);
  return unit * per;
}

class QsgdCodec final : public CodecImpl {
 public:
  int bits = 4;
  std::uint64_t bucket = 512;

  CodecKind kind() const override { return CodecKind::qsgd; }
  std::string spec() const override {
    return "qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket);
  }
  CodecProperties properties() const override {
    CodecProperties p;
    p.unbiased = true;
    p.stochastic = true;
    p.contraction = false;  // its variance is min(D / s^2, sqrt(D) / s) |x|^2: 3.2 at 4 bits
    p.bits_per_element = bits + 32.0 / static_cast<double>(bucket);
    // Per bucket of d <= D elements, min(d / s^2, sqrt(d) / s), largest at d = D.
    const double s = std::exp2(bits - 1) - 1, d = static_cast<double>(bucket);
    p.variance_bound = std::min(d / (s * s), std::sqrt(d) / s);
    return p;
  }
  std::size_t max_bytes(std::size_t n) const override {
    return header_bytes(kQsgdPayload) + 4 * ceil_div(n, bucket) + ceil_div(n * bits, 8);
  }
  CodecParams params() const override {
    CodecParams p;
    p.bits = bits;
    p.bucket = bucket;
    return p;
  }

  std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                     std::uint64_t seed, std::byte* out, std::size_t cap) const override {
    const std::size_t need = max_bytes(n);
    require_capacity(need, cap);
    const std::uint64_t nb = ceil_div(n, bucket);
    const std::uint64_t code_bytes = ceil_div(static_cast<std::uint64_t>(n) * bits, 8);
    std::byte params[8] = {};
    params[0] = static_cast<std::byte>(bits);
    store_le<std::uint32_t>(params + 4, static_cast<std::uint32_t>(bucket));
    std::byte* norms = write_header(out, CodecKind::qsgd, n, params, {4 * nb, code_bytes});
    std::byte* codes = norms + 4 * nb;
    const PhiloxStream st = philox_stream(seed, CodecKind::qsgd);
    const std::uint64_t chunk = chunk_elements(bucket);
    std::atomic<bool> bad{false};
#if GCOMP_X86
    const BucketKernel fast = bucket % 16 != 0                    ? nullptr
                              : simd_level() == SimdLevel::avx512 ? avx512_kernel(bits)
                              : simd_level() == SimdLevel::avx2   ? avx2_kernel(bits)
                                                                  : nullptr;
#endif
    for_chunks(n, chunk, [&](std::size_t b, std::size_t e) {
      const float* src = x;
      if (e_old) {  // v = x + e into the new residual; the kernels then overwrite it with v - D
        add(x + b, e_old + b, e - b, e_new + b);
        src = e_new;
      }
      // With the SIMD kernel every bucket starts on a byte boundary and writes its own bytes;
      // otherwise one writer runs through the chunk (buckets may share a byte).
      BitWriter chunk_writer(codes + b * bits / 8);
      for (std::uint64_t bs = b; bs < e; bs += bucket) {
        const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(bucket, e - bs));
        float norm = 0;
        bool ok;
#if GCOMP_X86
        if (fast) {
          if (len == bucket) {
            ok = fast(st, bucket, src, bs, len, &norm, codes, e_new);
          } else {
            BitWriter w(codes + bs * bits / 8);
            ok = bucket_scalar(st, bits, bucket, src, bs, len, &norm, w, e_new);
            w.finish();
          }
        } else
#endif
        {
          ok = bucket_scalar(st, bits, bucket, src, bs, len, &norm, chunk_writer, e_new);
        }
        if (!ok) {
          bad.store(true, std::memory_order_relaxed);
          return;
        }
        store_le<float>(norms + 4 * (bs / bucket), norm);
      }
      chunk_writer.finish();
    });
    if (bad.load()) {
      if (e_old) throw_nonfinite_sum(x, e_old, n);
      throw_nonfinite(x, n);
    }
    return need;
  }
};

std::unique_ptr<CodecImpl> make_qsgd(SpecReader& spec) {
  auto c = std::make_unique<QsgdCodec>();
  c->bits = static_cast<int>(spec.integer("bits", 2, 8).value_or(4));
  c->bucket = spec.integer("bucket", 1, std::uint64_t{1} << 24).value_or(512);
  spec.finish();
  return c;
}

struct QsgdLayout {
  int bits;
  std::uint64_t bucket;
};

QsgdLayout qsgd_params(const Payload& p) {
  return {static_cast<int>(p.params[0]), load_le<std::uint32_t>(p.params + 4)};
}

void validate_qsgd_layout(const Payload& p) {
  const QsgdLayout l = qsgd_params(p);
  if (l.bits < 2 || l.bits > 8) bad_payload("qsgd bits " + std::to_string(l.bits) + " not in 2..8");
  if (p.params[1] != std::byte{0})
    bad_payload("unknown qsgd norm kind " + std::to_string(static_cast<int>(p.params[1])));
  if (p.params[2] != std::byte{0} || p.params[3] != std::byte{0})
    bad_payload("reserved qsgd parameter bytes are not zero");
  if (l.bucket == 0) bad_payload("qsgd bucket size 0");
  if (p.n > (std::uint64_t{1} << 60))
    bad_payload("element count " + std::to_string(p.n) + " is too large");
  const std::uint64_t nb = ceil_div(p.n, l.bucket);
  const std::uint64_t code_bytes = ceil_div(p.n * static_cast<std::uint64_t>(l.bits), 8);
  if (p.sections[0].size != 4 * nb || p.sections[1].size != code_bytes) {
    bad_payload("qsgd sections of " + std::to_string(p.sections[0].size) + " and " +
                std::to_string(p.sections[1].size) + " bytes, expected " + std::to_string(4 * nb) +
                " and " + std::to_string(code_bytes) + " for " + std::to_string(p.n) + " elements");
  }
}

void validate_qsgd(const Payload& p) {
  validate_qsgd_layout(p);
  const QsgdLayout l = qsgd_params(p);
  const std::uint64_t nb = ceil_div(p.n, l.bucket);
  const std::uint64_t code_bytes = ceil_div(p.n * static_cast<std::uint64_t>(l.bits), 8);
  for (std::uint64_t j = 0; j < nb; ++j) {
    const std::uint32_t u = load_le<std::uint32_t>(p.sections[0].data + 4 * j);
    if ((u & kInfBits) == kInfBits || (u >> 31) != 0) {
      bad_payload("qsgd norm of bucket " + std::to_string(j) + " is negative, NaN or Inf");
    }
  }
  if (!padding_is_zero(p.sections[1].data, code_bytes, p.n * l.bits)) {
    bad_payload("qsgd code padding bits are not zero");
  }
}

// acc[i] += alpha * decode(code i) for the buckets of [b, e): with Simd (DecodeAvx2 or
// DecodeAvx512) on each bucket that starts on a multiple of its width, the rest of each bucket
// in scalar code; Simd = void is the scalar reference. One call per chunk.
template <class Simd>
GCOMP_ALWAYS_INLINE void decode_buckets(const QsgdLayout& l, const std::byte* norms,
                                        const std::byte* codes, float alpha, std::uint64_t b,
                                        std::uint64_t e, float* acc) {
  const float levels = static_cast<float>((1 << (l.bits - 1)) - 1);
  const std::uint32_t level_mask = (1u << (l.bits - 1)) - 1;
  for (std::uint64_t bs = b; bs < e; bs += l.bucket) {
    const float step = load_le<float>(norms + 4 * (bs / l.bucket)) / levels;
    const std::uint64_t end = std::min<std::uint64_t>(bs + l.bucket, e);
    std::uint64_t i = bs;
    if constexpr (!std::is_void_v<Simd>) {
      if (bs % Simd::kWidth == 0) i = Simd::run(l.bits, codes, step, alpha, bs, end, acc);
    }
    for (; i < end; ++i) {
      const std::uint32_t c = get_bits(codes, i, l.bits);
      const float d = step * static_cast<float>(c & level_mask);
      acc[i] += alpha * ((c >> (l.bits - 1)) ? -d : d);
    }
  }
}

#if GCOMP_X86
GCOMP_TARGET_AVX2 void decode_buckets_avx2(const QsgdLayout& l, const std::byte* norms,
                                           const std::byte* codes, float alpha, std::uint64_t b,
                                           std::uint64_t e, float* acc) {
  decode_buckets<DecodeAvx2>(l, norms, codes, alpha, b, e, acc);
}
GCOMP_TARGET_AVX512 void decode_buckets_avx512(const QsgdLayout& l, const std::byte* norms,
                                               const std::byte* codes, float alpha, std::uint64_t b,
                                               std::uint64_t e, float* acc) {
  decode_buckets<DecodeAvx512>(l, norms, codes, alpha, b, e, acc);
}
#endif

void decode_add_qsgd(const Payload& p, float* acc, float alpha) {
  const QsgdLayout l = qsgd_params(p);
  const std::byte* norms = p.sections[0].data;
  const std::byte* codes = p.sections[1].data;
  for_chunks(p.n, chunk_elements(l.bucket), [&](std::size_t b, std::size_t e) {
#if GCOMP_X86
    if (simd_level() == SimdLevel::avx512)
      return decode_buckets_avx512(l, norms, codes, alpha, b, e, acc);
    if (simd_level() == SimdLevel::avx2)
      return decode_buckets_avx2(l, norms, codes, alpha, b, e, acc);
#endif
    decode_buckets<void>(l, norms, codes, alpha, b, e, acc);
  });
}

std::string describe_qsgd(const Payload& p) {
  const QsgdLayout l = qsgd_params(p);
  return "bits=" + std::to_string(l.bits) + ",bucket=" + std::to_string(l.bucket) + ",norm=l2";
}

}  // namespace

const CodecEntry& qsgd_entry() {
  static const CodecEntry e{
      CodecKind::qsgd,
      "qsgd",
      "QSGD: per-bucket L2 norm + B-bit sign/level, stochastic rounding (unbiased)",
      {{"bits", "4", "bits per element including the sign, 2..8 (levels s = 2^(B-1) - 1)"},
       {"bucket", "512", "elements per norm, 1..2^24"}},
      kQsgdPayload,
      make_qsgd,
      validate_qsgd,
      decode_add_qsgd,
      describe_qsgd,
      validate_qsgd_layout};
  return e;
}

}  // namespace gcomp::detail
