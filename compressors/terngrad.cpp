// TernGrad (Wen et al., NeurIPS 2017): every element becomes s * {-1, 0, +1}, drawn so that the
// decode's expectation equals the (clipped) input:
//   sigma = standard deviation of the tensor (canonical double sums, reduce.hpp)
//   c = float(clip * sigma); clipping is active when clip > 0 and c > 0: g = clamp(v, -c, c)
//   s = max |g|  (= min(max |v|, c) when clipping)
//   b = [u * s < |g|],  u = (16-bit Philox draw of the element) / 2^16;  code = b ? sign : 0
// so P(b) = |g| / s up to 2^-16 and E[decode] = g. One scaler per tensor, as in the paper's
// layer-wise ternarizing. A constant tensor (sigma = 0) is not clipped, so it is not zeroed.
//
// Payload: params f32 clip; sections: f32 s, then 2-bit codes (0 = zero, 1 = +s, 2 = -s;
// 3 is invalid).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

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

// TernGrad's payload: its clip, two sections (the scale, the ternary codes).
constexpr Layout kTernGradPayload{4, 2};

// The scratch vectors (parallel.hpp): per-block statistics and the two sums.
struct TernGradBlocks;
struct TernGradSums;
struct TernGradSquares;

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 16;  // multiple of kReduceBlock and of 64
constexpr std::size_t kWindow = 2048;

struct BlockStats {
  double sum;
  double sum_squares;
  std::uint32_t max_abs_bits;  // bits of max |v|; >= kInfBits when non-finite
};

#if GCOMP_X86
GCOMP_TARGET_AVX512 inline BlockStats block_stats_avx512(const float* v, std::size_t len) {
  Lanes16 s1;
  Lanes16 s2;
  __m512i vmax = _mm512_setzero_si512();
  for (std::size_t i = 0; i < len; i += 16) {
    const __m512 x = load_once(v + i);
    s1.add(x);
    s2.add_squares(x);
    vmax = _mm512_max_epu32(vmax, _mm512_castps_si512(abs_ps(x)));
  }
  return {s1.fold(), s2.fold(), static_cast<std::uint32_t>(_mm512_reduce_max_epu32(vmax))};
}
#endif

// The scalar reference.
BlockStats block_stats(const float* v, std::size_t len) {
  BlockStats s{};
  std::uint32_t mx = 0;
  s.sum = lane_sum(v, len, [](float a) { return static_cast<double>(a); });
  s.sum_squares =
      lane_sum(v, len, [](float a) { return static_cast<double>(a) * static_cast<double>(a); });
  for (std::size_t i = 0; i < len; ++i) mx = std::max(mx, abs_bits(v[i]));
  s.max_abs_bits = mx;
  return s;
}

#if GCOMP_X86
GCOMP_TARGET_AVX2 inline BlockStats block_stats_avx2(const float* v, std::size_t len) {
  Lanes16Avx2 s1;
  Lanes16Avx2 s2;
  __m256i vmax = _mm256_setzero_si256();
  for (std::size_t i = 0; i < len; i += 16) {
    const __m256 a = load_once8(v + i);
    const __m256 b = load_once8(v + i + 8);
    s1.add(a, b);
    s2.add_squares(a, b);
    vmax = _mm256_max_epu32(vmax, _mm256_castps_si256(abs_ps8(a)));
    vmax = _mm256_max_epu32(vmax, _mm256_castps_si256(abs_ps8(b)));
  }
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  return {s1.fold(), s2.fold(), *std::max_element(lanes, lanes + 8)};
}

#endif

using StatsKernel = BlockStats (*)(const float*, std::size_t);

// The statistics of the reduction blocks of [b, e) (b a multiple of kReduceBlock) into
// stats[block]; with Simd on every block whose length is a multiple of 16.
template <StatsKernel Simd>
GCOMP_ALWAYS_INLINE void stats_of_blocks_with(const float* v, std::size_t b, std::size_t e,
                                              BlockStats* stats) {
  for (std::size_t bb = b; bb < e; bb += kReduceBlock) {
    const std::size_t l = std::min(e, bb + kReduceBlock) - bb;
    if constexpr (Simd != nullptr) {
      if (l % 16 == 0) {
        stats[bb / kReduceBlock] = Simd(v + bb, l);
        continue;
      }
    }
    stats[bb / kReduceBlock] = block_stats(v + bb, l);
  }
}

#if GCOMP_X86
GCOMP_TARGET_AVX2 void stats_of_blocks_avx2(const float* v, std::size_t b, std::size_t e,
                                            BlockStats* stats) {
  stats_of_blocks_with<block_stats_avx2>(v, b, e, stats);
}
GCOMP_TARGET_AVX512 void stats_of_blocks_avx512(const float* v, std::size_t b, std::size_t e,
                                                BlockStats* stats) {
  stats_of_blocks_with<block_stats_avx512>(v, b, e, stats);
}
#endif

// One call per chunk, at the level in use.
void stats_of_blocks(const float* v, std::size_t b, std::size_t e, BlockStats* stats) {
#if GCOMP_X86
  if (simd_level() == SimdLevel::avx512) return stats_of_blocks_avx512(v, b, e, stats);
  if (simd_level() == SimdLevel::avx2) return stats_of_blocks_avx2(v, b, e, stats);
#endif
  stats_of_blocks_with<nullptr>(v, b, e, stats);
}

inline std::uint32_t ternary_one(const Ternary& t, float v, std::uint16_t draw, float* decoded) {
  return ternary_code(t, v, draw, decoded);
}

#if GCOMP_X86
// ternarize_range's AVX-512 kernel for [ws, hi) in steps of 16, with the window's draws in words;
// returns where it stopped.
GCOMP_TARGET_AVX512 std::size_t ternarize_avx512(const Ternary& t, const std::uint32_t* words,
                                                 const float* src, std::size_t ws, std::size_t hi,
                                                 std::byte* codes, float* ef) {
  const __m512 vs = _mm512_set1_ps(t.s);
  const __m512 vc = _mm512_set1_ps(t.c);
  const __m512 vnc = _mm512_set1_ps(-t.c);
  const __m512 scale16 = _mm512_set1_ps(0x1p-16f);
  const __m512 zero = _mm512_setzero_ps();
  const __m512 neg_s = _mm512_set1_ps(-t.s);
  std::size_t i = ws;
  for (; i + 16 <= hi; i += 16) {
    const __m512 v = load_once(src + i);
    const __m512 g = t.clip ? _mm512_min_ps(_mm512_max_ps(v, vnc), vc) : v;
    const __m256i d16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + (i - ws) / 2));
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(d16)), scale16);
    const __mmask16 sel = _mm512_cmp_ps_mask(_mm512_mul_ps(u, vs), abs_ps(g), _CMP_LT_OQ);
    const __mmask16 neg = _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
    const std::uint32_t plus = static_cast<std::uint32_t>(sel & ~neg);
    const std::uint32_t minus = static_cast<std::uint32_t>(sel & neg);
    const std::uint32_t word = _pdep_u32(plus, 0x55555555u) | _pdep_u32(minus, 0xaaaaaaaau);
    std::memcpy(codes + i / 4, &word, 4);
    if (ef) {
      __m512 dec = _mm512_maskz_mov_ps(sel & ~neg, vs);
      dec = _mm512_mask_mov_ps(dec, sel & neg, neg_s);
      _mm512_storeu_ps(ef + i, _mm512_sub_ps(v, dec));
    }
  }
  return i;
}
#endif

#if GCOMP_X86
// The same with AVX2, 8 elements (16 bits of codes) at a time.
GCOMP_TARGET_AVX2 std::size_t ternarize_avx2(const Ternary& t, const std::uint32_t* words,
                                             const float* src, std::size_t ws, std::size_t hi,
                                             std::byte* codes, float* ef) {
  const __m256 vs = _mm256_set1_ps(t.s);
  const __m256 vc = _mm256_set1_ps(t.c);
  const __m256 vnc = _mm256_set1_ps(-t.c);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 neg_s = _mm256_set1_ps(-t.s);
  std::size_t i = ws;
  for (; i + 8 <= hi; i += 8) {
    const __m256 v = load_once8(src + i);
    const __m256 g = t.clip ? _mm256_min_ps(_mm256_max_ps(v, vnc), vc) : v;
    const __m256 u = draws8(words + (i - ws) / 2);
    const __m256 sel = _mm256_cmp_ps(_mm256_mul_ps(u, vs), abs_ps8(g), _CMP_LT_OQ);
    const __m256 neg = _mm256_cmp_ps(v, zero, _CMP_LT_OQ);
    const std::uint32_t plus = mask8(_mm256_andnot_ps(neg, sel));
    const std::uint32_t minus = mask8(_mm256_and_ps(neg, sel));
    const auto word =
        static_cast<std::uint16_t>(_pdep_u32(plus, 0x5555u) | _pdep_u32(minus, 0xaaaau));
    std::memcpy(codes + i / 4, &word, 2);
    if (ef) {
      const __m256 dec = _mm256_and_ps(sel, _mm256_blendv_ps(vs, neg_s, neg));
      _mm256_storeu_ps(ef + i, _mm256_sub_ps(v, dec));
    }
  }
  return i;
}
#endif

// Codes for [b, e) (b a multiple of 64) from src; ef (if not null) receives v - decode.
void ternarize_range(const Ternary& t, const PhiloxStream& st, const float* src, std::size_t b,
                     std::size_t e, std::byte* codes, float* ef) {
  alignas(64) std::uint32_t words[kWindow / 2];
  for (std::size_t ws = b; ws < e; ws += kWindow) {
    const std::size_t hi = std::min(ws + kWindow, e);
    philox_fill(st, ws / 2, (((hi - ws) + 63) & ~std::size_t{63}) / 2, words);
    std::size_t i = ws;
#if GCOMP_X86
    if (simd_level() == SimdLevel::avx512) i = ternarize_avx512(t, words, src, ws, hi, codes, ef);
    if (simd_level() == SimdLevel::avx2) i = ternarize_avx2(t, words, src, ws, hi, codes, ef);
#endif
    if (i < hi) {
      BitWriter w(codes + i / 4);  // i is a multiple of 8 here, so byte aligned
      for (; i < hi; ++i) {
        const std::uint32_t word = words[(i - ws) >> 1];
        const auto draw = static_cast<std::uint16_t>((i & 1) ? word >> 16 : word & 0xffffu);
        float dec;
        w.put(ternary_one(t, src[i], draw, &dec), 2);
        if (ef) ef[i] = src[i] - dec;
      }
      w.finish();
    }
  }
}

class TernGradCodec final : public CodecImpl {
 public:
  double clip = 2.5;

  CodecKind kind() const override { return CodecKind::terngrad; }
  std::string spec() const override { return "terngrad:clip=" + format_real(clip); }
  CodecProperties properties() const override {
    CodecProperties p;
    p.unbiased = clip == 0;  // clipping biases large values towards zero
    p.stochastic = true;
    // Unclipped, its variance is max |x| |x|_1 - |x|^2: up to (sqrt(n) - 1) |x|^2.
    p.contraction = false;
    p.bits_per_element = 2;
    p.split_per_tensor = true;  // one max |x| per call
    return p;
  }
  std::size_t max_bytes(std::size_t n) const override {
    return header_bytes(kTernGradPayload) + 4 + ceil_div(2 * static_cast<std::uint64_t>(n), 8);
  }
  CodecParams params() const override {
    CodecParams p;
    p.clip = clip;
    return p;
  }

  std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                     std::uint64_t seed, std::byte* out, std::size_t cap) const override {
    const std::size_t need = max_bytes(n);
    require_capacity(need, cap);
    // Pass 1: v (into the new residual with error feedback) and per-block statistics.
    const std::size_t blocks = static_cast<std::size_t>(ceil_div(n, kReduceBlock));
    std::vector<BlockStats>& stats = scratch_vector<BlockStats, TernGradBlocks>();
    stats.resize(blocks);
    const float* src = e_old ? e_new : x;
    for_chunks(n, kChunk, [&](std::size_t b, std::size_t e) {
      if (e_old) {
        add(x + b, e_old + b, e - b, e_new + b);
      }
      stats_of_blocks(src, b, e, stats.data());
    });
    std::vector<double>& s1 = scratch_vector<double, TernGradSums>();
    std::vector<double>& s2 = scratch_vector<double, TernGradSquares>();
    s1.resize(blocks);
    s2.resize(blocks);
    std::uint32_t max_bits = 0;
    for (std::size_t j = 0; j < blocks; ++j) {
      s1[j] = stats[j].sum;
      s2[j] = stats[j].sum_squares;
      max_bits = std::max(max_bits, stats[j].max_abs_bits);
    }
    if (max_bits >= kInfBits) {
      if (e_old) throw_nonfinite_sum(x, e_old, n);
      throw_nonfinite(x, n);
    }
    const double total = tree_sum(s1.data(), blocks);
    const double total_sq = tree_sum(s2.data(), blocks);
    const Ternary t = terngrad_scale(total, total_sq, n, clip, bits_float(max_bits));
    // Pass 2: the codes.
    std::byte params[4];
    store_le<float>(params, static_cast<float>(clip));
    const std::uint64_t code_bytes = ceil_div(2 * static_cast<std::uint64_t>(n), 8);
    std::byte* data = write_header(out, CodecKind::terngrad, n, params, {4, code_bytes});
    store_le<float>(data, t.s);
    std::byte* codes = data + 4;
    const PhiloxStream st = philox_stream(seed, CodecKind::terngrad);
    for_chunks(n, kChunk, [&](std::size_t b, std::size_t e) {
      ternarize_range(t, st, src, b, e, codes, e_old ? e_new : nullptr);
    });
    return need;
  }
};

std::unique_ptr<CodecImpl> make_terngrad(SpecReader& spec) {
  auto c = std::make_unique<TernGradCodec>();
  c->clip = spec.real("clip", 0.0, false, 1e6, false).value_or(2.5);
  spec.finish();
  return c;
}

void validate_terngrad_layout(const Payload& p) {
  const float clip = load_le<float>(p.params);
  if (!(clip >= 0) || !std::isfinite(clip))
    bad_payload("terngrad clip parameter is not a finite value >= 0");
  const std::uint64_t code_bytes = ceil_div(2 * p.n, 8);
  if (p.n > (std::uint64_t{1} << 62) || p.sections[0].size != 4 ||
      p.sections[1].size != code_bytes) {
    bad_payload("terngrad sections of " + std::to_string(p.sections[0].size) + " and " +
                std::to_string(p.sections[1].size) + " bytes, expected 4 and " +
                std::to_string(code_bytes) + " for " + std::to_string(p.n) + " elements");
  }
}

void validate_terngrad(const Payload& p) {
  validate_terngrad_layout(p);
  const std::uint64_t code_bytes = ceil_div(2 * p.n, 8);
  const std::uint32_t s = load_le<std::uint32_t>(p.sections[0].data);
  if ((s & kInfBits) == kInfBits || (s >> 31) != 0)
    bad_payload("terngrad scaler is negative, NaN or Inf");
  const std::byte* c = p.sections[1].data;
  // A pair 0b11 has both its bits set: w & (w >> 1) & 0x55.. is nonzero exactly then.
  std::uint64_t any = 0;
  std::uint64_t j = 0;
  for (; j + 8 <= code_bytes; j += 8) {
    const auto w = load_le<std::uint64_t>(c + j);
    any |= w & (w >> 1) & 0x5555555555555555ull;
  }
  for (; j < code_bytes; ++j) {
    const auto b = static_cast<std::uint64_t>(c[j]);
    any |= b & (b >> 1) & 0x55u;
  }
  if (any != 0) {
    for (j = 0; j < code_bytes; ++j) {
      const auto b = static_cast<std::uint32_t>(c[j]);
      if ((b & (b >> 1) & 0x55u) != 0)
        bad_payload("invalid terngrad code 3 in byte " + std::to_string(j));
    }
  }
  if (!padding_is_zero(c, code_bytes, 2 * p.n))
    bad_payload("terngrad code padding bits are not zero");
}

#if GCOMP_X86
// acc[i] += code i's value (+-plus or nothing) for i in [b, e) in steps of 8 (b a multiple of
// 8); returns where it stopped. Blends, so that lanes without a code keep their bits (-0).
GCOMP_TARGET_AVX2 std::size_t decode_ternary_avx2(const std::byte* codes, float plus, std::size_t b,
                                                  std::size_t e, float* acc) {
  const __m256 vp = _mm256_set1_ps(plus);
  const __m256 vm = _mm256_set1_ps(-plus);
  std::size_t i = b;
  for (; i + 8 <= e; i += 8) {
    std::uint16_t word;
    std::memcpy(&word, codes + i / 4, 2);
    __m256 a = _mm256_loadu_ps(acc + i);
    a = _mm256_blendv_ps(a, _mm256_add_ps(a, vp), lanes_of(_pext_u32(word, 0x5555u)));
    a = _mm256_blendv_ps(a, _mm256_add_ps(a, vm), lanes_of(_pext_u32(word, 0xaaaau)));
    _mm256_storeu_ps(acc + i, a);
  }
  return i;
}

// acc[i] += code i's value (+-plus or nothing) for i in [b, e) in steps of 16 (b a multiple of
// 16); returns where it stopped.
GCOMP_TARGET_AVX512 std::size_t decode_ternary_avx512(const std::byte* codes, float plus,
                                                      std::size_t b, std::size_t e, float* acc) {
  const __m512 vp = _mm512_set1_ps(plus);
  const __m512 vm = _mm512_set1_ps(-plus);
  std::size_t i = b;
  for (; i + 16 <= e; i += 16) {
    std::uint32_t word;
    std::memcpy(&word, codes + i / 4, 4);
    const auto pm = static_cast<__mmask16>(_pext_u32(word, 0x55555555u));
    const auto mm = static_cast<__mmask16>(_pext_u32(word, 0xaaaaaaaau));
    // Only the lanes with a code add (as the scalar loop): adding +0 elsewhere would turn a -0
    // accumulator into +0.
    __m512 a = _mm512_loadu_ps(acc + i);
    a = _mm512_mask_add_ps(a, pm, a, vp);
    a = _mm512_mask_add_ps(a, mm, a, vm);
    _mm512_storeu_ps(acc + i, a);
  }
  return i;
}
#endif

void decode_add_terngrad(const Payload& p, float* acc, float alpha) {
  const float s = load_le<float>(p.sections[0].data);
  const std::byte* codes = p.sections[1].data;
  const float plus = alpha * s;
  for_chunks(p.n, kChunk, [&](std::size_t b, std::size_t e) {
    std::size_t i = b;
#if GCOMP_X86
    if (simd_level() == SimdLevel::avx512) i = decode_ternary_avx512(codes, plus, b, e, acc);
    if (simd_level() == SimdLevel::avx2) i = decode_ternary_avx2(codes, plus, b, e, acc);
#endif
    for (; i < e; ++i) {
      const std::uint32_t c = get_bits(codes, i, 2);
      if (c == 1) acc[i] += plus;
      if (c == 2) acc[i] += -plus;
    }
  });
}

std::string describe_terngrad(const Payload& p) {
  return "clip=" + format_real(load_le<float>(p.params)) +
         ",scale=" + format_real(load_le<float>(p.sections[0].data));
}

}  // namespace

const CodecEntry& terngrad_entry() {
  static const CodecEntry e{
      CodecKind::terngrad,
      "terngrad",
      "TernGrad: s * {-1, 0, +1} per element (2 bits), s = max |g| after clipping to c sigma",
      {{"clip", "2.5", "clip to +-clip * standard deviation first; 0 disables clipping"}},
      kTernGradPayload,
      make_terngrad,
      validate_terngrad,
      decode_add_terngrad,
      describe_terngrad,
      validate_terngrad_layout};
  return e;
}

}  // namespace gcomp::detail
