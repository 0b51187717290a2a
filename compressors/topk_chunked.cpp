// Top-k per chunk: the spec topk:ratio=R (or k=K),chunk=C[,bits=B] (wire codec topk_chunked,
// id 11). The tensor is cut into chunks of C elements (the last may be shorter); each chunk keeps
// its largest |v| (ties to the lower index): round(R len) of a chunk of len elements, at least
// one, or min(K, len). With bits=B the kept values travel as B-bit codes with one float32 scale
// per chunk (SparseLoCo's outer changes: 1-3% of each chunk at 2 bits). docs/wire-format.md:
//   params (32 bytes): u8 values (0 = f32, 1 = f16, 2 = B-bit codes), u8 index format (0 = the
//     global indices packed as gaps, index_pack.hpp; 1 = each index relative to its chunk in
//     bit_width(C - 1) bits), u8 B (codes: 1..8, else 0), 5 zero bytes, u64 C, u64 the entries
//     of every chunk but the last, u64 the last chunk's entries
//   sections: indices, scales (codes only: one f32 per chunk), values
// The encoder writes whichever index format is smaller (packed gaps when strictly smaller): a
// chunk-relative index costs bit_width(C - 1) bits (12 for 4096), packed gaps about
// log2(C / k) + 2 (8 at 1%).
//
// The codes (L = 2^(B-1) levels): a kept value a = |v| of a chunk whose largest kept |v| is m
// gets level l = min(floor(f32(a / m) * L), L - 1) and decodes to S q_l, q_l = (2l + 1) / 2^B,
// negated when v < 0 (the code's bit B-1); S is the least-squares scale of the chunk,
// S = f32(sum a_j q_j / sum q_j^2) (in double, in ascending index order; each product exact),
// saturating at FLT_MAX. The decoded vector is then the projection of |v| onto the code's
// direction, so the error never exceeds what was kept (|kept|^2 - (a.q)^2 / |q|^2): top-k with
// codes stays a contraction, and error feedback takes the rounding like the rest. For B = 1
// the scale is the mean |v| kept, scaled sign's.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "bits.hpp"
#include "bytes.hpp"
#include "codec_impl.hpp"
#include "half.hpp"
#include "index_pack.hpp"
#include "kernels.hpp"
#include "nonfinite.hpp"
#include "parallel.hpp"

namespace gcomp::detail {

// The scratch vectors (parallel.hpp) named: the selected global indices, the chunk's keys and
// their copy that the selection reorders, the codes or values of the entries, the decoded
// indices.
struct ChunkedIndices;
struct ChunkedKeys;
struct ChunkedOrder;
struct ChunkedValues;
struct ChunkedDecoded;

namespace {

constexpr std::uint8_t kF32 = 0, kF16 = 1, kCodes = 2;
constexpr std::uint8_t kPackedGaps = 0, kFixedRelative = 1;
constexpr Layout kChunkedPayload{32, 3};
constexpr std::size_t kChunkedHeader = header_bytes(kChunkedPayload);
constexpr std::uint64_t kMaxChunk = std::uint64_t{1} << 31;  // counts fit 32 bits (the kernels')

// The width of a chunk-relative index.
unsigned relative_width(std::uint64_t chunk) {
  return static_cast<unsigned>(std::bit_width(chunk - 1));
}

// ceil(count * bits / 8) without overflow (bits <= 64).
std::uint64_t bit_bytes(std::uint64_t count, unsigned bits) {
  return static_cast<std::uint64_t>(
      (static_cast<unsigned __int128>(count) * bits + 7) / 8);
}

// The multiplier of level l's scale: (2l + 1) / 2^B, exact in float32.
float level_fraction(std::uint32_t l, int bits) {
  return std::ldexp(static_cast<float>(2 * l + 1), -bits);
}

// A decoded code: S q_l, negated where the sign bit is set.
float decode_code(float scale, std::uint32_t code, int bits) {
  const std::uint32_t levels = 1u << (bits - 1);
  const float v = scale * level_fraction(code & (levels - 1), bits);
  return (code & levels) ? -v : v;
}

// The header's counts and what follows from them.
struct Shape {
  std::uint64_t n = 0, chunk = 1, per_chunk = 0, last = 0;
  std::uint64_t chunks = 0, nnz = 0;
  std::uint64_t last_len() const { return n - (chunks - 1) * chunk; }
  // The chunk of entry j (entries ascend, per_chunk to each chunk but the last).
  std::uint64_t chunk_of(std::uint64_t j) const {
    return per_chunk == 0 ? chunks - 1 : std::min(j / per_chunk, chunks - 1);
  }
};

Shape shape_of(std::uint64_t n, std::uint64_t chunk, std::uint64_t per_chunk,
               std::uint64_t last) {
  Shape s{n, chunk, per_chunk, last, 0, 0};
  s.chunks = ceil_div(n, chunk);
  s.nnz = s.chunks == 0 ? 0 : (s.chunks - 1) * per_chunk + last;
  return s;
}

// ---- the codec ----

class ChunkedTopk final : public CodecImpl {
 public:
  double ratio = 0;     // > 0 when a chunk's entries come from a ratio
  std::uint64_t k = 0;  // else per chunk
  std::uint64_t chunk = 0;
  int bits = 0;  // 0: values as f32 or f16
  bool fp16_values = false;

  CodecKind kind() const override { return CodecKind::topk_chunked; }

  std::string spec() const override {
    std::string s = "topk:";
    s += ratio > 0 ? "ratio=" + format_real(ratio) : "k=" + std::to_string(k);
    s += ",chunk=" + std::to_string(chunk);
    if (bits > 0) {
      s += ",bits=" + std::to_string(bits);
    } else {
      s += std::string(",values=") + (fp16_values ? "fp16" : "fp32");
    }
    return s;
  }

  CodecProperties properties() const override {
    CodecProperties p;
    p.sparse = true;
    p.contraction = true;  // the k largest of each chunk, codes by least squares (above)
    p.bits_per_element = 0;
    p.value_bytes = bits > 0 ? 0 : (fp16_values ? 2 : 4);
    p.sends_late = true;  // what is not selected waits in the residual
    return p;
  }

  // The entries a chunk of len elements (1 <= len <= chunk) keeps.
  std::uint64_t entries(std::uint64_t len) const {
    if (ratio > 0) {
      const double r = std::round(ratio * static_cast<double>(len));
      return std::min<std::uint64_t>(len, r < 1.0 ? 1 : static_cast<std::uint64_t>(r));
    }
    return std::min(k, len);
  }

  Shape shape(std::size_t n) const {
    if (n == 0) return shape_of(0, chunk, entries(chunk), 0);
    const std::uint64_t chunks = ceil_div(n, chunk);
    return shape_of(n, chunk, entries(chunk), entries(n - (chunks - 1) * chunk));
  }

  std::size_t selected(std::size_t n) const override {
    return static_cast<std::size_t>(shape(n).nnz);
  }

  // The sections but the indices'.
  std::size_t scale_bytes(const Shape& s) const {
    return bits > 0 ? static_cast<std::size_t>(4 * s.chunks) : 0;
  }
  std::size_t value_bytes(const Shape& s) const {
    if (bits > 0) return static_cast<std::size_t>(bit_bytes(s.nnz, static_cast<unsigned>(bits)));
    return static_cast<std::size_t>(s.nnz * (fp16_values ? 2 : 4));
  }
  std::size_t fixed_index_bytes(const Shape& s) const {
    return static_cast<std::size_t>(bit_bytes(s.nnz, relative_width(chunk)));
  }

  // The encoder never writes more index bytes than the fixed format's.
  std::size_t max_bytes(std::size_t n) const override {
    const Shape s = shape(n);
    return kChunkedHeader + fixed_index_bytes(s) + scale_bytes(s) + value_bytes(s);
  }
  std::size_t expected_bytes(std::size_t n, std::size_t entries) const override {
    const Shape s = shape(n);
    const double d = n == 0 ? 1.0 : static_cast<double>(entries) / static_cast<double>(n);
    const double packed = static_cast<double>(entries) * expected_packed_index_bytes(d);
    const double fixed = static_cast<double>(bit_bytes(entries, relative_width(chunk)));
    Shape e = s;
    e.nnz = entries;
    return kChunkedHeader + static_cast<std::size_t>(std::min(packed, fixed)) + scale_bytes(s) +
           value_bytes(e);
  }
  CodecParams params() const override {
    CodecParams p;
    p.fp16_values = fp16_values;
    p.bits = bits;
    p.chunk = chunk;
    return p;
  }
  std::uint64_t chunk_entries(std::uint64_t len) const override { return entries(len); }

  std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                     std::uint64_t /*seed*/, std::byte* out, std::size_t cap) const override {
    require_capacity(max_bytes(n), cap);
    const Shape s = shape(n);
    std::vector<std::uint64_t>& idx = scratch_vector<std::uint64_t, ChunkedIndices>();
    std::vector<float>& vals = scratch_vector<float, ChunkedValues>();  // values, or codes
    std::vector<float> scales(bits > 0 ? s.chunks : 0);
    idx.resize(s.nnz);
    vals.resize(s.nnz);
    std::atomic<bool> bad{false};
    parallel_for(s.chunks, threads_for(n), [&](std::size_t c) {
      if (!select_chunk(s, c, x, e_old, e_new, idx.data(), vals.data(),
                        bits > 0 ? &scales[c] : nullptr)) {
        bad.store(true, std::memory_order_relaxed);
      }
    });
    if (bad.load()) {
      if (e_old) throw_nonfinite_sum(x, e_old, n);
      throw_nonfinite(x, n);
    }
    // The index format: packed gaps where strictly smaller than the fixed widths.
    const std::size_t fixed = fixed_index_bytes(s);
    const std::size_t packed = packed_indices_size(idx.data(), idx.size());
    const bool gaps = packed < fixed;
    const std::size_t index_bytes = gaps ? packed : fixed;
    std::byte params[32] = {};
    params[0] = std::byte{bits > 0 ? kCodes : (fp16_values ? kF16 : kF32)};
    params[1] = std::byte{gaps ? kPackedGaps : kFixedRelative};
    params[2] = static_cast<std::byte>(bits);
    store_le<std::uint64_t>(params + 8, s.chunk);
    store_le<std::uint64_t>(params + 16, s.per_chunk);
    store_le<std::uint64_t>(params + 24, s.last);
    std::byte* p =
        write_header(out, kind(), n, params, {index_bytes, scale_bytes(s), value_bytes(s)});
    if (gaps) {
      pack_indices(idx.data(), idx.size(), p);
    } else {
      write_relative(s, idx.data(), p);
    }
    p += index_bytes;
    for (float sc : scales) {
      store_le<float>(p, sc);
      p += 4;
    }
    if (bits > 0) {
      write_codes(vals.data(), s.nnz, p);
    } else {
      for (std::uint64_t j = 0; j < s.nnz; ++j) {
        if (fp16_values) {
          store_le<std::uint16_t>(p + 2 * j, static_cast<std::uint16_t>(vals[j]));
        } else {
          store_le<float>(p + 4 * j, vals[j]);
        }
      }
    }
    return kChunkedHeader + index_bytes + scale_bytes(s) + value_bytes(s);
  }

 private:
  // Chunk c: v = x (+ e_old, into e_new), its entries selected into idx (global indices, in
  // ascending order, at the chunk's first entry) with their codes (as floats) or values (f32,
  // or the f16 bits) into vals, its scale, and with error feedback e_new = v - sent at them.
  // Returns false where v holds a NaN or Inf (nothing else is then of use).
  bool select_chunk(const Shape& s, std::size_t c, const float* x, const float* e_old,
                    float* e_new, std::uint64_t* idx, float* vals, float* scale) const {
    const std::uint64_t b = c * s.chunk;
    const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(s.n - b, s.chunk));
    const float* v = x + b;
    if (e_old) {
      add(x + b, e_old + b, len, e_new + b);
      v = e_new + b;
    }
    std::vector<std::uint32_t>& keys = scratch_vector<std::uint32_t, ChunkedKeys>();
    keys.resize(len);
    if (abs_keys(v, len, keys.data())) return false;
    const std::uint64_t first = c * s.per_chunk;
    const std::size_t kk =
        static_cast<std::size_t>(c + 1 == s.chunks ? s.last : s.per_chunk);
    std::uint64_t* out = idx + first;
    if (kk == len) {
      for (std::size_t i = 0; i < len; ++i) out[i] = b + i;
    } else {
      // The kk-th largest key T (nth_element on a copy): every key above it is taken, and
      // the first of those equal to it while any are needed.
      std::vector<std::uint32_t>& tmp = scratch_vector<std::uint32_t, ChunkedOrder>();
      tmp.assign(keys.begin(), keys.end());
      std::nth_element(tmp.begin(), tmp.begin() + static_cast<std::ptrdiff_t>(kk - 1), tmp.end(),
                       [](std::uint32_t a, std::uint32_t bb) { return a > bb; });
      const std::uint32_t t = tmp[kk - 1];
      std::size_t greater = 0;
      for (std::size_t i = 0; i < len; ++i) greater += keys[i] > t;
      std::size_t ties = kk - greater, m = 0;
      for (std::size_t i = 0; i < len; ++i) {
        if (keys[i] > t || (keys[i] == t && ties > 0)) {
          if (keys[i] == t) --ties;
          out[m++] = b + i;
        }
      }
    }
    float* val = vals + first;
    if (bits == 0) {
      for (std::size_t j = 0; j < kk; ++j) {
        const float a = v[out[j] - b];
        float sent = a;
        if (fp16_values) {
          const std::uint16_t h = float_to_half(a);
          val[j] = static_cast<float>(h);  // the bits, carried as a float (exact: < 2^16)
          sent = half_to_float(h);
        } else {
          val[j] = a;
        }
        if (e_old) e_new[out[j]] = a - sent;
      }
      return true;
    }
    // Codes: levels from the largest kept |v|, then the least-squares scale.
    const std::uint32_t levels = 1u << (bits - 1);
    float m = 0;
    for (std::size_t j = 0; j < kk; ++j) m = std::max(m, std::fabs(v[out[j] - b]));
    double num = 0, den = 0;
    for (std::size_t j = 0; j < kk; ++j) {
      const float a = std::fabs(v[out[j] - b]);
      std::uint32_t l = 0;
      if (m > 0) {
        const float r = a / m;
        l = std::min(static_cast<std::uint32_t>(r * static_cast<float>(levels)), levels - 1);
      }
      const double q = static_cast<double>(level_fraction(l, bits));
      num += static_cast<double>(a) * q;
      den += q * q;
      const bool negative = v[out[j] - b] < 0;
      val[j] = static_cast<float>(l | (negative ? levels : 0u));
    }
    const double ls = den > 0 ? num / den : 0.0;
    const float sc = ls > static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(ls);
    *scale = sc;
    if (e_old) {
      for (std::size_t j = 0; j < kk; ++j) {
        const std::uint64_t i = out[j];
        e_new[i] = e_new[i] - decode_code(sc, static_cast<std::uint32_t>(val[j]), bits);
      }
    }
    return true;
  }

  // Each index relative to its chunk, in relative_width(C) bits, in the bit order of QSGD's codes.
  void write_relative(const Shape& s, const std::uint64_t* idx, std::byte* out) const {
    const unsigned w = relative_width(s.chunk);
    unsigned __int128 acc = 0;
    unsigned used = 0;
    for (std::uint64_t j = 0; j < s.nnz; ++j) {
      const std::uint64_t rel = idx[j] - s.chunk_of(j) * s.chunk;
      acc |= static_cast<unsigned __int128>(rel) << used;
      used += w;
      while (used >= 8) {
        *out++ = static_cast<std::byte>(static_cast<std::uint8_t>(acc));
        acc >>= 8;
        used -= 8;
      }
    }
    if (used > 0) *out = static_cast<std::byte>(static_cast<std::uint8_t>(acc));
  }

  void write_codes(const float* codes, std::uint64_t nnz, std::byte* out) const {
    std::uint32_t acc = 0;
    int used = 0;
    for (std::uint64_t j = 0; j < nnz; ++j) {
      acc |= static_cast<std::uint32_t>(codes[j]) << used;
      used += bits;
      while (used >= 8) {
        *out++ = static_cast<std::byte>(acc & 0xffu);
        acc >>= 8;
        used -= 8;
      }
    }
    if (used > 0) *out = static_cast<std::byte>(acc & 0xffu);
  }
};

// ---- payloads ----

Shape payload_shape(const Payload& p) {
  return shape_of(p.n, load_le<std::uint64_t>(p.params + 8), load_le<std::uint64_t>(p.params + 16),
                  load_le<std::uint64_t>(p.params + 24));
}

void validate_chunked_layout(const Payload& p) {
  if (p.version < 2) bad_payload("a topk_chunked payload in version " + std::to_string(p.version) +
                                 " (the codec is read from version 2 on)");
  const std::byte* pr = p.params;
  const auto values = static_cast<std::uint8_t>(pr[0]);
  const auto format = static_cast<std::uint8_t>(pr[1]);
  const auto bits = static_cast<std::uint8_t>(pr[2]);
  if (values > kCodes) bad_payload("unknown value type " + std::to_string(values));
  if (format > kFixedRelative) bad_payload("unknown index format " + std::to_string(format));
  if (values == kCodes ? bits < 1 || bits > 8 : bits != 0) {
    bad_payload(std::to_string(bits) + " code bits with value type " + std::to_string(values));
  }
  for (int i = 3; i < 8; ++i) {
    if (pr[i] != std::byte{0})
      bad_payload("reserved parameter byte " + std::to_string(i) + " is not zero");
  }
  const std::uint64_t chunk = load_le<std::uint64_t>(pr + 8);
  const std::uint64_t per = load_le<std::uint64_t>(pr + 16);
  const std::uint64_t last = load_le<std::uint64_t>(pr + 24);
  if (chunk < 1 || chunk > kMaxChunk) {
    bad_payload("chunk of " + std::to_string(chunk) + " elements (1 to 2^31)");
  }
  if (per > chunk) {
    bad_payload(std::to_string(per) + " entries in a chunk of " + std::to_string(chunk));
  }
  const Shape s = payload_shape(p);
  if (p.n == 0 ? last != 0 : last > s.last_len()) {
    bad_payload(std::to_string(last) + " entries in a last chunk of " +
                std::to_string(p.n == 0 ? 0 : s.last_len()) + " elements");
  }
  const std::uint64_t index_bytes = p.sections[0].size;
  const bool indices_fit = format == kFixedRelative
                               ? index_bytes == bit_bytes(s.nnz, relative_width(chunk))
                               : index_bytes >= ceil_div(s.nnz, kIndexBlock) &&
                                     index_bytes <= packed_indices_bound(s.nnz, p.n);
  const std::uint64_t scales = values == kCodes ? 4 * s.chunks : 0;
  const std::uint64_t value_bytes = values == kCodes ? bit_bytes(s.nnz, bits)
                                    : values == kF16 ? 2 * s.nnz
                                                     : 4 * s.nnz;
  if (!indices_fit || p.sections[1].size != scales || p.sections[2].size != value_bytes) {
    bad_payload("sections of " + std::to_string(p.sections[0].size) + ", " +
                std::to_string(p.sections[1].size) + " and " + std::to_string(p.sections[2].size) +
                " bytes do not hold " + std::to_string(s.nnz) + " entries in " +
                std::to_string(s.chunks) + " chunks");
  }
}

// The payload's global indices, checked (every rule of the format; each chunk holds its count),
// into idx.
void read_chunked_indices(const Payload& p, std::vector<std::uint64_t>& idx) {
  const Shape s = payload_shape(p);
  idx.resize(s.nnz);
  const std::byte* ip = p.sections[0].data;
  if (static_cast<std::uint8_t>(p.params[1]) == kPackedGaps) {
    try {
      unpack_indices({ip, static_cast<std::size_t>(p.sections[0].size)}, s.nnz, p.n, idx.data());
    } catch (const Error& e) {
      bad_payload(e.what());
    }
    for (std::uint64_t j = 0; j < s.nnz; ++j) {
      if (idx[j] / s.chunk != s.chunk_of(j)) {
        bad_payload("entry " + std::to_string(j) + " (index " + std::to_string(idx[j]) +
                    ") is not in chunk " + std::to_string(s.chunk_of(j)) +
                    ": the chunks do not hold their counts");
      }
    }
    return;
  }
  const unsigned w = relative_width(s.chunk);
  const std::uint64_t mask = w == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << w) - 1;
  unsigned __int128 acc = 0;
  unsigned have = 0;
  const std::byte* q = ip;
  std::uint64_t prev_chunk = ~std::uint64_t{0}, prev_rel = 0;
  for (std::uint64_t j = 0; j < s.nnz; ++j) {
    while (have < w) {
      acc |= static_cast<unsigned __int128>(static_cast<std::uint8_t>(*q++)) << have;
      have += 8;
    }
    const std::uint64_t rel = static_cast<std::uint64_t>(acc) & mask;
    acc >>= w;
    have -= w;
    const std::uint64_t c = s.chunk_of(j);
    const std::uint64_t len = c + 1 == s.chunks ? s.last_len() : s.chunk;
    if (rel >= len) {
      bad_payload("entry " + std::to_string(j) + ": index " + std::to_string(rel) +
                  " in a chunk of " + std::to_string(len));
    }
    if (c == prev_chunk && rel <= prev_rel) {
      bad_payload("indices not strictly increasing at entry " + std::to_string(j));
    }
    prev_chunk = c;
    prev_rel = rel;
    idx[j] = c * s.chunk + rel;
  }
  if (acc != 0) bad_payload("nonzero padding bits in the indices");
}

// Everything of validate beyond the layout; the checked indices are left in idx.
void check_chunked(const Payload& p, std::vector<std::uint64_t>& idx) {
  validate_chunked_layout(p);
  read_chunked_indices(p, idx);
  const Shape s = payload_shape(p);
  const auto values = static_cast<std::uint8_t>(p.params[0]);
  const std::byte* vp = p.sections[2].data;
  if (values == kCodes) {
    const std::byte* sp = p.sections[1].data;
    for (std::uint64_t c = 0; c < s.chunks; ++c) {
      const std::uint32_t u = load_le<std::uint32_t>(sp + 4 * c);
      if ((u & kInfBits) == kInfBits || (u >> 31) != 0) {
        bad_payload("scale of chunk " + std::to_string(c) + " is negative, NaN or Inf");
      }
    }
    const auto bits = static_cast<unsigned>(p.params[2]);
    if (!padding_is_zero(vp, p.sections[2].size, s.nnz * bits)) {
      bad_payload("nonzero padding bits in the codes");
    }
    return;
  }
  const std::uint64_t vb = values == kF16 ? 2 : 4;
  if (!any_inf_bits(vp, s.nnz, vb, vb == 4 ? kInfBits : 0x7c00u)) return;
  for (std::uint64_t j = 0; j < s.nnz; ++j) {
    const bool finite = vb == 4 ? (load_le<std::uint32_t>(vp + 4 * j) & kInfBits) != kInfBits
                                : half_is_finite(load_le<std::uint16_t>(vp + 2 * j));
    if (!finite) bad_payload("value of entry " + std::to_string(j) + " is NaN or Inf");
  }
}

// Entry j's value as float32.
struct ValueReader {
  std::uint8_t type;
  int bits;
  std::uint64_t per_chunk, chunks;
  const std::byte* scales;
  const std::byte* values;
  float operator()(std::uint64_t j, std::uint64_t chunk) const {
    if (type == kF32) return load_le<float>(values + 4 * j);
    if (type == kF16) return half_to_float(load_le<std::uint16_t>(values + 2 * j));
    const std::uint64_t bit = j * static_cast<std::uint64_t>(bits);
    std::uint32_t w = static_cast<std::uint32_t>(values[bit >> 3]);
    if ((bit & 7) + static_cast<unsigned>(bits) > 8) {
      w |= static_cast<std::uint32_t>(values[(bit >> 3) + 1]) << 8;
    }
    const std::uint32_t code = (w >> (bit & 7)) & ((1u << bits) - 1u);
    return decode_code(load_le<float>(scales + 4 * chunk), code, bits);
  }
};

ValueReader reader_of(const Payload& p) {
  const Shape s = payload_shape(p);
  return {static_cast<std::uint8_t>(p.params[0]), static_cast<int>(p.params[2]), s.per_chunk,
          s.chunks, p.sections[1].data, p.sections[2].data};
}

void scatter_chunked(const Payload& p, const std::vector<std::uint64_t>& idx, float* acc,
                     float alpha) {
  const Shape s = payload_shape(p);
  const ValueReader value = reader_of(p);
  for (std::uint64_t j = 0; j < s.nnz; ++j) acc[idx[j]] += alpha * value(j, s.chunk_of(j));
}

void validate_chunked(const Payload& p) {
  check_chunked(p, scratch_vector<std::uint64_t, ChunkedDecoded>());
}

void decode_add_chunked(const Payload& p, float* acc, float alpha) {
  std::vector<std::uint64_t>& idx = scratch_vector<std::uint64_t, ChunkedDecoded>();
  read_chunked_indices(p, idx);
  scatter_chunked(p, idx, acc, alpha);
}

void validate_decode_add_chunked(const Payload& p, float* acc, float alpha) {
  std::vector<std::uint64_t>& idx = scratch_vector<std::uint64_t, ChunkedDecoded>();
  check_chunked(p, idx);
  scatter_chunked(p, idx, acc, alpha);
}

std::string describe_chunked(const Payload& p) {
  const Shape s = payload_shape(p);
  const auto values = static_cast<std::uint8_t>(p.params[0]);
  return "chunk=" + std::to_string(s.chunk) + ",per_chunk=" + std::to_string(s.per_chunk) +
         ",last=" + std::to_string(s.last) + ",nnz=" + std::to_string(s.nnz) + ",index=" +
         (static_cast<std::uint8_t>(p.params[1]) == kPackedGaps ? "packed" : "relative") +
         ",values=" +
         (values == kCodes ? "bits" + std::to_string(static_cast<int>(p.params[2]))
          : values == kF16 ? "fp16"
                           : "fp32");
}

[[noreturn]] std::unique_ptr<CodecImpl> refuse_wire_name(SpecReader& spec) {
  spec.fail("topk_chunked is the wire name of top-k per chunk: write topk:ratio=R,chunk=C"
            "[,bits=B]");
}

}  // namespace

std::unique_ptr<CodecImpl> make_topk_chunked(SpecReader& spec) {
  auto c = std::make_unique<ChunkedTopk>();
  const auto ratio = spec.real("ratio", 0.0, true, 1.0, false);
  const auto k = spec.integer("k", 1, UINT64_MAX);
  if (ratio && k) spec.fail("give either ratio or k, not both");
  if (!ratio && !k) spec.fail("topk needs ratio=R (0 < R <= 1) or k=K");
  if (ratio) c->ratio = *ratio;
  if (k) c->k = *k;
  const auto chunk = spec.integer("chunk", 1, kMaxChunk);
  const auto bits = spec.integer("bits", 1, 8);
  if (!chunk) spec.fail("bits=B codes the values of each chunk with a scale of its own: give chunk=C too");
  c->chunk = *chunk;
  const auto values = spec.choice("values", {"fp32", "fp16"});
  if (bits && values) spec.fail("bits=B codes the values: not with values=" + *values);
  if (bits) c->bits = static_cast<int>(*bits);
  c->fp16_values = values.value_or("fp32") == "fp16";
  spec.finish();
  return c;
}

std::uint64_t chunked_nnz(const Payload& p) {
  validate_chunked_layout(p);
  return payload_shape(p).nnz;
}

void read_chunked_entries(const Payload& p, SparseEntries& out, bool own) {
  if (own) {
    validate_chunked_layout(p);
    read_chunked_indices(p, out.indices);
  } else {
    check_chunked(p, out.indices);
  }
  const Shape s = payload_shape(p);
  const ValueReader value = reader_of(p);
  out.elements = p.n;
  out.values.resize(s.nnz);
  for (std::uint64_t j = 0; j < s.nnz; ++j) out.values[j] = value(j, s.chunk_of(j));
}

const CodecEntry& topk_chunked_entry() {
  static const CodecEntry e{CodecKind::topk_chunked,
                            "topk_chunked",
                            "top-k per chunk (spelled topk:...,chunk=C[,bits=B])",
                            {},
                            kChunkedPayload,
                            refuse_wire_name,
                            validate_chunked,
                            decode_add_chunked,
                            describe_chunked,
                            validate_chunked_layout,
                            validate_decode_add_chunked,
                            /*wire_only=*/true};
  return e;
}

}  // namespace gcomp::detail
