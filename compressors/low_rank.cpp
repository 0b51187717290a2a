// powersgd: the codec entry (its spec and properties) and PowerSGD's per-matrix kernels
// (low_rank.hpp). The scheme itself runs across ranks in the collectives' low_rank algorithm
// (collectives/algorithms/low_rank.cpp); the codec has no payload of its own, so its encode and its payload
// validation refuse, naming where it runs.
#include "low_rank.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "codec_impl.hpp"
#include "parallel.hpp"
#include "philox.hpp"
#include "simd.hpp"

namespace gcomp::detail {

namespace {

constexpr std::size_t kMaxRank = 1024;  // the spec's largest rank

class PowerSgdCodec final : public CodecImpl {
 public:
  LowRankSpec s;

  CodecKind kind() const override { return CodecKind::powersgd; }
  std::string spec() const override {
    return "powersgd:rank=" + std::to_string(s.rank) +
           ",warm_start=" + (s.warm_start ? "true" : "false") +
           ",min_compression_rate=" + format_real(s.min_compression_rate) +
           ",values=" + (s.fp16 ? "fp16" : "fp32") +
           ",alternate=" + (s.alternate ? "true" : "false") + ",start=" + std::to_string(s.start);
  }
  CodecProperties properties() const override {
    CodecProperties p;
    p.low_rank = true;
    p.stochastic = true;  // Q's random start
    // P P^T M, the projection on an orthonormal basis, is never longer than M: a contraction
    // (exactly so for one rank; Vogels et al. run it with error feedback).
    p.contraction = true;
    p.bits_per_element = 32;  // what goes dense; the factors' share depends on the shapes
    p.needs_shapes = true;    // each gradient factored as a matrix
    p.value_bytes = s.fp16 ? 2 : 4;  // the factors' (values=fp16: binary16)
    p.start_steps = s.start;
    return p;
  }
  // A bound for whatever this codec makes travel of n elements: the dense ones, as float32.
  std::size_t max_bytes(std::size_t n) const override { return 4 * n; }
  CodecParams params() const override {
    CodecParams p;
    p.fp16_values = s.fp16;
    return p;
  }
  std::size_t encode(const float*, const float*, float*, std::size_t, std::uint64_t, std::byte*,
                     std::size_t) const override {
    throw Error(Status::invalid_argument,
                spec() +
                    " is a low-rank scheme across ranks with no payload of its own: it runs in "
                    "Communicator::allreduce_buckets given each tensor's shape (the low_rank "
                    "algorithm)");
  }
};

std::unique_ptr<CodecImpl> make_powersgd(SpecReader& spec) {
  auto c = std::make_unique<PowerSgdCodec>();
  c->s.rank = static_cast<std::size_t>(spec.integer("rank", 1, kMaxRank).value_or(1));
  c->s.warm_start = spec.boolean("warm_start").value_or(true);
  c->s.min_compression_rate = spec.real("min_compression_rate", 1, false, 1e9, false).value_or(2);
  c->s.fp16 = spec.choice("values", {"fp32", "fp16"}).value_or("fp32") == "fp16";
  c->s.alternate = spec.boolean("alternate").value_or(false);
  c->s.start = spec.integer("start", 0, std::uint64_t{1} << 32).value_or(0);
  spec.finish();
  return c;
}

[[noreturn]] void no_payload(const Payload&) {
  bad_payload("powersgd has no payloads (its factors travel as float32 or binary16 sums)");
}
void no_decode(const Payload& p, float*, float) { no_payload(p); }
std::string no_describe(const Payload& p) { no_payload(p); }

struct LowRankQ;  // scratch: Q as doubles

// The kernels' bodies, compiled for each SIMD level (GCOMP_MULTIVERSION). Each output element is
// one float64 sum in a fixed order (sequential over k, over i, over j); the levels only choose
// how many independent sums run side by side, so every level gives the same bits. R > 0 is the
// rank fixed at compile time (the inner loops unroll), R = 0 the rank r at run time.

// Four doubles as one value (GCC's vector extension: one AVX register, or two SSE2 ones at the
// baseline), for rank 4, whose sums the auto-vectorizer leaves scalar; the same operations, lane
// by lane, as the scalar loops.
typedef double Double4 __attribute__((vector_size(32)));
// (Loads and stores through memcpy, which neither returns nor passes the type by value: its
// ABI differs between the levels.)

// p = m q for rows [i0, i1): four rows at a time (four independent sums of each column j).
template <std::size_t R>
GCOMP_ALWAYS_INLINE void mq_rows(const float* m, std::size_t cols, const double* qd, std::size_t r,
                                 std::size_t i0, std::size_t i1, float* p) {
  const std::size_t rr = R ? R : r;
  constexpr std::size_t W = R ? R : kMaxRank;
  std::size_t i = i0;
  if constexpr (R == 4) {
    for (; i + 4 <= i1; i += 4) {
      Double4 a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
      const float* m0 = m + i * cols;
      const float *m1 = m0 + cols, *m2 = m1 + cols, *m3 = m2 + cols;
      for (std::size_t k = 0; k < cols; ++k) {
        Double4 qk;
        std::memcpy(&qk, qd + k * 4, sizeof qk);
        a0 += static_cast<double>(m0[k]) * qk;
        a1 += static_cast<double>(m1[k]) * qk;
        a2 += static_cast<double>(m2[k]) * qk;
        a3 += static_cast<double>(m3[k]) * qk;
      }
      for (std::size_t j = 0; j < 4; ++j) {
        p[i * 4 + j] = static_cast<float>(a0[j]);
        p[(i + 1) * 4 + j] = static_cast<float>(a1[j]);
        p[(i + 2) * 4 + j] = static_cast<float>(a2[j]);
        p[(i + 3) * 4 + j] = static_cast<float>(a3[j]);
      }
    }
  }
  for (; i + 4 <= i1; i += 4) {
    double a0[W], a1[W], a2[W], a3[W];
    for (std::size_t j = 0; j < rr; ++j) a0[j] = a1[j] = a2[j] = a3[j] = 0;
    const float* m0 = m + i * cols;
    const float *m1 = m0 + cols, *m2 = m1 + cols, *m3 = m2 + cols;
    for (std::size_t k = 0; k < cols; ++k) {
      const double* qk = qd + k * rr;
      const double x0 = m0[k], x1 = m1[k], x2 = m2[k], x3 = m3[k];
      for (std::size_t j = 0; j < rr; ++j) {
        a0[j] += x0 * qk[j];
        a1[j] += x1 * qk[j];
        a2[j] += x2 * qk[j];
        a3[j] += x3 * qk[j];
      }
    }
    for (std::size_t j = 0; j < rr; ++j) {
      p[i * rr + j] = static_cast<float>(a0[j]);
      p[(i + 1) * rr + j] = static_cast<float>(a1[j]);
      p[(i + 2) * rr + j] = static_cast<float>(a2[j]);
      p[(i + 3) * rr + j] = static_cast<float>(a3[j]);
    }
  }
  for (; i < i1; ++i) {
    double a[W];
    for (std::size_t j = 0; j < rr; ++j) a[j] = 0;
    const float* mi = m + i * cols;
    for (std::size_t k = 0; k < cols; ++k) {
      const double x = mi[k];
      for (std::size_t j = 0; j < rr; ++j) a[j] += x * qd[k * rr + j];
    }
    for (std::size_t j = 0; j < rr; ++j) p[i * rr + j] = static_cast<float>(a[j]);
  }
}

// acc[k][:] += m[i][k] p[i][:] over every row i in order, for columns [k0, k1); four rows a pass
// over acc, added one after another (the same order as one row a pass).
template <std::size_t R>
GCOMP_ALWAYS_INLINE void mtp_cols(const float* m, std::size_t rows, std::size_t cols,
                                  const float* p, std::size_t r, std::size_t k0, std::size_t k1,
                                  double* acc) {
  const std::size_t rr = R ? R : r;
  constexpr std::size_t W = R ? R : kMaxRank;
  std::size_t i = 0;
  if constexpr (R == 4) {
    for (; i + 4 <= rows; i += 4) {
      const Double4 p0 = {p[i * 4], p[i * 4 + 1], p[i * 4 + 2], p[i * 4 + 3]};
      const Double4 p1 = {p[i * 4 + 4], p[i * 4 + 5], p[i * 4 + 6], p[i * 4 + 7]};
      const Double4 p2 = {p[i * 4 + 8], p[i * 4 + 9], p[i * 4 + 10], p[i * 4 + 11]};
      const Double4 p3 = {p[i * 4 + 12], p[i * 4 + 13], p[i * 4 + 14], p[i * 4 + 15]};
      const float* m0 = m + i * cols;
      const float *m1 = m0 + cols, *m2 = m1 + cols, *m3 = m2 + cols;
      for (std::size_t k = k0; k < k1; ++k) {
        Double4 ak;
        std::memcpy(&ak, acc + k * 4, sizeof ak);
        ak = (((ak + static_cast<double>(m0[k]) * p0) + static_cast<double>(m1[k]) * p1) +
              static_cast<double>(m2[k]) * p2) +
             static_cast<double>(m3[k]) * p3;
        std::memcpy(acc + k * 4, &ak, sizeof ak);
      }
    }
  }
  for (; i + 4 <= rows; i += 4) {
    double p0[W], p1[W], p2[W], p3[W];
    for (std::size_t j = 0; j < rr; ++j) {
      p0[j] = p[i * rr + j];
      p1[j] = p[(i + 1) * rr + j];
      p2[j] = p[(i + 2) * rr + j];
      p3[j] = p[(i + 3) * rr + j];
    }
    const float* m0 = m + i * cols;
    const float *m1 = m0 + cols, *m2 = m1 + cols, *m3 = m2 + cols;
    for (std::size_t k = k0; k < k1; ++k) {
      const double x0 = m0[k], x1 = m1[k], x2 = m2[k], x3 = m3[k];
      double* ak = acc + k * rr;
      for (std::size_t j = 0; j < rr; ++j) {
        ak[j] = (((ak[j] + x0 * p0[j]) + x1 * p1[j]) + x2 * p2[j]) + x3 * p3[j];
      }
    }
  }
  for (; i < rows; ++i) {
    double pd[W];
    for (std::size_t j = 0; j < rr; ++j) pd[j] = p[i * rr + j];
    const float* mi = m + i * cols;
    for (std::size_t k = k0; k < k1; ++k) {
      const double x = mi[k];
      double* ak = acc + k * rr;
      for (std::size_t j = 0; j < rr; ++j) ak[j] += x * pd[j];
    }
  }
}

// Rows [i0, i1) of a b^T with bt = b transposed (r x cols, doubles): s = sum_j a[i][j] bt[j][k]
// in j order (from 0), k running across the vector lanes; out = s out_scale, e = m - float(s
// share_scale).
template <std::size_t R>
GCOMP_ALWAYS_INLINE void rec_rows(const float* a, const double* bt, std::size_t cols, std::size_t r,
                                  double out_scale, float* out, double share_scale, const float* m,
                                  float* e, std::size_t i0, std::size_t i1) {
  const std::size_t rr = R ? R : r;
  constexpr std::size_t W = R ? R : kMaxRank;
  for (std::size_t i = i0; i < i1; ++i) {
    double ad[W];
    for (std::size_t j = 0; j < rr; ++j) ad[j] = a[i * rr + j];
    const std::size_t row = i * cols;
    for (std::size_t k = 0; k < cols; ++k) {
      double s = 0;
      for (std::size_t j = 0; j < rr; ++j) s += ad[j] * bt[j * cols + k];
      if (e) e[row + k] = m[row + k] - static_cast<float>(s * share_scale);
      if (out) out[row + k] = static_cast<float>(s * out_scale);
    }
  }
}

template <class F>
GCOMP_ALWAYS_INLINE void by_rank(std::size_t r, F&& f) {
  switch (r) {
    case 1:
      return f(std::integral_constant<std::size_t, 1>{});
    case 2:
      return f(std::integral_constant<std::size_t, 2>{});
    case 4:
      return f(std::integral_constant<std::size_t, 4>{});
    case 8:
      return f(std::integral_constant<std::size_t, 8>{});
    default:
      return f(std::integral_constant<std::size_t, 0>{});
  }
}

GCOMP_ALWAYS_INLINE void mq_block_body(const float* m, std::size_t cols, const double* qd,
                                       std::size_t r, std::size_t i0, std::size_t i1, float* p) {
  by_rank(r, [&](auto R) { mq_rows<decltype(R)::value>(m, cols, qd, r, i0, i1, p); });
}
GCOMP_MULTIVERSION(void, mq_block,
                   (const float* m, std::size_t cols, const double* qd, std::size_t r,
                    std::size_t i0, std::size_t i1, float* p),
                   (m, cols, qd, r, i0, i1, p))

GCOMP_ALWAYS_INLINE void mtp_block_body(const float* m, std::size_t rows, std::size_t cols,
                                        const float* p, std::size_t r, std::size_t k0,
                                        std::size_t k1, double* acc) {
  by_rank(r, [&](auto R) { mtp_cols<decltype(R)::value>(m, rows, cols, p, r, k0, k1, acc); });
}
GCOMP_MULTIVERSION(void, mtp_block,
                   (const float* m, std::size_t rows, std::size_t cols, const float* p,
                    std::size_t r, std::size_t k0, std::size_t k1, double* acc),
                   (m, rows, cols, p, r, k0, k1, acc))

GCOMP_ALWAYS_INLINE void rec_block_body(const float* a, const double* bt, std::size_t cols,
                                        std::size_t r, double out_scale, float* out,
                                        double share_scale, const float* m, float* e,
                                        std::size_t i0, std::size_t i1) {
  by_rank(r, [&](auto R) {
    rec_rows<decltype(R)::value>(a, bt, cols, r, out_scale, out, share_scale, m, e, i0, i1);
  });
}
GCOMP_MULTIVERSION(void, rec_block,
                   (const float* a, const double* bt, std::size_t cols, std::size_t r,
                    double out_scale, float* out, double share_scale, const float* m, float* e,
                    std::size_t i0, std::size_t i1),
                   (a, bt, cols, r, out_scale, out, share_scale, m, e, i0, i1))

// Chunks of [0, n) for the threads: each chunk's work is the same whatever the thread count.
constexpr std::size_t kBlock = 64;

}  // namespace

const CodecEntry& powersgd_entry() {
  static const CodecEntry e{
      CodecKind::powersgd,
      "powersgd",
      "PowerSGD rank-r factors of each matrix (P = M Q, Q = M^T P), summed across ranks by "
      "allreduce_buckets with shapes (the low_rank algorithm); 1-D and small matrices dense",
      {{"rank", "1", "r, the factors' columns (1..1024)"},
       {"warm_start", "true", "keep Q per matrix from step to step"},
       {"min_compression_rate", "2",
        "compress a matrix only if rows x cols >= this x (rows + cols) r"},
       {"values", "fp32", "the factors on the wire: fp32, or fp16 (summed in float32)"},
       {"alternate", "false", "ACP-SGD: P on one step, Q on the next, one allreduce a step"},
       {"start", "0", "dense steps before the first compressed one"}},
      Layout{0, 0},  // no payload
      make_powersgd,
      no_payload,
      no_decode,
      no_describe,
      no_payload};
  return e;
}

const LowRankSpec& low_rank_spec(const Codec& codec) {
  const auto* c = dynamic_cast<const PowerSgdCodec*>(&codec.impl());
  if (!c) throw Error(Status::internal, "low_rank_spec of " + codec.spec());
  return c->s;
}

std::size_t low_rank_of(std::uint64_t rows, std::uint64_t cols, const LowRankSpec& spec) {
  if (rows <= 1 || cols <= 1) return 0;
  const double r = static_cast<double>(std::min<std::uint64_t>(spec.rank, std::min(rows, cols)));
  const double full = static_cast<double>(rows) * static_cast<double>(cols);
  const double factors = (static_cast<double>(rows) + static_cast<double>(cols)) * r;
  return full >= spec.min_compression_rate * factors ? static_cast<std::size_t>(r) : 0;
}

void lr_multiply(const float* m, std::size_t rows, std::size_t cols, const float* q, std::size_t r,
                 float* p) {
  std::vector<double>& qd = scratch_vector<double, LowRankQ>();
  qd.assign(q, q + cols * r);
  const std::size_t blocks = (rows + kBlock - 1) / kBlock;
  parallel_for(blocks, threads_for(rows * cols), [&](std::size_t b) {
    mq_block(m, cols, qd.data(), r, b * kBlock, std::min(rows, (b + 1) * kBlock), p);
  });
}

void lr_multiply_t(const float* m, std::size_t rows, std::size_t cols, const float* p,
                   std::size_t r, float* q, double* acc) {
  std::fill(acc, acc + cols * r, 0.0);
  const std::size_t cb = 512;  // columns per chunk: 512 x r doubles of acc stay in the cache
  const std::size_t blocks = (cols + cb - 1) / cb;
  parallel_for(blocks, threads_for(rows * cols), [&](std::size_t b) {
    mtp_block(m, rows, cols, p, r, b * cb, std::min(cols, (b + 1) * cb), acc);
  });
  for (std::size_t i = 0; i < cols * r; ++i) q[i] = static_cast<float>(acc[i]);
}

void lr_orthonormalize(float* p, std::size_t rows, std::size_t r, double* work) {
  // Column-major doubles: column j at work + j * rows.
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < r; ++j) work[j * rows + i] = p[i * r + j];
  }
  for (std::size_t j = 0; j < r; ++j) {
    double* c = work + j * rows;
    double ss = 0;
    for (std::size_t i = 0; i < rows; ++i) ss += c[i] * c[i];
    const double norm = std::sqrt(ss);
    if (norm == 0) {
      std::fill(c, c + rows, 0.0);
    } else {
      for (std::size_t i = 0; i < rows; ++i) c[i] /= norm;
    }
    for (std::size_t l = j + 1; l < r; ++l) {
      double* d = work + l * rows;
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += c[i] * d[i];
      for (std::size_t i = 0; i < rows; ++i) d[i] -= dot * c[i];
    }
  }
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < r; ++j) p[i * r + j] = static_cast<float>(work[j * rows + i]);
  }
}

void lr_normalize_columns(float* q, std::size_t n, std::size_t r) {
  for (std::size_t j = 0; j < r; ++j) {
    double ss = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double v = q[i * r + j];
      ss += v * v;
    }
    const double norm = std::sqrt(ss);
    if (norm == 0) continue;
    for (std::size_t i = 0; i < n; ++i) {
      q[i * r + j] = static_cast<float>(static_cast<double>(q[i * r + j]) / norm);
    }
  }
}

void lr_reconstruct(const float* a, const float* b, std::size_t rows, std::size_t cols,
                    std::size_t r, double out_scale, float* out, double share_scale, const float* m,
                    float* e, double* bwork) {
  for (std::size_t k = 0; k < cols; ++k) {
    for (std::size_t j = 0; j < r; ++j) bwork[j * cols + k] = b[k * r + j];
  }
  const std::size_t blocks = (rows + kBlock - 1) / kBlock;
  parallel_for(blocks, threads_for(rows * cols), [&](std::size_t blk) {
    rec_block(a, bwork, cols, r, out_scale, out, share_scale, m, e, blk * kBlock,
              std::min(rows, (blk + 1) * kBlock));
  });
}

void lr_random(float* q, std::size_t count, std::uint64_t seed) {
  const PhiloxStream st = philox_stream(seed, CodecKind::powersgd);
  for (std::size_t i = 0; i < count; ++i) {
    const auto w = static_cast<std::int32_t>(philox_word(st, i) >> 8);
    q[i] = static_cast<float>(w - (std::int32_t{1} << 23)) * 0x1p-23f;
  }
}

}  // namespace gcomp::detail
