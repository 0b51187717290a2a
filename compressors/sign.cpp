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
#include "nonfinite.hpp"
#include "reduce.hpp"
#include "reduce_avx512.hpp"
#include "simd.hpp"

namespace gcomp::detail {

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 16;  // a multiple of kReduceBlock

// Sign bits of v[0..len) into bits (len a multiple of 8 unless it ends the tensor) and the
// canonical sum of |v|.
double signs_and_sum(const float* v, std::size_t len, std::byte* bits) {
  std::size_t i = 0;
#if defined(__AVX512F__)
  if (simd_enabled() && len % 16 == 0) {
    Lanes16 lanes;
    const __m512 zero = _mm512_setzero_ps();
    for (; i < len; i += 16) {
      const __m512 x = _mm512_loadu_ps(v + i);
      lanes.add(abs_ps(x));
      const std::uint16_t m = _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ);
      std::memcpy(bits + i / 8, &m, 2);
    }
    return lanes.fold();
  }
#endif
  BitWriter w(bits);
  for (; i < len; ++i) w.put(v[i] < 0 ? 1u : 0u, 1);
  w.finish();
  return lane_sum(v, len, [](float a) { return static_cast<double>(std::fabs(a)); });
}

class SignCodec final : public CodecImpl {
 public:
  CodecKind kind() const override { return CodecKind::sign; }
  std::string spec() const override { return "sign"; }
  CodecProperties properties() const override {
    CodecProperties p;
    p.bits_per_element = 1;
    return p;
  }
  std::size_t max_bytes(std::size_t n) const override {
    return header_bytes(Layout{0, 2}) + 4 + ceil_div(n, 8);
  }

  std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                     std::uint64_t /*seed*/, std::byte* out, std::size_t cap) const override {
    const std::size_t need = max_bytes(n);
    require_capacity(need, cap);
    std::byte* data = write_header(out, CodecKind::sign, n, nullptr, {4, ceil_div(n, 8)});
    std::byte* bits = data + 4;
    const std::size_t blocks = static_cast<std::size_t>(ceil_div(n, kReduceBlock));
    std::vector<double>& sums = scratch_vector<double, 2>();
    sums.resize(blocks);
    const float* src = e_old ? e_new : x;
    for_chunks(n, kChunk, [&](std::size_t b, std::size_t e) {
      if (e_old) {
        for (std::size_t i = b; i < e; ++i) e_new[i] = x[i] + e_old[i];
      }
      for (std::size_t bb = b; bb < e; bb += kReduceBlock) {
        const std::size_t l = std::min(e, bb + kReduceBlock) - bb;
        sums[bb / kReduceBlock] = signs_and_sum(src + bb, l, bits + bb / 8);
      }
    });
    const double total = tree_sum(sums.data(), blocks);
    if (!std::isfinite(total)) {
      if (e_old) throw_nonfinite_sum(x, e_old, n);
      throw_nonfinite(x, n);
    }
    const float scale = n > 0 ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
    store_le<float>(data, scale);
    if (e_old) {
      for_chunks(n, kChunk, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) e_new[i] -= e_new[i] < 0 ? -scale : scale;
      });
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

void decode_add_sign(const Payload& p, float* acc, float alpha) {
  const float plus = alpha * load_le<float>(p.sections[0].data);
  const std::byte* bits = p.sections[1].data;
  for_chunks(p.n, kChunk, [&](std::size_t b, std::size_t e) {
    std::size_t i = b;
#if defined(__AVX512F__)
    if (simd_enabled()) {
      const __m512 vp = _mm512_set1_ps(plus);
      const __m512 vm = _mm512_set1_ps(-plus);
      for (; i + 16 <= e; i += 16) {
        std::uint16_t m;
        std::memcpy(&m, bits + i / 8, 2);
        const __m512 d = _mm512_mask_mov_ps(vp, m, vm);
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), d));
      }
    }
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
                            make_sign,
                            validate_sign,
                            decode_add_sign,
                            describe_sign,
                            validate_sign_layout};
  return e;
}

}  // namespace gcomp::detail
