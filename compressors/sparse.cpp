// The sparse codecs: top-k (the k largest |x|), random-k (k indices drawn from the seed) and
// threshold (every |x| >= tau). All three send (index, value) pairs with indices strictly
// ascending; they share the payload layout (docs/wire-format.md):
//   params: u8 values (0 = fp32, 1 = fp16), u8 index bytes (4 if n <= 2^32, else 8),
//           6 zero bytes, u64 nnz
//   sections: nnz indices, nnz values
// Error feedback never decodes in full: e = v everywhere, then at each sent index
// e = v - sent (zero for fp32 values).
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "bytes.hpp"
#include "chunks.hpp"
#include "codec_impl.hpp"
#include "half.hpp"
#include "kernels.hpp"
#include "nonfinite.hpp"
#include "philox.hpp"
#include "select.hpp"

namespace gcomp::detail {

namespace {

enum class Mode { topk, randomk, threshold };
constexpr std::uint8_t kValuesF32 = 0;
constexpr std::uint8_t kValuesF16 = 1;

constexpr std::size_t index_bytes_for(std::uint64_t n) {
  return n <= (std::uint64_t{1} << 32) ? 4 : 8;
}

// ---- key sources for select_top (see select.hpp) ----

struct TopkSource {
  const float* x;
  bool first(std::size_t b, std::size_t e, std::uint32_t* keys) const noexcept {
    return abs_keys(x + b, e - b, keys);
  }
  void again(std::size_t b, std::size_t e, std::uint32_t* keys) const noexcept {
    abs_keys(x + b, e - b, keys);
  }
  std::uint32_t at(std::size_t i) const noexcept { return abs_bits(x[i]); }
};

// Error feedback: the first pass forms v = x + e_old into e_new; the keys are |v|.
struct TopkEfSource {
  const float* x;
  const float* e_old;
  float* e_new;
  bool first(std::size_t b, std::size_t e, std::uint32_t* keys) const noexcept {
    add(x + b, e_old + b, e - b, e_new + b);
    return abs_keys(e_new + b, e - b, keys);
  }
  void again(std::size_t b, std::size_t e, std::uint32_t* keys) const noexcept {
    abs_keys(e_new + b, e - b, keys);
  }
  std::uint32_t at(std::size_t i) const noexcept { return abs_bits(x[i] + e_old[i]); }
};

// Random-k: the keys are Philox words; the first pass also checks (and with error feedback forms)
// the values.
struct RandomSource {
  PhiloxStream stream;
  const float* x;
  const float* e_old;  // null without error feedback
  float* e_new;
  void fill(std::size_t b, std::size_t e, std::uint32_t* keys) const noexcept {
    const std::size_t l = e - b;
    const std::size_t rounded = (l + 31) & ~std::size_t{31};
    if (rounded == l) {
      philox_fill(stream, b, l, keys);
    } else {
      std::uint32_t tmp[kKeyBlock];
      philox_fill(stream, b, rounded, tmp);
      std::memcpy(keys, tmp, l * sizeof(std::uint32_t));
    }
  }
  bool first(std::size_t b, std::size_t e, std::uint32_t* keys) const noexcept {
    fill(b, e, keys);
    return e_old ? add_checked(x + b, e_old + b, e - b, e_new + b) : any_nonfinite(x + b, e - b);
  }
  void again(std::size_t b, std::size_t e, std::uint32_t* keys) const noexcept { fill(b, e, keys); }
  std::uint32_t at(std::size_t i) const noexcept { return philox_word(stream, i); }
};

// ---- the codec ----

class SparseCodec final : public CodecImpl {
 public:
  Mode mode = Mode::topk;
  CodecKind kind_id = CodecKind::topk;
  double ratio = 0;     // > 0 when k comes from a ratio
  std::uint64_t k = 0;  // when given directly
  double tau = 0;
  bool scale = false;
  bool fp16_values = false;

  CodecKind kind() const override { return kind_id; }

  std::string spec() const override {
    std::string s = codec_name(kind_id);
    if (mode == Mode::threshold) {
      s += ":tau=" + format_real(tau);
    } else if (ratio > 0) {
      s += ":ratio=" + format_real(ratio);
    } else {
      s += ":k=" + std::to_string(k);
    }
    if (mode == Mode::randomk) s += std::string(",scale=") + (scale ? "true" : "false");
    s += std::string(",values=") + (fp16_values ? "fp16" : "fp32");
    return s;
  }

  CodecProperties properties() const override {
    CodecProperties p;
    p.sparse = true;
    p.unbiased = mode == Mode::randomk && scale;
    p.stochastic = mode == Mode::randomk;
    p.bits_per_element = 0;
    return p;
  }

  std::size_t selected(std::size_t n) const override {
    if (n == 0) return 0;
    if (mode == Mode::threshold) return n;
    if (ratio > 0) {
      const double r = std::round(ratio * static_cast<double>(n));
      const std::size_t kk = r < 1.0 ? 1 : static_cast<std::size_t>(r);
      return std::min(kk, n);
    }
    return static_cast<std::size_t>(std::min<std::uint64_t>(k, n));
  }

  std::size_t entry_bytes(std::size_t n) const {
    return index_bytes_for(n) + (fp16_values ? 2 : 4);
  }
  std::size_t payload_bytes(std::size_t n, std::size_t nnz) const {
    return header_bytes(Layout{16, 2}) + nnz * entry_bytes(n);
  }
  std::size_t max_bytes(std::size_t n) const override { return payload_bytes(n, selected(n)); }
  CodecParams params() const override {
    CodecParams p;
    p.tau = tau;
    p.scale = scale;
    p.fp16_values = fp16_values;
    return p;
  }

  // Without error feedback e_old == e_new == nullptr and the values come from x; with it they
  // come from v = x + e_old, which the selection pass leaves in e_new.
  std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                     std::uint64_t seed, std::byte* out, std::size_t cap) const override {
    if (mode != Mode::threshold) require_capacity(max_bytes(n), cap);
    std::vector<std::uint64_t>& idx = scratch_vector<std::uint64_t, 7>();
    bool nonfinite = false;
    if (mode == Mode::topk) {
      if (e_old) {
        TopkEfSource src{x, e_old, e_new};
        nonfinite = select_top(src, n, selected(n), idx).nonfinite;
      } else {
        TopkSource src{x};
        nonfinite = select_top(src, n, selected(n), idx).nonfinite;
      }
    } else if (mode == Mode::randomk) {
      RandomSource src{philox_stream(seed, kind_id), x, e_old, e_new};
      nonfinite = select_top(src, n, selected(n), idx).nonfinite;
    } else {
      nonfinite = threshold_select(x, e_old, e_new, n, idx);
    }
    if (nonfinite) {
      if (e_old) throw_nonfinite_sum(x, e_old, n);
      throw_nonfinite(x, n);
    }
    const std::size_t nnz = idx.size();
    const std::size_t need = payload_bytes(n, nnz);
    require_capacity(need, cap);
    emit(e_old ? e_new : x, n, idx, out, e_old ? e_new : nullptr);
    return need;
  }

 private:
  bool threshold_select(const float* x, const float* e_old, float* e_new, std::size_t n,
                        std::vector<std::uint64_t>& idx) const {
    const std::uint32_t t = float_bits(static_cast<float>(tau));
    const std::size_t chunks = static_cast<std::size_t>(ceil_div(n, kSelectChunk));
    auto& per_chunk = scratch_vector<std::vector<std::uint64_t>, 1>();
    if (per_chunk.size() < chunks) per_chunk.resize(chunks);
    std::atomic<bool> bad{false};
    parallel_for(chunks, threads_for(n), [&](std::size_t c) {
      const std::size_t b = c * kSelectChunk;
      const std::size_t e = std::min(n, b + kSelectChunk);
      const float* v = x;
      if (e_old) {
        add(x + b, e_old + b, e - b, e_new + b);
        v = e_new;
      }
      std::vector<std::uint64_t>& out = per_chunk[c];
      out.clear();
      std::uint32_t keys[kKeyBlock];
      std::uint32_t pos[kKeyBlock + 16];
      for (std::size_t s = b; s < e; s += kKeyBlock) {
        const std::size_t l = std::min(e, s + kKeyBlock) - s;
        if (abs_keys(v + s, l, keys)) bad.store(true, std::memory_order_relaxed);
        const std::size_t m = positions_at_least(keys, l, t, pos);
        for (std::size_t j = 0; j < m; ++j) out.push_back(s + pos[j]);
      }
    });
    idx.clear();
    for (std::size_t c = 0; c < chunks; ++c) {
      idx.insert(idx.end(), per_chunk[c].begin(), per_chunk[c].end());
    }
    return bad.load();
  }

  // Writes the payload for the selected indices; with error feedback (ef != nullptr, holding v)
  // sets ef[i] = v[i] - sent[i] at the sent indices.
  void emit(const float* v, std::size_t n, const std::vector<std::uint64_t>& idx, std::byte* out,
            float* ef) const {
    const std::size_t nnz = idx.size();
    const std::size_t ib = index_bytes_for(n);
    const std::size_t vb = fp16_values ? 2 : 4;
    std::byte params[16] = {};
    params[0] = std::byte{fp16_values ? kValuesF16 : kValuesF32};
    params[1] = static_cast<std::byte>(ib);
    store_le<std::uint64_t>(params + 8, nnz);
    std::byte* data = write_header(out, kind_id, n, params, {nnz * ib, nnz * vb});
    std::byte* ip = data;
    std::byte* vp = data + nnz * ib;
    const float mul = (mode == Mode::randomk && scale && nnz > 0)
                          ? static_cast<float>(static_cast<double>(n) / static_cast<double>(nnz))
                          : 1.0f;
    for (std::size_t j = 0; j < nnz; ++j) {
      const std::uint64_t i = idx[j];
      if (ib == 4) {
        store_le<std::uint32_t>(ip + 4 * j, static_cast<std::uint32_t>(i));
      } else {
        store_le<std::uint64_t>(ip + 8 * j, i);
      }
      float val = v[i];
      if (mul != 1.0f) {
        val = val * mul;
        if (!std::isfinite(val)) val = std::copysign(FLT_MAX, v[i]);  // saturate, never Inf
      }
      float sent = val;
      if (fp16_values) {
        const std::uint16_t h = float_to_half(val);
        store_le<std::uint16_t>(vp + 2 * j, h);
        sent = half_to_float(h);
      } else {
        store_le<float>(vp + 4 * j, val);
      }
      if (ef) ef[i] = v[i] - sent;
    }
  }
};

std::unique_ptr<CodecImpl> make_sparse(SpecReader& spec, Mode mode, CodecKind kind) {
  auto c = std::make_unique<SparseCodec>();
  c->mode = mode;
  c->kind_id = kind;
  if (mode == Mode::threshold) {
    const auto tau = spec.real("tau", 0.0, false, static_cast<double>(FLT_MAX), false);
    if (!tau) spec.fail("threshold needs tau=T (T >= 0)");
    c->tau = *tau;
  } else {
    const auto ratio = spec.real("ratio", 0.0, true, 1.0, false);
    const auto k = spec.integer("k", 1, UINT64_MAX);
    if (ratio && k) spec.fail("give either ratio or k, not both");
    if (!ratio && !k) spec.fail(std::string(spec.name()) + " needs ratio=R (0 < R <= 1) or k=K");
    if (ratio) c->ratio = *ratio;
    if (k) c->k = *k;
    if (mode == Mode::randomk) c->scale = spec.boolean("scale").value_or(false);
  }
  c->fp16_values = spec.choice("values", {"fp32", "fp16"}).value_or("fp32") == "fp16";
  spec.finish();
  return c;
}

// ---- payloads ----

void validate_sparse_layout(const Payload& p) {
  const std::byte* pr = p.params;
  const auto values = static_cast<std::uint8_t>(pr[0]);
  const auto ib = static_cast<std::uint8_t>(pr[1]);
  const auto nnz = load_le<std::uint64_t>(pr + 8);
  if (values != kValuesF32 && values != kValuesF16) {
    bad_payload("unknown value type " + std::to_string(values));
  }
  if (ib != index_bytes_for(p.n)) {
    bad_payload("index width " + std::to_string(ib) + " bytes, expected " +
                std::to_string(index_bytes_for(p.n)) + " for " + std::to_string(p.n) + " elements");
  }
  for (int i = 2; i < 8; ++i) {
    if (pr[i] != std::byte{0})
      bad_payload("reserved parameter byte " + std::to_string(i) + " is not zero");
  }
  if (nnz > p.n) {
    bad_payload(std::to_string(nnz) + " entries for " + std::to_string(p.n) + " elements");
  }
  const std::uint64_t vb = values == kValuesF16 ? 2 : 4;
  // Divide, never multiply: a huge nnz must not wrap around to a plausible section length.
  if (p.sections[0].size % ib != 0 || p.sections[0].size / ib != nnz ||
      p.sections[1].size % vb != 0 || p.sections[1].size / vb != nnz) {
    bad_payload("sections of " + std::to_string(p.sections[0].size) + " and " +
                std::to_string(p.sections[1].size) + " bytes do not hold " + std::to_string(nnz) +
                " entries");
  }
}

void validate_sparse(const Payload& p) {
  validate_sparse_layout(p);
  const auto ib = static_cast<std::uint8_t>(p.params[1]);
  const auto nnz = load_le<std::uint64_t>(p.params + 8);
  const std::uint64_t vb = static_cast<std::uint8_t>(p.params[0]) == kValuesF16 ? 2 : 4;
  const std::byte* ip = p.sections[0].data;
  const std::byte* vp = p.sections[1].data;
  // The fast checks first (kernels.hpp); only a bad payload is searched for what is wrong.
  if (indices_valid(ip, nnz, ib, p.n) && !any_inf_bits(vp, nnz, vb, vb == 4 ? kInfBits : 0x7c00u)) {
    return;
  }
  std::uint64_t prev = 0;
  for (std::uint64_t j = 0; j < nnz; ++j) {
    const std::uint64_t i =
        ib == 4 ? load_le<std::uint32_t>(ip + 4 * j) : load_le<std::uint64_t>(ip + 8 * j);
    if (i >= p.n) {
      bad_payload("index " + std::to_string(i) + " (entry " + std::to_string(j) +
                  ") is out of range for " + std::to_string(p.n) + " elements");
    }
    if (j > 0 && i <= prev) {
      bad_payload("indices not strictly increasing at entry " + std::to_string(j) + " (" +
                  std::to_string(prev) + " then " + std::to_string(i) + ")");
    }
    prev = i;
  }
  for (std::uint64_t j = 0; j < nnz; ++j) {
    const bool finite = vb == 4 ? (load_le<std::uint32_t>(vp + 4 * j) & kInfBits) != kInfBits
                                : half_is_finite(load_le<std::uint16_t>(vp + 2 * j));
    if (!finite) bad_payload("value of entry " + std::to_string(j) + " is NaN or Inf");
  }
}

void decode_add_sparse(const Payload& p, float* acc, float alpha) {
  const bool f16 = static_cast<std::uint8_t>(p.params[0]) == kValuesF16;
  const auto ib = static_cast<std::uint8_t>(p.params[1]);
  const auto nnz = load_le<std::uint64_t>(p.params + 8);
  const std::byte* ip = p.sections[0].data;
  scatter_add(acc, ip, p.sections[1].data, static_cast<std::size_t>(nnz), ib, f16, alpha);
}

std::string describe_sparse(const Payload& p) {
  return "nnz=" + std::to_string(load_le<std::uint64_t>(p.params + 8)) + ",index=u" +
         std::to_string(8 * static_cast<int>(p.params[1])) +
         ",values=" + (static_cast<std::uint8_t>(p.params[0]) == kValuesF16 ? "fp16" : "fp32");
}

std::unique_ptr<CodecImpl> make_topk(SpecReader& s) {
  return make_sparse(s, Mode::topk, CodecKind::topk);
}
std::unique_ptr<CodecImpl> make_randomk(SpecReader& s) {
  return make_sparse(s, Mode::randomk, CodecKind::randomk);
}
std::unique_ptr<CodecImpl> make_threshold(SpecReader& s) {
  return make_sparse(s, Mode::threshold, CodecKind::threshold);
}

const std::vector<SpecKey> kRatioKeys = {
    {"ratio", "", "fraction of elements to send, 0 < R <= 1 (k = max(1, round(R n)))"},
    {"k", "", "number of elements to send (instead of ratio)"},
    {"values", "fp32", "value type on the wire: fp32 or fp16"}};

}  // namespace

void read_sparse_entries(const Payload& p, SparseEntries& out) {
  if (p.kind != CodecKind::topk && p.kind != CodecKind::randomk && p.kind != CodecKind::threshold) {
    throw Error(Status::invalid_argument,
                std::string("sparse_entries: a ") + codec_name(p.kind) + " payload is not sparse");
  }
  validate_sparse(p);
  const bool f16 = static_cast<std::uint8_t>(p.params[0]) == kValuesF16;
  const auto ib = static_cast<std::uint8_t>(p.params[1]);
  const auto nnz = load_le<std::uint64_t>(p.params + 8);
  const std::byte* ip = p.sections[0].data;
  const std::byte* vp = p.sections[1].data;
  out.elements = p.n;
  out.indices.resize(nnz);
  out.values.resize(nnz);
  for (std::uint64_t j = 0; j < nnz; ++j) {
    out.indices[j] =
        ib == 4 ? load_le<std::uint32_t>(ip + 4 * j) : load_le<std::uint64_t>(ip + 8 * j);
    out.values[j] =
        f16 ? half_to_float(load_le<std::uint16_t>(vp + 2 * j)) : load_le<float>(vp + 4 * j);
  }
}

const CodecEntry& topk_entry() {
  static const CodecEntry e{CodecKind::topk,
                            "topk",
                            "the k largest |x| exactly; indices ascending, ties to the lower index",
                            kRatioKeys,
                            make_topk,
                            validate_sparse,
                            decode_add_sparse,
                            describe_sparse,
                            validate_sparse_layout};
  return e;
}
const CodecEntry& randomk_entry() {
  static const CodecEntry e{CodecKind::randomk,
                            "randomk",
                            "k distinct indices drawn from the seed (Philox)",
                            {kRatioKeys[0],
                             kRatioKeys[1],
                             {"scale", "false", "multiply values by n/k so the decode is unbiased"},
                             kRatioKeys[2]},
                            make_randomk,
                            validate_sparse,
                            decode_add_sparse,
                            describe_sparse,
                            validate_sparse_layout};
  return e;
}
const CodecEntry& threshold_entry() {
  static const CodecEntry e{CodecKind::threshold,
                            "threshold",
                            "every element with |x| >= tau",
                            {{"tau", "", "the threshold, T >= 0 (required)"}, kRatioKeys[2]},
                            make_threshold,
                            validate_sparse,
                            decode_add_sparse,
                            describe_sparse,
                            validate_sparse_layout};
  return e;
}

}  // namespace gcomp::detail
