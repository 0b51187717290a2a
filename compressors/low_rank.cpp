// powersgd: the codec entry (its spec and properties) and PowerSGD's per-matrix kernels
// (low_rank.hpp). The scheme itself runs across ranks in the collectives' low_rank algorithm
// (collectives/low_rank.cpp); the codec has no payload of its own, so its encode and its payload
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

// p = m q for rows [i0, i1), R columns (R > 0: fixed at compile time, so the inner loop unrolls;
// 0: r at run time).
template <std::size_t R>
void multiply_rows(const float* m, std::size_t cols, const double* qd, std::size_t r,
                   std::size_t i0, std::size_t i1, float* p) {
  const std::size_t rr = R ? R : r;
  double acc[R ? R : kMaxRank];
  for (std::size_t i = i0; i < i1; ++i) {
    for (std::size_t j = 0; j < rr; ++j) acc[j] = 0;
    const float* mi = m + i * cols;
    for (std::size_t k = 0; k < cols; ++k) {
      const double mk = mi[k];
      const double* qk = qd + k * rr;
      for (std::size_t j = 0; j < rr; ++j) acc[j] += mk * qk[j];
    }
    for (std::size_t j = 0; j < rr; ++j) p[i * rr + j] = static_cast<float>(acc[j]);
  }
}

// acc[k][:] += m[i][k] p[i][:] over every row i, for columns [k0, k1).
template <std::size_t R>
void multiply_t_cols(const float* m, std::size_t rows, std::size_t cols, const float* p,
                     std::size_t r, std::size_t k0, std::size_t k1, double* acc) {
  const std::size_t rr = R ? R : r;
  double pd[R ? R : kMaxRank];
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < rr; ++j) pd[j] = p[i * rr + j];
    const float* mi = m + i * cols;
    for (std::size_t k = k0; k < k1; ++k) {
      const double mk = mi[k];
      double* ak = acc + k * rr;
      for (std::size_t j = 0; j < rr; ++j) ak[j] += mk * pd[j];
    }
  }
}

template <class F>
void by_rank(std::size_t r, F&& f) {
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
  by_rank(r, [&](auto R) {
    parallel_for(blocks, threads_for(rows * cols), [&](std::size_t b) {
      multiply_rows<decltype(R)::value>(m, cols, qd.data(), r, b * kBlock,
                                        std::min(rows, (b + 1) * kBlock), p);
    });
  });
}

void lr_multiply_t(const float* m, std::size_t rows, std::size_t cols, const float* p,
                   std::size_t r, float* q, double* acc) {
  std::fill(acc, acc + cols * r, 0.0);
  const std::size_t cb = 256;  // columns per chunk
  const std::size_t blocks = (cols + cb - 1) / cb;
  by_rank(r, [&](auto R) {
    parallel_for(blocks, threads_for(rows * cols), [&](std::size_t b) {
      multiply_t_cols<decltype(R)::value>(m, rows, cols, p, r, b * cb, std::min(cols, (b + 1) * cb),
                                          acc);
    });
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
  for (std::size_t i = 0; i < cols * r; ++i) bwork[i] = b[i];
  const std::size_t blocks = (rows + kBlock - 1) / kBlock;
  parallel_for(blocks, threads_for(rows * cols), [&](std::size_t blk) {
    double ad[kMaxRank];
    const std::size_t i1 = std::min(rows, (blk + 1) * kBlock);
    for (std::size_t i = blk * kBlock; i < i1; ++i) {
      for (std::size_t j = 0; j < r; ++j) ad[j] = a[i * r + j];
      for (std::size_t k = 0; k < cols; ++k) {
        const double* bk = bwork + k * r;
        double s = 0;
        for (std::size_t j = 0; j < r; ++j) s += ad[j] * bk[j];
        const std::size_t at = i * cols + k;
        if (e) e[at] = m[at] - static_cast<float>(s * share_scale);
        if (out) out[at] = static_cast<float>(s * out_scale);
      }
    }
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
