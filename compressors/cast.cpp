// The cast codecs: none (float32 as is), fp16 and bf16 (16-bit floats, round to nearest even,
// saturating; see half.hpp). One pass each (kernels.hpp), error feedback fused into the same
// pass: v = x + e; h = round(v); e = v - h.
#include <atomic>
#include <cstring>

#include "bytes.hpp"
#include "chunks.hpp"
#include "codec_impl.hpp"
#include "kernels.hpp"
#include "nonfinite.hpp"

namespace gcomp::detail {

// The payload of none, fp16 and bf16: no parameters, one section (the values).
constexpr Layout kCastPayload{0, 1};

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 16;

// ---- the codec ----

class CastCodec final : public CodecImpl {
 public:
  explicit CastCodec(CodecKind kind) : kind_(kind) {}
  CodecKind kind() const override { return kind_; }
  std::string spec() const override { return codec_name(kind_); }
  CodecProperties properties() const override {
    CodecProperties p;
    p.unbiased = kind_ == CodecKind::none;
    p.contraction = kind_ != CodecKind::none;  // fp16, bf16: a relative error of 2^-11, 2^-8
    p.bits_per_element = kind_ == CodecKind::none ? 32 : 16;
    p.elementwise = true;
    if (kind_ == CodecKind::none) p.variance_bound = 0;
    return p;
  }
  std::size_t width() const { return kind_ == CodecKind::none ? 4 : 2; }
  std::size_t max_bytes(std::size_t n) const override {
    return header_bytes(kCastPayload) + n * width();
  }

  // One pass per chunk (kernels.hpp): v = x (+ e), checked, written as the codec's values, and
  // with error feedback e_new = v - the value sent.
  std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                     std::uint64_t /*seed*/, std::byte* out, std::size_t cap) const override {
    const std::size_t need = max_bytes(n);
    require_capacity(need, cap);
    std::byte* data = write_header(out, kind_, n, nullptr, {n * width()});
    const auto pass = kind_ == CodecKind::none   ? encode_f32
                      : kind_ == CodecKind::fp16 ? encode_half
                                                 : encode_bf16;
    std::atomic<bool> bad{false};
    for_chunks(n, kChunk, [&](std::size_t b, std::size_t e) {
      if (pass(x + b, e_old ? e_old + b : nullptr, e - b, data + width() * b,
               e_old ? e_new + b : nullptr)) {
        bad.store(true, std::memory_order_relaxed);
      }
    });
    if (bad.load()) {
      if (e_old) throw_nonfinite_sum(x, e_old, n);
      throw_nonfinite(x, n);
    }
    return need;
  }

 private:
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
  const std::uint32_t inf = w == 4 ? kInfBits : (p.kind == CodecKind::fp16 ? 0x7c00u : 0x7f80u);
  for_chunks(p.n, kChunk, [&](std::size_t b, std::size_t e) {
    if (any_inf_bits(d + w * b, e - b, w, inf)) {
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
  const auto add = p.kind == CodecKind::none   ? add_scaled_f32
                   : p.kind == CodecKind::fp16 ? add_scaled_half
                                               : add_scaled_bf16;
  const std::size_t w = p.kind == CodecKind::none ? 4 : 2;
  for_chunks(p.n, kChunk,
             [&](std::size_t b, std::size_t e) { add(acc + b, d + w * b, alpha, e - b); });
}

std::string describe_dense(const Payload& p) {
  return p.kind == CodecKind::none ? "values=fp32" : std::string("values=") + codec_name(p.kind);
}

template <CodecKind K>
std::unique_ptr<CodecImpl> make_cast(SpecReader& spec) {
  spec.finish();
  return std::make_unique<CastCodec>(K);
}

}  // namespace

const CodecEntry& cast_none_entry() {
  static const CodecEntry e{CodecKind::none,
                            "none",
                            "float32 as is (32 bits per element)",
                            {},
                            kCastPayload,
                            make_cast<CodecKind::none>,
                            validate_dense,
                            decode_add_dense,
                            describe_dense,
                            validate_dense_layout};
  return e;
}
const CodecEntry& cast_fp16_entry() {
  static const CodecEntry e{CodecKind::fp16,
                            "fp16",
                            "IEEE half precision, round to nearest even, saturating at 65504",
                            {},
                            kCastPayload,
                            make_cast<CodecKind::fp16>,
                            validate_dense,
                            decode_add_dense,
                            describe_dense,
                            validate_dense_layout};
  return e;
}
const CodecEntry& cast_bf16_entry() {
  static const CodecEntry e{CodecKind::bf16,
                            "bf16",
                            "bfloat16 (float32's upper half), round to nearest even",
                            {},
                            kCastPayload,
                            make_cast<CodecKind::bf16>,
                            validate_dense,
                            decode_add_dense,
                            describe_dense,
                            validate_dense_layout};
  return e;
}

}  // namespace gcomp::detail
