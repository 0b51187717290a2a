// low_rank: PowerSGD (Vogels et al., NeurIPS 2019) on the matrices of one bucket, and its
// alternating form (ACP-SGD), the only algorithm of the low-rank codecs (powersgd). Each tensor
// of the bucket is a matrix M (its shape, MatrixShape); the arithmetic is compressors/low_rank.hpp.
//
// Schedule, per bucket (M = x + e with error feedback; the tensors the codec does not compress,
// 1-D or below min_compression_rate or still in their first `start` steps, go uncompressed in the
// first collective; P ranks):
//   two allreduces (default):
//     1. Q from the tensor's state (warm start) or drawn (uniform, the same on every rank); with
//        values=fp16 its columns normalized; P = M Q
//     2. allreduce [uncompressed tensors, every P]
//     3. P^ = orthonormalize(P); Q = M^T P^
//     4. allreduce [every Q]
//     5. out = P^ Q^T (/ P when averaging); e = M - P^ Q^T / P; Q kept (warm start)
//   alternating (alternate=true), the state holding the factor allreduced last:
//     Q kept (or none): Q^ = orthonormalize(Q); P = M Q^; allreduce [uncompressed, every P];
//                       out = P Q^^T; e = M - P Q^^T / P; P kept
//     P kept:           P^ = orthonormalize(P); Q = M^T P^; allreduce [uncompressed, every Q];
//                       out = P^ Q^T; e = M - P^ Q^T / P; Q kept
// Each allreduce is MPI_Allreduce of float32 (the dense algorithm's), or with values=fp16 the
// uncompressed part so and the factors through compressed_reduce_scatter with fp16 (sent as
// binary16, summed in float32 by their owners, the sums sent as binary16). Bytes per rank: 2
// (P-1)/P (4 uncompressed + b sum (rows + cols) r), b = 4 or 2; alternating, one factor a step.
// Independent of P.
//
// Every rank computes the orthonormalization and the products from the same allreduced bits in
// the same order, so every rank's out is the same. The state (per tensor: Q or P, and a count of
// steps) lives in the tensor's ErrorFeedback slot; a bucket's is its tensors' joined (join_state,
// split_state), and the ranks agree on a hash of it (low_rank_state_signature): when they
// differ, every rank starts afresh.
#include "low_rank.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "algorithm_table.hpp"
#include "calibration.hpp"
#include "device_backend.hpp"
#include "feedback_slot.hpp"
#include "fnv.hpp"
#include "model_terms.hpp"

namespace gcomp::detail {

namespace {

// ---- The state in the slots ----
// A tensor's slot: [tag][steps][factor...], words as float bits; tag = kTag | kind << 16 | r.
// A bucket's slot: [tensors][len_0][slot_0...][len_1][slot_1...]..., len 0 for a tensor without.
constexpr std::uint32_t kTag = 0x4c500000u;  // "LP"
enum Kept : std::uint32_t { kNothing = 0, kQ = 1, kP = 2 };

float word(std::uint64_t v) { return std::bit_cast<float>(static_cast<std::uint32_t>(v)); }
std::uint32_t word_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// One tensor's state as read from a bucket's slot.
struct State {
  Kept kept = kNothing;
  std::uint32_t steps = 0;
  const float* factor = nullptr;  // rows x r (P) or cols x r (Q)
};

// Tensor t's share [offset, offset + len) of a bucket slot, for every tensor; false when the
// slot does not hold `tensors` tensors (empty: no state yet).
bool shares(const std::vector<float>& slot, std::size_t tensors,
            std::vector<std::pair<std::size_t, std::size_t>>& out) {
  out.assign(tensors, {0, 0});
  if (slot.empty() || word_of(slot[0]) != tensors) return false;
  std::size_t at = 1;
  for (std::size_t t = 0; t < tensors; ++t) {
    if (at >= slot.size()) return false;
    const std::size_t len = word_of(slot[at++]);
    if (len > slot.size() - at) return false;
    out[t] = {at, len};
    at += len;
  }
  return at == slot.size();
}

// Tensor t's state, if its share is one for this shape and rank (else nothing kept, 0 steps).
State read_state(const std::vector<float>& slot, std::pair<std::size_t, std::size_t> share,
                 const MatrixShape& m, std::size_t r) {
  State s;
  const auto [at, len] = share;
  if (len < 2 || r == 0) return s;
  const std::uint32_t tag = word_of(slot[at]);
  if ((tag & 0xfff00000u) != kTag || (tag & 0xffffu) != r) return s;
  const auto kept = static_cast<Kept>((tag >> 16) & 0xfu);
  const std::size_t want = kept == kQ ? m.cols * r : kept == kP ? m.rows * r : 0;
  if (kept > kP || len != 2 + want) return s;
  s.kept = kept;
  s.steps = word_of(slot[at + 1]);
  s.factor = want ? slot.data() + at + 2 : nullptr;
  return s;
}

// ---- One bucket's plan ----
enum class Step {
  uncompressed,
  both,
  with_q,
  with_p
};  // with_q: alternating, P sent; with_p: Q sent

struct Matrix {
  Step step = Step::uncompressed;
  std::size_t r = 0;
  std::size_t begin = 0;    // its first element in the call's tensor
  std::uint32_t steps = 0;  // after this call
  std::size_t sent = 0;     // where its values (uncompressed) or factor start in `first`
  std::size_t second = 0;   // both: where its Q starts in `second`
  std::size_t other = 0;    // where its other factor (Q, Q^ or P^) starts in `other`
  bool in_state = false;    // has a state to keep (compressed, or counting start steps)
  State st;                 // what its state held before the call
};

struct LowRankBuffers {
  std::vector<std::pair<std::size_t, std::size_t>> share;
  std::vector<Matrix> plan;
  std::size_t uncompressed = 0;      // the uncompressed tensors' elements, first in `first`
  std::vector<float> first, second;  // the two collectives' values
  std::vector<float> other;          // each compressed matrix's other factor
  std::vector<double> work;          // the orthonormalization's
  std::vector<double> work_products;  // M^T P's accumulators, the reconstruction's
  std::vector<float> staged;          // device tensors: an uncompressed tensor's result on the host
  std::vector<float> slot;            // the bucket's new state
};

// The collective of values [0, uncompressed) float32 and [uncompressed, end) factors (binary16 with
// fp16).
void exchange(Job& job, std::span<float> values, std::size_t uncompressed, bool half) {
  static const Codec none("none");
  static const Codec fp16("fp16");
  const auto one = [&](std::span<float> v, const Codec& codec, bool as_is) {
    if (v.empty()) return;
    CallSpec spec;
    spec.net = job.call.net;
    spec.rank = job.call.rank;
    spec.size = job.call.size;
    spec.codec = &codec;
    CallBuffers buf;
    buf.in = v;
    buf.out = v;
    Job sub(spec, buf, job.ws);
    if (as_is) {
      run_dense(sub);
    } else {
      algorithm_row(Algorithm::compressed_reduce_scatter).run(sub);
    }
    job.meter.traffic.sent += sub.meter.traffic.sent;
    job.meter.traffic.received += sub.meter.traffic.received;
    job.meter.traffic.seconds += sub.meter.traffic.seconds;
    job.meter.encode_seconds += sub.meter.encode_seconds;
    job.meter.decode_seconds += sub.meter.decode_seconds;
  };
  if (!half) return one(values, none, true);
  one(values.first(uncompressed), none, true);
  one(values.subspan(uncompressed), fp16, false);
}

// The plan: what each tensor does this step, and where its values go.
void make_plan(Job& job, LowRankBuffers& b, const LowRankSpec& s) {
  const std::span<const MatrixShape> mats = job.call.shapes;
  const std::vector<float>* slot = job.buf.ef ? &FeedbackSlot::of(*job.buf.ef) : nullptr;
  const bool have = slot && !job.fresh_state && shares(*slot, mats.size(), b.share);
  b.plan.assign(mats.size(), Matrix{});
  std::size_t uncompressed = 0, factors = 0, second = 0, other = 0, begin = 0;
  for (std::size_t t = 0; t < mats.size(); ++t) {
    Matrix& p = b.plan[t];
    const MatrixShape& m = mats[t];
    p.begin = begin;
    begin += m.rows * m.cols;
    p.r = low_rank_of(m.rows, m.cols, s);
    const State st = have ? read_state(*slot, b.share[t], m, p.r) : State{};
    p.st = st;
    p.in_state = p.r > 0 && job.buf.ef;
    p.steps = st.steps == UINT32_MAX ? st.steps : st.steps + 1;
    if (p.r == 0 || st.steps < s.start) {
      p.step = Step::uncompressed;
      uncompressed += m.rows * m.cols;
      continue;
    }
    p.step = !s.alternate ? Step::both : st.kept == kP ? Step::with_p : Step::with_q;
    factors += (p.step == Step::with_p ? m.cols : m.rows) * p.r;
    if (p.step == Step::both) second += m.cols * p.r;
    other += std::max(m.rows, m.cols) * p.r;
  }
  b.uncompressed = uncompressed;
  b.first.resize(uncompressed + factors);
  b.second.resize(second);
  b.other.resize(other);
  uncompressed = 0;
  second = 0;
  other = 0;
  for (std::size_t t = 0; t < mats.size(); ++t) {
    Matrix& p = b.plan[t];
    if (p.step != Step::uncompressed) continue;
    p.sent = uncompressed;
    uncompressed += mats[t].rows * mats[t].cols;
  }
  for (std::size_t t = 0; t < mats.size(); ++t) {
    Matrix& p = b.plan[t];
    const MatrixShape& m = mats[t];
    if (p.step == Step::uncompressed) continue;
    p.sent = uncompressed;
    uncompressed += (p.step == Step::with_p ? m.cols : m.rows) * p.r;
    p.other = other;
    other += std::max(m.rows, m.cols) * p.r;
    if (p.step == Step::both) {
      p.second = second;
      second += m.cols * p.r;
    }
  }
}

// Where the bucket's M, out and e are, and the kernels that run there: host memory (the CPU's
// kernels) or a device's (its backend's: M never leaves the device, the factors cross to the
// host, where they are allreduced and orthonormalized). Factors (q, p, a, b, got) are host
// memory; m, out and e are in the bucket's memory.
class MatrixOps {
 public:
  virtual ~MatrixOps() = default;
  virtual void form(const float* x, const float* e_old, float* m, std::size_t n) = 0;  // x + e
  virtual void read(const float* m, std::size_t len, float* to) = 0;                   // a copy
  virtual void multiply(const float* m, const MatrixShape& b, const float* q, std::size_t r,
                        float* p) = 0;  // p = m q
  virtual void multiply_t(const float* m, const MatrixShape& b, const float* p, std::size_t r,
                          float* q) = 0;  // q = m^T p
  // out = a b^T out_scale; e (the m it is formed from, or null) -= a b^T share_scale.
  virtual void reconstruct(const float* a, const float* b, const MatrixShape& blk, std::size_t r,
                           double out_scale, float* out, double share_scale, float* e) = 0;
  // out = float(got out_scale); e (or null) = 0.
  virtual void take_uncompressed(const float* got, std::size_t len, double out_scale, float* out,
                                 float* e) = 0;
};

class HostMatrixOps final : public MatrixOps {
 public:
  explicit HostMatrixOps(std::vector<double>& work) : work_(work) {}
  void form(const float* x, const float* e_old, float* m, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) m[i] = x[i] + e_old[i];
  }
  void read(const float* m, std::size_t len, float* to) override { std::copy(m, m + len, to); }
  void multiply(const float* m, const MatrixShape& b, const float* q, std::size_t r,
                float* p) override {
    lr_multiply(m, b.rows, b.cols, q, r, p);
  }
  void multiply_t(const float* m, const MatrixShape& b, const float* p, std::size_t r,
                  float* q) override {
    work_.resize(b.cols * r);
    lr_multiply_t(m, b.rows, b.cols, p, r, q, work_.data());
  }
  void reconstruct(const float* a, const float* b, const MatrixShape& blk, std::size_t r,
                   double out_scale, float* out, double share_scale, float* e) override {
    work_.resize(blk.cols * r);
    lr_reconstruct(a, b, blk.rows, blk.cols, r, out_scale, out, share_scale, e, e, work_.data());
  }
  void take_uncompressed(const float* got, std::size_t len, double out_scale, float* out,
                         float* e) override {
    for (std::size_t i = 0; i < len; ++i) out[i] = static_cast<float>(got[i] * out_scale);
    if (e) std::fill(e, e + len, 0.0f);
  }

 private:
  std::vector<double>& work_;
};

// Device memory: each factor goes to the device (DeviceStage's kFactorA for P, kFactorB for Q,
// sized once for the bucket's largest, so that no buffer is freed under queued work) and back.
class DeviceMatrixOps final : public MatrixOps {
 public:
  DeviceMatrixOps(const Job& job, std::size_t max_p, std::size_t max_q, std::vector<float>& host)
      : dev_(*job.buf.dev),
        stream_(job.buf.stream),
        pd_(static_cast<float*>(job.buf.stage->get(DeviceStage::kFactorA, 4 * max_p))),
        qd_(static_cast<float*>(job.buf.stage->get(DeviceStage::kFactorB, 4 * max_q))),
        host_(host) {}
  void form(const float* x, const float* e_old, float* m, std::size_t n) override {
    dev_.add(x, e_old, m, n, stream_);
  }
  void read(const float* m, std::size_t len, float* to) override {
    dev_.copy(to, m, 4 * len, stream_);
  }
  void multiply(const float* m, const MatrixShape& b, const float* q, std::size_t r,
                float* p) override {
    dev_.copy(qd_, q, 4 * b.cols * r, stream_);
    dev_.lr_multiply(m, b.rows, b.cols, qd_, r, pd_, stream_);
    dev_.copy(p, pd_, 4 * b.rows * r, stream_);
  }
  void multiply_t(const float* m, const MatrixShape& b, const float* p, std::size_t r,
                  float* q) override {
    dev_.copy(pd_, p, 4 * b.rows * r, stream_);
    dev_.lr_multiply_t(m, b.rows, b.cols, pd_, r, qd_, stream_);
    dev_.copy(q, qd_, 4 * b.cols * r, stream_);
  }
  void reconstruct(const float* a, const float* b, const MatrixShape& blk, std::size_t r,
                   double out_scale, float* out, double share_scale, float* e) override {
    dev_.copy(pd_, a, 4 * blk.rows * r, stream_);
    dev_.copy(qd_, b, 4 * blk.cols * r, stream_);
    dev_.lr_reconstruct(pd_, qd_, blk.rows, blk.cols, r, out_scale, out, share_scale, e, e,
                        stream_);
    dev_.sync(stream_);  // the factors' buffers are the next matrix's
  }
  void take_uncompressed(const float* got, std::size_t len, double out_scale, float* out,
                         float* e) override {
    host_.resize(len);
    for (std::size_t i = 0; i < len; ++i) host_[i] = static_cast<float>(got[i] * out_scale);
    dev_.copy(out, host_.data(), 4 * len, stream_);
    if (e) dev_.zero(e, len, stream_);
  }

 private:
  const DeviceBackend& dev_;
  void* stream_;
  float* pd_;
  float* qd_;
  std::vector<float>& host_;
};

// Step 1: the values each tensor sends first (its own, or its first factor).
void first_products(Job& job, LowRankBuffers& b, const LowRankSpec& s, const float* mbase,
                    MatrixOps& ops) {
  const std::span<const MatrixShape> mats = job.call.shapes;
  for (std::size_t t = 0; t < mats.size(); ++t) {
    const Matrix& p = b.plan[t];
    const MatrixShape& m = mats[t];
    const float* M = mbase + p.begin;
    float* to = b.first.data() + p.sent;
    if (p.step == Step::uncompressed) {
      ops.read(M, m.rows * m.cols, to);
      continue;
    }
    const State& st = p.st;
    float* other = b.other.data() + p.other;
    b.work.resize(std::max(m.rows, m.cols) * p.r);
    if (p.step == Step::with_p) {  // alternating, P kept: Q = M^T P^
      std::copy(st.factor, st.factor + m.rows * p.r, other);
      lr_orthonormalize(other, m.rows, p.r, b.work.data());
      ops.multiply_t(M, m, other, p.r, to);
      continue;
    }
    // P = M Q, Q kept (warm start, or alternating) or drawn.
    const bool kept = st.kept == kQ && (s.warm_start || s.alternate);
    if (kept) {
      std::copy(st.factor, st.factor + m.cols * p.r, other);
    } else {
      lr_random(other, m.cols * p.r, derive_seed(job.call.shared_seed, t, p.steps, 0));
    }
    if (p.step == Step::with_q) {
      lr_orthonormalize(other, m.cols, p.r, b.work.data());
    } else if (s.fp16) {
      lr_normalize_columns(other, m.cols, p.r);
    }
    ops.multiply(M, m, other, p.r, to);
  }
}

// The new state of the bucket, into its slot.
void keep_state(Job& job, LowRankBuffers& b, const LowRankSpec& s) {
  const std::span<const MatrixShape> mats = job.call.shapes;
  std::vector<float>& out = b.slot;
  out.clear();
  out.push_back(word(mats.size()));
  for (std::size_t t = 0; t < mats.size(); ++t) {
    const Matrix& p = b.plan[t];
    const MatrixShape& m = mats[t];
    if (!p.in_state) {
      out.push_back(word(0));
      continue;
    }
    Kept kept = kNothing;
    const float* f = nullptr;
    std::size_t len = 0;
    if (p.step == Step::both && s.warm_start) {
      kept = kQ, f = b.second.data() + p.second, len = m.cols * p.r;
    } else if (p.step == Step::with_q) {
      kept = kP, f = b.first.data() + p.sent, len = m.rows * p.r;
    } else if (p.step == Step::with_p) {
      kept = kQ, f = b.first.data() + p.sent, len = m.cols * p.r;
    }
    out.push_back(word(2 + len));
    out.push_back(word(kTag | kept << 16 | p.r));
    out.push_back(word(p.steps));
    out.insert(out.end(), f, f + len);
  }
  FeedbackSlot::of(*job.buf.ef) = out;  // copied: each keeps its capacity
}

// The schedule (at the top of this file) on the bucket's memory: M, out and e there, the
// factors on the host.
void low_rank_step(Job& job, LowRankBuffers& b, const LowRankSpec& s, MatrixOps& ops,
                   const float* x, const float* e_old, float* e, float* out) {
  const std::span<const MatrixShape> mats = job.call.shapes;
  const double world = job.call.size;
  const double out_scale = job.call.average ? 1.0 / world : 1.0;
  // M: x + e in the new residual's buffer (which becomes M - the share), or x itself.
  const float* M = x;
  {
    const auto timed = job.meter.encoding();
    if (e) {
      ops.form(x, e_old, e, job.buf.in.size());
      M = e;
    }
    first_products(job, b, s, M, ops);
  }
  exchange(job, b.first, b.uncompressed, s.fp16);
  {
    const auto timed = job.meter.decoding();
    for (std::size_t t = 0; t < mats.size(); ++t) {
      const Matrix& p = b.plan[t];
      const MatrixShape& m = mats[t];
      const float* got = b.first.data() + p.sent;
      float* other = b.other.data() + p.other;
      float* et = e ? e + p.begin : nullptr;
      switch (p.step) {
        case Step::uncompressed:
          ops.take_uncompressed(got, m.rows * m.cols, out_scale, out + p.begin, et);
          break;
        case Step::with_q:  // out = P Q^^T
          ops.reconstruct(got, other, m, p.r, out_scale, out + p.begin, 1.0 / world, et);
          break;
        case Step::with_p:  // out = P^ Q^T
          ops.reconstruct(other, got, m, p.r, out_scale, out + p.begin, 1.0 / world, et);
          break;
        case Step::both: {  // P^ = orthonormalize(P); Q = M^T P^ (into `other`: P^)
          float* phat = other;
          std::copy(got, got + m.rows * p.r, phat);
          b.work.resize(m.rows * p.r);
          lr_orthonormalize(phat, m.rows, p.r, b.work.data());
          ops.multiply_t(M + p.begin, m, phat, p.r, b.second.data() + p.second);
          break;
        }
      }
    }
  }
  if (!b.second.empty()) {
    exchange(job, b.second, 0, s.fp16);
    const auto timed = job.meter.decoding();
    for (std::size_t t = 0; t < mats.size(); ++t) {
      const Matrix& p = b.plan[t];
      if (p.step != Step::both) continue;
      const MatrixShape& m = mats[t];
      ops.reconstruct(b.other.data() + p.other, b.second.data() + p.second, m, p.r, out_scale,
                      out + p.begin, 1.0 / world, e ? e + p.begin : nullptr);
    }
  }
  if (job.buf.ef) keep_state(job, b, s);
}

void run_low_rank(Job& job) {
  const LowRankSpec& s = low_rank_spec(*job.call.codec);
  LowRankBuffers& b = job.ws.get<LowRankBuffers>();
  make_plan(job, b, s);
  HostMatrixOps ops(b.work_products);
  float* e = job.buf.ef ? job.buf.ef_next.data() : nullptr;
  low_rank_step(job, b, s, ops, job.buf.in.data(),
                job.buf.ef ? job.buf.ef->residual().data() : nullptr, e, job.buf.out.data());
}

// Device tensors: the same step with M, out and e on the device (d_in, d_out, the device
// residual's scratch), the factors through the host.
void run_low_rank_device(Job& job) {
  const LowRankSpec& s = low_rank_spec(*job.call.codec);
  LowRankBuffers& b = job.ws.get<LowRankBuffers>();
  make_plan(job, b, s);
  std::size_t max_p = 1, max_q = 1;
  for (std::size_t t = 0; t < b.plan.size(); ++t) {
    max_p = std::max(max_p, job.call.shapes[t].rows * b.plan[t].r);
    max_q = std::max(max_q, job.call.shapes[t].cols * b.plan[t].r);
  }
  DeviceMatrixOps ops(job, max_p, max_q, b.staged);
  low_rank_step(job, b, s, ops, job.buf.d_in, job.buf.d_e_old, job.buf.d_e_new, job.buf.d_out);
  job.buf.dev->sync(job.buf.stream);
}

// ---- The bucket's state, joined from its tensors' slots and split back ----
void join_low_rank(const BucketParts& parts, ErrorFeedback& bucket) {
  std::vector<float>& out = FeedbackSlot::of(bucket);
  out.clear();
  out.push_back(word(parts.efs.size()));
  for (ErrorFeedback* ef : parts.efs) {
    if (!ef) {
      out.push_back(word(0));
      continue;
    }
    const std::vector<float>& mine = FeedbackSlot::of(*ef);
    out.push_back(word(mine.size()));
    out.insert(out.end(), mine.begin(), mine.end());
  }
}

void split_low_rank(const BucketParts& parts, const ErrorFeedback& bucket) {
  const std::vector<float>& slot = FeedbackSlot::of(bucket);
  std::vector<std::pair<std::size_t, std::size_t>> share;
  if (!shares(slot, parts.efs.size(), share)) return;
  for (std::size_t t = 0; t < parts.efs.size(); ++t) {
    if (!parts.efs[t]) continue;
    const auto from = slot.begin() + static_cast<std::ptrdiff_t>(share[t].first);
    FeedbackSlot::of(*parts.efs[t])
        .assign(from, from + static_cast<std::ptrdiff_t>(share[t].second));
  }
}

// ---- The cost model ----
// M formed (error feedback), the products (two, or one alternating) and the reconstruction over
// the compressed matrices, and the collectives: [uncompressed, P] then [Q]; alternating
// [uncompressed, one factor] (on average half of P and of Q).
double t_exchange(const ModelInput& in, double uncompressed, double factors) {
  if (in.value_bytes >= 4) {
    return uncompressed + factors > 0
               ? t_allreduce(in, 4 * (uncompressed + factors), uncompressed + factors)
               : 0.0;
  }
  const double p = in.ranks;
  double t = uncompressed > 0 ? t_allreduce(in, 4 * uncompressed, uncompressed) : 0.0;
  if (factors > 0) {
    const double b = 2 * factors;
    t += t_alltoallv(in, b) + t_allgatherv(in, b / p) + factors * 3 * in.compute.reduce;
  }
  return t;
}

// What the call's matrices make of the model: the elements that go uncompressed (1-D, small), and
// the compressed ones' factors and products, from the codec and the shapes (without shapes: the
// tensor as one square matrix).
struct Factors {
  double uncompressed = 0;  // elements sent as they are
  double p = 0;            // the P factors, rows x r summed
  double q = 0;            // the Q factors, cols x r summed
  double product = 0;      // rows x cols x r summed: one product's work
  bool alternate = false;  // one factor a step (on average half of each)
};

Factors factors_of(const ModelInput& in) {
  const LowRankSpec& s = low_rank_spec(*in.codec);
  const auto n = static_cast<std::uint64_t>(in.n);
  const auto side = static_cast<std::uint64_t>(std::sqrt(in.n));
  const MatrixShape square{side, side ? n / side : 1};
  Factors f;
  f.alternate = s.alternate;
  for (const MatrixShape& m :
       in.shapes.empty() ? std::span<const MatrixShape>(&square, 1) : in.shapes) {
    const std::size_t r = low_rank_of(m.rows, m.cols, s);
    const double rows = static_cast<double>(m.rows), cols = static_cast<double>(m.cols);
    if (r == 0) {
      f.uncompressed += rows * cols;
      continue;
    }
    f.p += rows * static_cast<double>(r);
    f.q += cols * static_cast<double>(r);
    f.product += rows * cols * static_cast<double>(r);
  }
  return f;
}

bool for_low_rank_codecs(const ModelInput& in) {
  return in.codec != nullptr && in.codec->properties().low_rank;
}

double predict_low_rank(const ModelInput& in) {
  if (!for_low_rank_codecs(in)) return kNotApplicable;
  const Factors f = factors_of(in);
  const auto& c = in.compute;
  const double form = in.error_feedback ? in.n * c.reduce : 0.0;
  if (f.alternate) {
    return form + f.product * (c.encode + c.decode) +
           t_exchange(in, f.uncompressed, (f.p + f.q) / 2);
  }
  return form + f.product * (2 * c.encode + c.decode) + t_exchange(in, f.uncompressed, f.p) +
         t_exchange(in, 0, f.q);
}

double bytes_low_rank(const ModelInput& in) {
  if (!for_low_rank_codecs(in)) return kNotApplicable;
  const Factors f = factors_of(in);
  const double sent = f.alternate ? (f.p + f.q) / 2 : f.p + f.q;
  const double vb = in.value_bytes >= 4 ? 4 : 2;
  return 2 * (in.ranks - 1.0) / in.ranks * (4 * f.uncompressed + vb * sent);
}

// low_rank's speeds: the product M Q (encode) and the reconstruction P Q^T (decode) of a
// square matrix of about calibration_size(n) elements at the codec's rank, per element and rank,
// with the CPU's kernels or on like's device with its backend's (as the calls run them).
ComputeModel measure_low_rank(const Codec& codec, std::size_t n, TensorView<const float> like) {
  const std::size_t kN = calibration_size(n);
  const auto rows = static_cast<std::size_t>(std::sqrt(static_cast<double>(kN)));
  const std::size_t cols = kN / rows;
  const std::size_t r = std::min({low_rank_spec(codec).rank, rows, cols});
  const double units = static_cast<double>(rows * cols * r);
  const std::vector<float> x = calibration_input(rows * cols);
  std::vector<float> q(cols * r);
  lr_random(q.data(), q.size(), 1);
  if (!like.on_device()) {
    std::vector<float> p(rows * r), out(rows * cols);
    std::vector<double> work(cols * r);
    return time_per_unit(
        units, [&] { lr_multiply(x.data(), rows, cols, q.data(), r, p.data()); },
        [&] {
          lr_reconstruct(p.data(), q.data(), rows, cols, r, 1.0, out.data(), 1.0, nullptr, nullptr,
                         work.data());
        });
  }
  const DeviceBackend* dev = like.backend();
  void* stream = like.stream();
  const DeviceMemory xd(dev, 4 * rows * cols), qd(dev, 4 * cols * r), pd(dev, 4 * rows * r),
      out(dev, 4 * rows * cols);
  dev->copy(xd.p, x.data(), 4 * x.size(), stream);
  dev->copy(qd.p, q.data(), 4 * q.size(), stream);
  const auto* m = static_cast<const float*>(xd.p);
  auto* qf = static_cast<float*>(qd.p);
  auto* pf = static_cast<float*>(pd.p);
  return time_per_unit(
      units,
      [&] {
        dev->lr_multiply(m, rows, cols, qf, r, pf, stream);
        dev->sync(stream);
      },
      [&] {
        dev->lr_reconstruct(pf, qf, rows, cols, r, 1.0, static_cast<float*>(out.p), 1.0, nullptr,
                            nullptr, stream);
        dev->sync(stream);
      });
}

std::uint64_t low_rank_state_signature(const ErrorFeedback& ef) {
  const std::vector<float>& slot = FeedbackSlot::of(ef);
  if (slot.empty()) return 0;
  Fnv h;
  h.add(slot.size());
  // Whole words at a time: the factors are small beside M, but not nothing.
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (float f : slot) x = (x ^ word_of(f)) * 0x100000001b3ull;
  return h.add(x).h | 1;
}

}  // namespace

extern const AlgorithmRow kLowRankRow = {
    .id = Algorithm::low_rank,
    .name = "low_rank",
    .description =
        "PowerSGD: each matrix's factors P = M Q and Q = M^T P allreduced (one "
        "collective each for the bucket; alternating, one a step), 1-D tensors uncompressed",
    .sparse_only = false,
    .low_rank = true,
    .candidate = for_low_rank_codecs,
    .predict = predict_low_rank,
    .bytes = bytes_low_rank,
    .measure = measure_low_rank,
    .run = run_low_rank,
    .run_device = run_low_rank_device,
    .join_state = join_low_rank,
    .split_state = split_low_rank,
    .state_signature = low_rank_state_signature,
};

}  // namespace gcomp::detail
