// The dense codecs: none (float32 as is), fp16 and bf16 (16-bit floats, round to nearest even,
// saturating; see half.hpp). One pass each, error feedback fused into the same pass:
// v = x + e; h = round(v); e = v - h.
#include <atomic>
#include <cstring>

#include "bytes.hpp"
#include "chunks.hpp"
#include "codec_impl.hpp"
#include "half.hpp"
#include "nonfinite.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace gcomp::detail {

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 16;

// ---- per-element kernels over [0, len); each returns true when it met a non-finite value ----

// Non-finite iff all exponent bits are set: then (~u & kInfBits) == 0, so a running minimum of
// that expression finds one without a branch (and vectorizes).
inline bool copy_checked(const float* x, std::size_t len, std::byte* out) noexcept {
  std::uint32_t m = kInfBits;
  for (std::size_t i = 0; i < len; ++i) {
    const std::uint32_t u = float_bits(x[i]);
    m = std::min(m, ~u & kInfBits);
  }
  std::memcpy(out, x, len * sizeof(float));
  return m == 0;
}

inline bool add_checked(const float* x, const float* e, std::size_t len, float* v) noexcept {
  std::uint32_t m = kInfBits;
  for (std::size_t i = 0; i < len; ++i) {
    v[i] = x[i] + e[i];
    m = std::min(m, ~float_bits(v[i]) & kInfBits);
  }
  return m == 0;
}

inline bool to_half(const float* x, std::size_t len, std::uint16_t* h) noexcept {
  std::uint32_t m = kInfBits;
  std::size_t i = 0;
#if defined(__AVX512F__)
  const __m512 hi = _mm512_set1_ps(kHalfMax);
  const __m512 lo = _mm512_set1_ps(-kHalfMax);
  const __m512i inf = _mm512_set1_epi32(static_cast<int>(kInfBits));
  __m512i vm = inf;
  for (; i + 16 <= len; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    vm = _mm512_min_epu32(vm, _mm512_andnot_si512(_mm512_castps_si512(v), inf));
    const __m512 c = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + i),
                        _mm512_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  m = _mm512_reduce_min_epu32(vm);
#endif
  for (; i < len; ++i) {
    m = std::min(m, ~float_bits(x[i]) & kInfBits);
    h[i] = float_to_half(x[i]);
  }
  return m == 0;
}

inline bool to_bf16(const float* x, std::size_t len, std::uint16_t* h) noexcept {
  std::uint32_t m = kInfBits;
  for (std::size_t i = 0; i < len; ++i) {
    const std::uint32_t u = float_bits(x[i]);
    m = std::min(m, ~u & kInfBits);
    // float_to_bf16 without the branch, so the loop vectorizes: saturate, then round.
    const std::uint32_t a = u & 0x7fffffffu;
    const std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    h[i] = static_cast<std::uint16_t>(a >= 0x7f7f8000u ? (((u >> 16) & 0x8000u) | 0x7f7fu) : r);
  }
  return m == 0;
}

inline void half_to_floats(const std::uint16_t* h, std::size_t len, float* out) noexcept {
  std::size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= len; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i));
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(v));
  }
#endif
  for (; i < len; ++i) out[i] = half_to_float(h[i]);
}

// ---- the codec ----

class DenseCodec final : public CodecImpl {
 public:
  explicit DenseCodec(CodecKind kind) : kind_(kind) {}
  CodecKind kind() const override { return kind_; }
  std::string spec() const override { return codec_name(kind_); }
  CodecProperties properties() const override {
    CodecProperties p;
    p.unbiased = kind_ == CodecKind::none;
    p.bits_per_element = kind_ == CodecKind::none ? 32 : 16;
    return p;
  }
  std::size_t width() const { return kind_ == CodecKind::none ? 4 : 2; }
  std::size_t max_bytes(std::size_t n) const override {
    return header_bytes(Layout{0, 1}) + n * width();
  }

  std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                     std::uint64_t /*seed*/, std::byte* out, std::size_t cap) const override {
    if (e_old) return encode_ef(x, e_old, e_new, n, out, cap);
    const std::size_t need = max_bytes(n);
    require_capacity(need, cap);
    std::byte* data = write_header(out, kind_, n, nullptr, {n * width()});
    std::atomic<bool> bad{false};
    for_chunks(n, kChunk, [&](std::size_t b, std::size_t e) {
      bool hit = false;
      if (kind_ == CodecKind::none) {
        hit = copy_checked(x + b, e - b, data + 4 * b);
      } else {
        // Through a small buffer: the section may sit at any alignment in the caller's memory.
        std::uint16_t tmp[1024];
        for (std::size_t s = b; s < e; s += 1024) {
          const std::size_t l = std::min<std::size_t>(1024, e - s);
          hit |= kind_ == CodecKind::fp16 ? to_half(x + s, l, tmp) : to_bf16(x + s, l, tmp);
          std::memcpy(data + 2 * s, tmp, 2 * l);
        }
      }
      if (hit) bad.store(true, std::memory_order_relaxed);
    });
    if (bad.load()) throw_nonfinite(x, n);
    return need;
  }

 private:
  std::size_t encode_ef(const float* x, const float* e_old, float* e_new, std::size_t n,
                        std::byte* out, std::size_t cap) const {
    const std::size_t need = max_bytes(n);
    require_capacity(need, cap);
    std::byte* data = write_header(out, kind_, n, nullptr, {n * width()});
    std::atomic<bool> bad{false};
    for_chunks(n, kChunk, [&](std::size_t b, std::size_t e) {
      constexpr std::size_t kStep = 1024;
      float v[kStep];
      float back[kStep];
      std::uint16_t h[kStep];
      bool hit = false;
      for (std::size_t s = b; s < e; s += kStep) {
        const std::size_t l = std::min(kStep, e - s);
        hit |= add_checked(x + s, e_old + s, l, v);
        if (kind_ == CodecKind::none) {
          std::memcpy(data + 4 * s, v, 4 * l);
          std::memset(e_new + s, 0, 4 * l);
          continue;
        }
        if (kind_ == CodecKind::fp16) {
          to_half(v, l, h);
          half_to_floats(h, l, back);
        } else {
          to_bf16(v, l, h);
          for (std::size_t i = 0; i < l; ++i) back[i] = bf16_to_float(h[i]);
        }
        std::memcpy(data + 2 * s, h, 2 * l);
        for (std::size_t i = 0; i < l; ++i) e_new[s + i] = v[i] - back[i];
      }
      if (hit) bad.store(true, std::memory_order_relaxed);
    });
    if (bad.load()) throw_nonfinite_sum(x, e_old, n);
    return need;
  }

  CodecKind kind_;
};

// ---- payloads ----

void validate_dense_layout(const Payload& p) {
  const std::uint64_t w = p.kind == CodecKind::none ? 4 : 2;
  if (p.n > p.sections[0].size / w || p.sections[0].size != p.n * w) {
    bad_payload(std::string(codec_name(p.kind)) + " values section is " +
                std::to_string(p.sections[0].size) + " bytes, expected " + std::to_string(w) +
                " x " + std::to_string(p.n));
  }
}

void validate_dense(const Payload& p) {
  validate_dense_layout(p);
  const std::uint64_t w = p.kind == CodecKind::none ? 4 : 2;
  const std::byte* d = p.sections[0].data;
  std::atomic<std::size_t> first_bad{p.n};
  for_chunks(p.n, kChunk, [&](std::size_t b, std::size_t e) {
    std::uint32_t m = 0xffffffffu;
    if (w == 4) {
      for (std::size_t i = b; i < e; ++i)
        m = std::min(m, ~load_le<std::uint32_t>(d + 4 * i) & kInfBits);
      m = m == 0 ? 0 : 1;
    } else {
      const std::uint32_t inf = p.kind == CodecKind::fp16 ? 0x7c00u : 0x7f80u;
      for (std::size_t i = b; i < e; ++i)
        m = std::min<std::uint32_t>(m, ~load_le<std::uint16_t>(d + 2 * i) & inf);
      m = m == 0 ? 0 : 1;
    }
    if (m == 0) {
      std::size_t cur = first_bad.load();
      while (b < cur && !first_bad.compare_exchange_weak(cur, b)) {
      }
    }
  });
  if (first_bad.load() != p.n) {
    bad_payload(std::string(codec_name(p.kind)) +
                " payload holds a NaN or Inf value (at or after element " +
                std::to_string(first_bad.load()) + ")");
  }
}

void decode_add_dense(const Payload& p, float* acc, float alpha) {
  const std::byte* d = p.sections[0].data;
  for_chunks(p.n, kChunk, [&](std::size_t b, std::size_t e) {
    if (p.kind == CodecKind::none) {
      for (std::size_t i = b; i < e; ++i) acc[i] += alpha * load_le<float>(d + 4 * i);
      return;
    }
    constexpr std::size_t kStep = 1024;
    std::uint16_t h[kStep];
    float v[kStep];
    for (std::size_t s = b; s < e; s += kStep) {
      const std::size_t l = std::min(kStep, e - s);
      std::memcpy(h, d + 2 * s, 2 * l);
      if (p.kind == CodecKind::fp16) {
        half_to_floats(h, l, v);
      } else {
        for (std::size_t i = 0; i < l; ++i) v[i] = bf16_to_float(h[i]);
      }
      for (std::size_t i = 0; i < l; ++i) acc[s + i] += alpha * v[i];
    }
  });
}

std::string describe_dense(const Payload& p) {
  return p.kind == CodecKind::none ? "values=fp32" : std::string("values=") + codec_name(p.kind);
}

template <CodecKind K>
std::unique_ptr<CodecImpl> make_dense(SpecReader& spec) {
  spec.finish();
  return std::make_unique<DenseCodec>(K);
}

}  // namespace

const CodecEntry& dense_none_entry() {
  static const CodecEntry e{CodecKind::none,
                            "none",
                            "float32 as is (32 bits per element)",
                            {},
                            make_dense<CodecKind::none>,
                            validate_dense,
                            decode_add_dense,
                            describe_dense,
                            validate_dense_layout};
  return e;
}
const CodecEntry& dense_fp16_entry() {
  static const CodecEntry e{CodecKind::fp16,
                            "fp16",
                            "IEEE half precision, round to nearest even, saturating at 65504",
                            {},
                            make_dense<CodecKind::fp16>,
                            validate_dense,
                            decode_add_dense,
                            describe_dense,
                            validate_dense_layout};
  return e;
}
const CodecEntry& dense_bf16_entry() {
  static const CodecEntry e{CodecKind::bf16,
                            "bf16",
                            "bfloat16 (float32's upper half), round to nearest even",
                            {},
                            make_dense<CodecKind::bf16>,
                            validate_dense,
                            decode_add_dense,
                            describe_dense,
                            validate_dense_layout};
  return e;
}

}  // namespace gcomp::detail
