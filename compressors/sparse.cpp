// The sparse codecs: top-k (the k largest |x|), random-k (k indices drawn from the seed) and
// threshold (every |x| >= tau). All three send (index, value) pairs with indices strictly
// ascending; they share the payload layout (docs/wire-format.md):
//   params: u8 values (0 = fp32, 1 = fp16), u8 index format (version 2: 0, the indices packed
//           as gaps; version 1: the index bytes, 4 if n <= 2^32, else 8), 6 zero bytes, u64 nnz
//   sections: nnz indices (version 2: packed, index_pack.hpp), nnz values
// Error feedback never decodes in full: e = v everywhere, then at each sent index
// e = v - sent (zero for fp32 values).
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "bytes.hpp"
#include "chunks.hpp"
#include "codec_impl.hpp"
#include "half.hpp"
#include "index_pack.hpp"
#include "kernels.hpp"
#include "nonfinite.hpp"
#include "philox.hpp"
#include "select.hpp"

namespace gcomp::detail {

// The scratch vectors (parallel.hpp) named: the selected indices, threshold's per-chunk
// candidates, and the indices a decode unpacks (one vector for every decode on a thread).
struct SelectedIndices;
struct ThresholdChunks;
struct DecodedIndices;

namespace {

enum class Mode { topk, randomk, threshold };
constexpr std::uint8_t kValuesF32 = 0;
constexpr std::uint8_t kValuesF16 = 1;
constexpr std::uint8_t kPackedIndices = 0;  // version 2's index format
// The sparse codecs' payload: 16 parameter bytes, two sections (the indices, the values).
constexpr Layout kSparsePayload{16, 2};
constexpr std::size_t kSparseHeader = header_bytes(kSparsePayload);

// The bytes to expect for `entries` indices below n when packed: gaps averaging
// (n - entries) / entries take their bit width and two more (the largest of 128 such gaps),
// capped at the widest gap; none at all when every index is taken; and a width byte per 128.
std::size_t expected_packed_bytes(std::uint64_t entries, std::uint64_t n) {
  if (entries == 0) return 0;
  const auto widest = static_cast<std::uint64_t>(std::bit_width(n - 1));
  const std::uint64_t mean_gap = (n - entries) / entries;
  const std::uint64_t w =
      mean_gap == 0 ? 0
                    : std::min<std::uint64_t>(
                          widest, static_cast<std::uint64_t>(std::bit_width(mean_gap)) + 2);
  return static_cast<std::size_t>((entries * w + 7) / 8 + (entries + kIndexBlock - 1) / kIndexBlock);
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
    p.shared_support = mode == Mode::randomk;
    p.contraction = !p.unbiased;  // scaled random-k's k / n scale is no contraction
    p.bits_per_element = 0;
    p.value_bytes = static_cast<int>(value_bytes());
    p.elementwise = mode == Mode::threshold;  // |v| >= tau, element by element
    p.sends_late = true;                      // what is not selected waits in the residual
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

  std::size_t value_bytes() const { return fp16_values ? 2 : 4; }
  // The most a payload of nnz entries can take (the indices' worst packing).
  std::size_t payload_bound(std::size_t n, std::size_t nnz) const {
    return kSparseHeader + packed_indices_bound(nnz, n) + nnz * value_bytes();
  }
  std::size_t max_bytes(std::size_t n) const override { return payload_bound(n, selected(n)); }
  std::size_t expected_bytes(std::size_t n, std::size_t entries) const override {
    return kSparseHeader + expected_packed_bytes(entries, n) + entries * value_bytes();
  }
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
    std::vector<std::uint64_t>& idx = scratch_vector<std::uint64_t, SelectedIndices>();
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
    require_capacity(payload_bound(n, idx.size()), cap);
    return emit(e_old ? e_new : x, n, idx, out, e_old ? e_new : nullptr);
  }

 private:
  bool threshold_select(const float* x, const float* e_old, float* e_new, std::size_t n,
                        std::vector<std::uint64_t>& idx) const {
    const std::uint32_t t = float_bits(static_cast<float>(tau));
    const std::size_t chunks = static_cast<std::size_t>(ceil_div(n, kSelectChunk));
    auto& per_chunk = scratch_vector<std::vector<std::uint64_t>, ThresholdChunks>();
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

  // Writes the payload for the selected indices and returns its size; with error feedback
  // (ef != nullptr, holding v) sets ef[i] = v[i] - sent[i] at the sent indices.
  std::size_t emit(const float* v, std::size_t n, const std::vector<std::uint64_t>& idx,
                   std::byte* out, float* ef) const {
    const std::size_t nnz = idx.size();
    const std::size_t vb = value_bytes();
    std::byte params[16] = {};
    params[0] = std::byte{fp16_values ? kValuesF16 : kValuesF32};
    params[1] = std::byte{kPackedIndices};
    store_le<std::uint64_t>(params + 8, nnz);
    // The sections first (the packed indices' length is known only once packed), the header
    // after.
    std::byte* ip = out + kSparseHeader;
    const std::size_t packed = pack_indices(idx.data(), nnz, ip);
    std::byte* vp = ip + packed;
    write_header(out, kind_id, n, params, {packed, nnz * vb});
    const float mul = (mode == Mode::randomk && scale && nnz > 0)
                          ? static_cast<float>(static_cast<double>(n) / static_cast<double>(nnz))
                          : 1.0f;
    // The selected values lie about n / nnz apart, beyond the prefetchers' reach: ask for them
    // a few entries ahead (v was just written, so they are in the caches or near).
    constexpr std::size_t kAhead = 16;
    for (std::size_t j = 0; j < nnz; ++j) {
      if (j + kAhead < nnz) __builtin_prefetch(v + idx[j + kAhead], 1);
      const std::uint64_t i = idx[j];
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
    return kSparseHeader + packed + nnz * vb;
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
  const auto format = static_cast<std::uint8_t>(pr[1]);
  const auto nnz = load_le<std::uint64_t>(pr + 8);
  if (values != kValuesF32 && values != kValuesF16) {
    bad_payload("unknown value type " + std::to_string(values));
  }
  if (p.version == 1 && format != index_width(p.n)) {
    bad_payload("index width " + std::to_string(format) + " bytes, expected " +
                std::to_string(index_width(p.n)) + " for " + std::to_string(p.n) + " elements");
  }
  if (p.version >= 2 && format != kPackedIndices) {
    bad_payload("index format " + std::to_string(format) + ", expected " +
                std::to_string(kPackedIndices) + " (packed gaps) in version " +
                std::to_string(p.version));
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
  const bool indices_fit =
      p.version == 1
          ? p.sections[0].size % format == 0 && p.sections[0].size / format == nnz
          : p.sections[0].size >= (nnz + kIndexBlock - 1) / kIndexBlock &&
                p.sections[0].size <= packed_indices_bound(nnz, p.n);
  if (!indices_fit || p.sections[1].size % vb != 0 || p.sections[1].size / vb != nnz) {
    bad_payload("sections of " + std::to_string(p.sections[0].size) + " and " +
                std::to_string(p.sections[1].size) + " bytes do not hold " + std::to_string(nnz) +
                " entries");
  }
}

// The indices of a payload whose layout is valid, checked (in range, strictly increasing; for
// version 2 every packing rule) into idx.
void read_indices(const Payload& p, std::vector<std::uint64_t>& idx) {
  const auto nnz = load_le<std::uint64_t>(p.params + 8);
  idx.resize(nnz);
  const std::byte* ip = p.sections[0].data;
  if (p.version >= 2) {
    try {
      unpack_indices({ip, static_cast<std::size_t>(p.sections[0].size)}, nnz, p.n, idx.data());
    } catch (const Error& e) {
      bad_payload(e.what());
    }
    return;
  }
  const auto ib = static_cast<std::uint8_t>(p.params[1]);
  for (std::uint64_t j = 0; j < nnz; ++j) {
    idx[j] = ib == 4 ? load_le<std::uint32_t>(ip + 4 * j) : load_le<std::uint64_t>(ip + 8 * j);
  }
  // The fast check first (kernels.hpp); only a bad payload is searched for what is wrong.
  if (indices_valid(ip, nnz, ib, p.n)) return;
  for (std::uint64_t j = 0; j < nnz; ++j) {
    if (idx[j] >= p.n) {
      bad_payload("index " + std::to_string(idx[j]) + " (entry " + std::to_string(j) +
                  ") is out of range for " + std::to_string(p.n) + " elements");
    }
    if (j > 0 && idx[j] <= idx[j - 1]) {
      bad_payload("indices not strictly increasing at entry " + std::to_string(j) + " (" +
                  std::to_string(idx[j - 1]) + " then " + std::to_string(idx[j]) + ")");
    }
  }
}

// Everything of validate_sparse; the checked indices are left in idx.
void check_sparse(const Payload& p, std::vector<std::uint64_t>& idx) {
  validate_sparse_layout(p);
  read_indices(p, idx);
  const auto nnz = load_le<std::uint64_t>(p.params + 8);
  const std::uint64_t vb = static_cast<std::uint8_t>(p.params[0]) == kValuesF16 ? 2 : 4;
  const std::byte* vp = p.sections[1].data;
  if (!any_inf_bits(vp, nnz, vb, vb == 4 ? kInfBits : 0x7c00u)) return;
  for (std::uint64_t j = 0; j < nnz; ++j) {
    const bool finite = vb == 4 ? (load_le<std::uint32_t>(vp + 4 * j) & kInfBits) != kInfBits
                                : half_is_finite(load_le<std::uint16_t>(vp + 2 * j));
    if (!finite) bad_payload("value of entry " + std::to_string(j) + " is NaN or Inf");
  }
}

void validate_sparse(const Payload& p) {
  check_sparse(p, scratch_vector<std::uint64_t, DecodedIndices>());
}

// acc += alpha * the entries, with the indices of a version 2 payload already in idx.
void scatter_entries(const Payload& p, const std::vector<std::uint64_t>& idx, float* acc,
                     float alpha) {
  const bool f16 = static_cast<std::uint8_t>(p.params[0]) == kValuesF16;
  const auto nnz = load_le<std::uint64_t>(p.params + 8);
  const std::byte* vp = p.sections[1].data;
  if (p.version == 1) {
    const auto ib = static_cast<std::uint8_t>(p.params[1]);
    scatter_add(acc, p.sections[0].data, vp, static_cast<std::size_t>(nnz), ib, f16, alpha);
    return;
  }
  for (std::uint64_t j = 0; j < nnz; ++j) {
    const float v =
        f16 ? half_to_float(load_le<std::uint16_t>(vp + 2 * j)) : load_le<float>(vp + 4 * j);
    acc[idx[j]] += alpha * v;
  }
}

void decode_add_sparse(const Payload& p, float* acc, float alpha) {
  std::vector<std::uint64_t>& idx = scratch_vector<std::uint64_t, DecodedIndices>();
  if (p.version >= 2) read_indices(p, idx);
  scatter_entries(p, idx, acc, alpha);
}

// validate_sparse and decode_add_sparse with the indices unpacked once.
void validate_decode_add_sparse(const Payload& p, float* acc, float alpha) {
  std::vector<std::uint64_t>& idx = scratch_vector<std::uint64_t, DecodedIndices>();
  check_sparse(p, idx);
  scatter_entries(p, idx, acc, alpha);
}

std::string describe_sparse(const Payload& p) {
  std::string index = "packed";
  if (p.version == 1) {
    index = "u";
    index += std::to_string(8 * static_cast<int>(p.params[1]));
  }
  return "nnz=" + std::to_string(load_le<std::uint64_t>(p.params + 8)) + ",index=" + index +
         ",values=" + (static_cast<std::uint8_t>(p.params[0]) == kValuesF16 ? "fp16" : "fp32");
}

std::unique_ptr<CodecImpl> make_topk(SpecReader& s) {
  // Per chunk (with codes, or values of each chunk's own): topk_chunked.cpp.
  if (s.has("chunk") || s.has("bits")) return make_topk_chunked(s);
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
// top-k's keys for the chunked form (topk_chunked.cpp).
const std::vector<SpecKey> kChunkKeys = {
    {"chunk", "", "per chunk of C elements (1..2^31): the k or round(R C) largest of each, "
                  "indices relative to the chunk"},
    {"bits", "", "the kept values as B-bit codes (1..8) with a scale per chunk (needs chunk)"}};

}  // namespace

std::uint64_t sparse_nnz(const Payload& p) {
  if (p.kind == CodecKind::topk_chunked) return chunked_nnz(p);
  if (p.kind != CodecKind::topk && p.kind != CodecKind::randomk && p.kind != CodecKind::threshold) {
    throw Error(Status::invalid_argument,
                std::string("sparse_nnz: a ") + codec_name(p.kind) + " payload is not sparse");
  }
  validate_sparse_layout(p);
  return load_le<std::uint64_t>(p.params + 8);
}

void read_sparse_entries(const Payload& p, SparseEntries& out, bool own) {
  if (p.kind == CodecKind::topk_chunked) return read_chunked_entries(p, out, own);
  if (p.kind != CodecKind::topk && p.kind != CodecKind::randomk && p.kind != CodecKind::threshold) {
    throw Error(Status::invalid_argument,
                std::string("sparse_entries: a ") + codec_name(p.kind) + " payload is not sparse");
  }
  if (own) {
    validate_sparse_layout(p);  // the header only: read_indices needs it
    read_indices(p, out.indices);
  } else {
    check_sparse(p, out.indices);  // the indices unpacked once, checked
  }
  const bool f16 = static_cast<std::uint8_t>(p.params[0]) == kValuesF16;
  const auto nnz = load_le<std::uint64_t>(p.params + 8);
  const std::byte* vp = p.sections[1].data;
  out.elements = p.n;
  out.values.resize(nnz);
  for (std::uint64_t j = 0; j < nnz; ++j) {
    out.values[j] =
        f16 ? half_to_float(load_le<std::uint16_t>(vp + 2 * j)) : load_le<float>(vp + 4 * j);
  }
}

const CodecEntry& topk_entry() {
  static const CodecEntry e{CodecKind::topk,
                            "topk",
                            "the k largest |x| exactly; indices ascending, ties to the lower index",
                            {kRatioKeys[0], kRatioKeys[1], kRatioKeys[2], kChunkKeys[0],
                             kChunkKeys[1]},
                            kSparsePayload,
                            make_topk,
                            validate_sparse,
                            decode_add_sparse,
                            describe_sparse,
                            validate_sparse_layout,
                            validate_decode_add_sparse};
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
                            kSparsePayload,
                            make_randomk,
                            validate_sparse,
                            decode_add_sparse,
                            describe_sparse,
                            validate_sparse_layout,
                            validate_decode_add_sparse};
  return e;
}
const CodecEntry& threshold_entry() {
  static const CodecEntry e{CodecKind::threshold,
                            "threshold",
                            "every element with |x| >= tau",
                            {{"tau", "", "the threshold, T >= 0 (required)"}, kRatioKeys[2]},
                            kSparsePayload,
                            make_threshold,
                            validate_sparse,
                            decode_add_sparse,
                            describe_sparse,
                            validate_sparse_layout,
                            validate_decode_add_sparse};
  return e;
}

}  // namespace gcomp::detail
