// Scaled sign (EF-signSGD, Karimireddy et al. 2019): one bit per element (set when v < 0) and
// one float32 scale = mean |v| = ||v||_1 / n, so decode = scale * sign(v). Without error feedback
// it is biased; with it, it converges like SGD. One pass: the bits and the canonical double-lane
// sums of |v| (reduce.hpp) come out together, the scale is written at the end.
//
// Payload: no params; sections: f32 scale, then ceil(n / 8) bytes of sign bits.
#include <atomic>
#include <cmath>
#include <cstring>

#include "bits.hpp"
#include "bytes.hpp"
#include "chunks.hpp"
#include "codec_impl.hpp"
#include "kernels.hpp"
#include "nonfinite.hpp"
#include "reduce.hpp"
#include "reduce_simd.hpp"
#include "simd.hpp"

namespace gcomp::detail {

// The payload of sign: no parameters, two sections (the scale, the signs).
constexpr Layout kSignPayload{0, 2};

struct SignBlockSums;  // a scratch vector (parallel.hpp): per-block sums of |v|

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 16;  // a multiple of kReduceBlock

// Sign bits of v[0..len) into bits (len a multiple of 8 unless it ends the tensor) and the
// canonical sum of |v|: the scalar reference.
double signs_and_sum(const float* v, std::size_t len, std::byte* bits) {
  BitWriter w(bits);
  for (std::size_t i = 0; i < len; ++i) w.put(v[i] < 0 ? 1u : 0u, 1);
  w.finish();
  return lane_sum(v, len, [](float a) { return static_cast<double>(std::fabs(a)); });
}

#if GCOMP_X86
GCOMP_TARGET_AVX512 double signs_and_sum_avx512(const float* v, std::size_t len, std::byte* bits) {
  Lanes16 lanes;
  const __m512 zero = _mm512_setzero_ps();
  for (std::size_t i = 0; i < len; i += 16) {
    const __m512 x = load_once(v + i);
    lanes.add(abs_ps(x));
    const std::uint16_t m = _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ);
    std::memcpy(bits + i / 8, &m, 2);
  }
  return lanes.fold();
}

GCOMP_TARGET_AVX2 double signs_and_sum_avx2(const float* v, std::size_t len, std::byte* bits) {
  Lanes16Avx2 lanes;
  const __m256 zero = _mm256_setzero_ps();
  for (std::size_t i = 0; i < len; i += 16) {
    const __m256 a = load_once8(v + i);
    const __m256 b = load_once8(v + i + 8);
    lanes.add(abs_ps8(a), abs_ps8(b));
    const auto m = static_cast<std::uint16_t>(mask8(_mm256_cmp_ps(a, zero, _CMP_LT_OQ)) |
                                              mask8(_mm256_cmp_ps(b, zero, _CMP_LT_OQ)) << 8);
    std::memcpy(bits + i / 8, &m, 2);
  }
  return lanes.fold();
}

#endif

using BlockKernel = double (*)(const float*, std::size_t, std::byte*);

// The reduction blocks of [b, e) (b a multiple of kReduceBlock): their sign bits, and each
// block's sum of |v| in sums[block]; with Simd on every block whose length is a multiple of 16.
template <BlockKernel Simd>
GCOMP_ALWAYS_INLINE void sign_blocks_with(const float* v, std::size_t b, std::size_t e,
                                          std::byte* bits, double* sums) {
  for (std::size_t bb = b; bb < e; bb += kReduceBlock) {
    const std::size_t l = std::min(e, bb + kReduceBlock) - bb;
    if constexpr (Simd != nullptr) {
      if (l % 16 == 0) {
        sums[bb / kReduceBlock] = Simd(v + bb, l, bits + bb / 8);
        continue;
      }
    }
    sums[bb / kReduceBlock] = signs_and_sum(v + bb, l, bits + bb / 8);
  }
}

#if GCOMP_X86
GCOMP_TARGET_AVX2 void sign_blocks_avx2(const float* v, std::size_t b, std::size_t e,
                                        std::byte* bits, double* sums) {
  sign_blocks_with<signs_and_sum_avx2>(v, b, e, bits, sums);
}
GCOMP_TARGET_AVX512 void sign_blocks_avx512(const float* v, std::size_t b, std::size_t e,
                                            std::byte* bits, double* sums) {
  sign_blocks_with<signs_and_sum_avx512>(v, b, e, bits, sums);
}
#endif

// One call per chunk, at the level in use.
void sign_blocks(const float* v, std::size_t b, std::size_t e, std::byte* bits, double* sums) {
#if GCOMP_X86
  if (simd_level() == SimdLevel::avx512) return sign_blocks_avx512(v, b, e, bits, sums);
  if (simd_level() == SimdLevel::avx2) return sign_blocks_avx2(v, b, e, bits, sums);
#endif
  sign_blocks_with<nullptr>(v, b, e, bits, sums);
}

class SignCodec final : public CodecImpl {
 public:
  CodecKind kind() const override { return CodecKind::sign; }
  std::string spec() const override { return "sign"; }
  CodecProperties properties() const override {
    CodecProperties p;
    p.contraction = true;  // delta = |x|_1^2 / (n |x|^2) >= 1 / n
    p.bits_per_element = 1;
    p.split_per_tensor = true;  // one mean |x| per call
    p.sends_late = true;        // the magnitudes sign evens out wait in the residual
    return p;
  }
  std::size_t max_bytes(std::size_t n) const override {
    return header_bytes(kSignPayload) + 4 + ceil_div(n, 8);
  }

  std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                     std::uint64_t /*seed*/, std::byte* out, std::size_t cap) const override {
    const std::size_t need = max_bytes(n);
    require_capacity(need, cap);
    std::byte* data = write_header(out, CodecKind::sign, n, nullptr, {4, ceil_div(n, 8)});
    std::byte* bits = data + 4;
    const std::size_t blocks = static_cast<std::size_t>(ceil_div(n, kReduceBlock));
    std::vector<double>& sums = scratch_vector<double, SignBlockSums>();
    sums.resize(blocks);
    const float* src = e_old ? e_new : x;
    for_chunks(n, kChunk, [&](std::size_t b, std::size_t e) {
      if (e_old) add(x + b, e_old + b, e - b, e_new + b);
      sign_blocks(src, b, e, bits, sums.data());
    });
    const double total = tree_sum(sums.data(), blocks);
    if (!std::isfinite(total)) {
      if (e_old) throw_nonfinite_sum(x, e_old, n);
      throw_nonfinite(x, n);
    }
    const float scale = n > 0 ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
    store_le<float>(data, scale);
    if (e_old) {
      for_chunks(n, kChunk,
                 [&](std::size_t b, std::size_t e) { subtract_signs(e_new + b, e - b, scale); });
    }
    return need;
  }
};

std::unique_ptr<CodecImpl> make_sign(SpecReader& spec) {
  spec.finish();
  return std::make_unique<SignCodec>();
}

void validate_sign_layout(const Payload& p) {
  if (p.sections[0].size != 4 || p.sections[1].size != ceil_div(p.n, 8)) {
    bad_payload("sign sections of " + std::to_string(p.sections[0].size) + " and " +
                std::to_string(p.sections[1].size) + " bytes, expected 4 and " +
                std::to_string(ceil_div(p.n, 8)) + " for " + std::to_string(p.n) + " elements");
  }
}

void validate_sign(const Payload& p) {
  validate_sign_layout(p);
  const std::uint32_t s = load_le<std::uint32_t>(p.sections[0].data);
  if ((s & kInfBits) == kInfBits || (s >> 31) != 0)
    bad_payload("sign scale is negative, NaN or Inf");
  if (!padding_is_zero(p.sections[1].data, p.sections[1].size, p.n)) {
    bad_payload("sign padding bits are not zero");
  }
}

#if GCOMP_X86
// acc[i] += (sign bit i ? -plus : plus) for i in [b, e) in steps of 16 (b a multiple of 8);
// returns where it stopped.
GCOMP_TARGET_AVX2 std::size_t decode_signs_avx2(const std::byte* bits, float plus, std::size_t b,
                                                std::size_t e, float* acc) {
  const __m256 vp = _mm256_set1_ps(plus);
  const __m256 vm = _mm256_set1_ps(-plus);
  std::size_t i = b;
  for (; i + 8 <= e; i += 8) {
    const auto m = std::to_integer<std::uint32_t>(bits[i / 8]);
    const __m256 d = _mm256_blendv_ps(vp, vm, lanes_of(m));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), d));
  }
  return i;
}

GCOMP_TARGET_AVX512 std::size_t decode_signs_avx512(const std::byte* bits, float plus,
                                                    std::size_t b, std::size_t e, float* acc) {
  const __m512 vp = _mm512_set1_ps(plus);
  const __m512 vm = _mm512_set1_ps(-plus);
  std::size_t i = b;
  for (; i + 16 <= e; i += 16) {
    std::uint16_t m;
    std::memcpy(&m, bits + i / 8, 2);
    const __m512 d = _mm512_mask_mov_ps(vp, m, vm);
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), d));
  }
  return i;
}
#endif

void decode_add_sign(const Payload& p, float* acc, float alpha) {
  const float plus = alpha * load_le<float>(p.sections[0].data);
  const std::byte* bits = p.sections[1].data;
  for_chunks(p.n, kChunk, [&](std::size_t b, std::size_t e) {
    std::size_t i = b;
#if GCOMP_X86
    if (simd_level() == SimdLevel::avx512) i = decode_signs_avx512(bits, plus, b, e, acc);
    if (simd_level() == SimdLevel::avx2) i = decode_signs_avx2(bits, plus, b, e, acc);
#endif
    for (; i < e; ++i) acc[i] += get_bits(bits, i, 1) ? -plus : plus;
  });
}

std::string describe_sign(const Payload& p) {
  return "scale=" + format_real(load_le<float>(p.sections[0].data));
}

}  // namespace

const CodecEntry& sign_entry() {
  static const CodecEntry e{CodecKind::sign,
                            "sign",
                            "scaled sign: 1 bit per element + scale = mean |x| (EF-signSGD)",
                            {},
                            kSignPayload,
                            make_sign,
                            validate_sign,
                            decode_add_sign,
                            describe_sign,
                            validate_sign_layout};
  return e;
}

}  // namespace gcomp::detail
