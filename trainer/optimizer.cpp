// The update half of an SGD step (see optimizer.hpp).
#include "optimizer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "gcomp/momentum.hpp"
#include "spec.hpp"

namespace gcomp::train {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void add_stats(EpochRecord& total, const CallStats& st) {
  total.bytes_sent_per_rank += static_cast<double>(st.bytes_sent);
  total.encode_seconds += st.encode_seconds;
  total.comm_seconds += st.comm_seconds;
  total.decode_seconds += st.decode_seconds;
}

}  // namespace

Dgc parse_dgc(const std::string& spec) {
  Dgc d;
  detail::SpecReader r(spec);  // the codecs' grammar and complaints
  if (r.name() != "dgc") return d;
  d.on = true;
  const std::optional<double> ratio = r.real("ratio", 0, true, 1, false);
  if (!ratio) r.fail("dgc needs ratio=R");
  d.ratio = *ratio;
  d.clip = r.real("clip", 0, false, std::numeric_limits<double>::max(), false).value_or(0);
  r.finish();
  return d;
}

Optimizer::Optimizer(const Config& c, std::vector<Param*> params)
    : c_(c),
      dgc_(parse_dgc(c.codec)),
      params_(std::move(params)),
      none_("none"),
      codec_(dgc_.on ? "none" : c.codec) {
  velocity_.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    velocity_[i].assign(params_[i]->value.size(), 0.0f);
  if (c.error_feedback && !dgc_.on) {
    for (Param* q : params_) memories_.emplace_back(q->value.size());
  }
  for (auto& m : memories_) efs_.push_back(&m);
  if (dgc_.on) {
    for (Param* q : params_) {
      const std::size_t n = q->value.size();
      dgc_memories_.emplace_back(n < c.dense_below ? 0 : n);  // the small ones go dense
    }
  }
  velocity_ef_ = !memories_.empty() && c.ef_on_velocity;
  for (Param* q : params_) {
    grads_.emplace_back(q->grad);
    // A Param whose shape was not set (0 x 1) is a 1-D tensor to the low-rank codecs.
    const bool fits = q->shape.rows * q->shape.cols == q->grad.size();
    shapes_.push_back(fits ? q->shape : MatrixShape{q->grad.size(), 1});
  }
  bucket_.bucket_bytes = c.bucket_bytes;
  bucket_.dense_below = c.dense_below;
  bucket_.allreduce.average = true;
  bucket_.allreduce.allow_uncompressed = false;  // an accuracy experiment measures the codec
  bucket_.allreduce.seed = c.seed;
  if (c.period > 1) make_fragments();
}

void Optimizer::momentum_update(std::size_t i, float lr) {
  Param& q = *params_[i];
  std::vector<float>& m = velocity_[i];
  const auto mu = static_cast<float>(c_.momentum);
  for (std::size_t k = 0; k < q.value.size(); ++k) {
    m[k] = mu * m[k] + q.grad[k];
    q.value[k] -= lr * m[k];
  }
}

void Optimizer::step(Communicator& comm, double lr_now, bool compress, double dgc_density,
                     std::uint64_t step_index, EpochRecord& total) {
  taken_ = step_index + 1;
  compress_ = compress;
  if (local(step_index)) {
    local_step(static_cast<float>(lr_now), total);
    return;
  }
  // The algorithm: the one asked for, else each call's fewest bytes (resolved by the library).
  BucketOptions bo = bucket_;
  bo.allreduce.algorithm = c_.algorithm.value_or(Algorithm::fewest_bytes);
  bo.allreduce.seed = derive_seed(c_.seed, 0, step_index, 0);
  const auto lr = static_cast<float>(lr_now);
  if (c_.optimizer != "sgd") {
    adam_step(comm, lr_now, bo, total);
  } else if (!compress || (!dgc_.on && !velocity_ef_)) {
    // The gradient averaged, then one momentum. Warm-up: float32, whatever algorithm the codec
    // would use.
    if (compress) {
      comm.allreduce_buckets(grads_, shapes_, codec_, efs_, bo);
    } else {
      bo.allreduce.algorithm = Algorithm::dense;
      comm.allreduce_buckets(grads_, none_, {}, bo);
    }
    add_stats(total, comm.last_stats());
    const double t0 = now();
    for (std::size_t i = 0; i < params_.size(); ++i) momentum_update(i, lr);
    total.compute_seconds += now() - t0;
  } else if (!dgc_.on) {
    // Error feedback on the velocity: each rank's momentum m_r = mu m_r + g_r is what is
    // compressed (with its residual), and the average of the sent velocities is the step.
    // Without compression this is the momentum of the averaged gradient, up to rounding.
    double t0 = now();
    const auto mu = static_cast<float>(c_.momentum);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      std::vector<float>& m = velocity_[i];
      std::vector<float>& g = params_[i]->grad;
      for (std::size_t k = 0; k < m.size(); ++k) {
        m[k] = mu * m[k] + g[k];
        g[k] = c_.ef_scaled_by_lr ? lr * m[k] : m[k];
      }
    }
    total.compute_seconds += now() - t0;
    comm.allreduce_buckets(grads_, shapes_, codec_, efs_, bo);
    add_stats(total, comm.last_stats());
    t0 = now();
    const float apply = c_.ef_scaled_by_lr ? 1.0f : lr;  // the update was sent as it is
    for (Param* q : params_) {
      for (std::size_t k = 0; k < q->value.size(); ++k) q->value[k] -= apply * q->grad[k];
    }
    total.compute_seconds += now() - t0;
  } else {
    dgc_step(comm, lr_now, dgc_density, bo.allreduce, total);
  }
}

void Optimizer::adam_step(Communicator& comm, double lr, const BucketOptions& bucket,
                          EpochRecord& total) {
  if (!adam_) {
    CompressedAdamOptions o;
    o.adam = {c_.beta1, c_.beta2, c_.eps, c_.weight_decay, c_.optimizer == "adamw"};
    o.schedule = adam_schedule(c_);
    o.error_feedback = c_.error_feedback;
    o.bucket = bucket;
    o.bucket.allreduce.seed = c_.seed;  // CompressedAdam mixes in the step
    adam_.emplace(codec_, shapes_, o);
  }
  std::vector<std::span<float>> values;
  for (Param* q : params_) values.emplace_back(q->value);
  const double t0 = now();
  adam_->step(comm, values, grads_, lr);
  if (!adam_->last_step_sent()) {  // a local step of 0/1 Adam: nothing sent
    total.compute_seconds += now() - t0;
    return;
  }
  const CallStats& st = comm.last_stats();
  add_stats(total, st);
  // The element-wise halves around the collective.
  total.compute_seconds +=
      std::max(0.0, now() - t0 - st.encode_seconds - st.comm_seconds - st.decode_seconds);
}

bool Optimizer::local(std::uint64_t step_index) const noexcept {
  return c_.period > 1 && step_index >= c_.period_from;
}

// Momentum SGD on this rank's own gradient: v = mu v + g, value -= lr v. The first local step
// makes the anchors (the values, the same on every rank after the synchronized steps or at the
// start) and spends what the gradients' error feedback still holds once, where it would have
// gone had it been sent: into the gradient (EF on the gradient), or into this step's update (EF
// on the velocity: times lr; on the update: as it is), not into the velocity, where momentum
// would apply it again at every step.
void Optimizer::local_step(float lr, EpochRecord& total) {
  const double t0 = now();
  Periodic& s = periodic_;
  const bool first = !s.started;
  if (first) {
    s.started = true;
    s.anchors.clear();
    for (Param* q : params_) s.anchors.push_back(q->value);
  }
  const auto mu = static_cast<float>(c_.momentum);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Param& q = *params_[i];
    std::vector<float>& m = velocity_[i];
    std::span<float> e;
    if (first && !memories_.empty()) e = memories_[i].residual();
    if (e.empty()) {
      momentum_update(i, lr);
      continue;
    }
    if (!velocity_ef_) {
      for (std::size_t k = 0; k < m.size(); ++k) q.grad[k] += e[k];
      momentum_update(i, lr);
    } else if (c_.ef_scaled_by_lr) {
      for (std::size_t k = 0; k < m.size(); ++k) {
        m[k] = mu * m[k] + q.grad[k];
        q.value[k] -= lr * m[k] + e[k];
      }
    } else {
      for (std::size_t k = 0; k < m.size(); ++k) {
        m[k] = mu * m[k] + q.grad[k];
        q.value[k] -= lr * (m[k] + e[k]);
      }
    }
    std::fill(e.begin(), e.end(), 0.0f);
  }
  total.compute_seconds += now() - t0;
}

bool Optimizer::average_if_due(Communicator& comm, EpochRecord& total) {
  const std::uint64_t h = c_.period, from = c_.period_from;
  Periodic& s = periodic_;
  if (h <= 1 || taken_ <= from || s.averaged_after == taken_) return false;
  bool ran = false;
  while (!s.flights.empty() && s.flights.front().merge_at <= taken_) {
    merge(comm, s.flights.front(), total);
    s.flights.pop_front();
    ran = true;
  }
  for (Flight& fl : s.flights) {  // pacing: the parts due after this step
    while (fl.sent < fl.parts.size() && fl.taken + fl.sent <= taken_) {
      send(comm, fl, total);
      ran = true;
    }
  }
  // Fragment f starts after the local steps k = f h / F, + h, ... (k = taken - from > 0).
  const std::uint64_t k = taken_ - from;
  std::vector<std::size_t> due;
  for (std::size_t f = 0; f < s.fragments.size(); ++f) {
    const std::uint64_t offset = f * h / s.fragments.size();
    if (k >= offset && (k - offset) % h == 0) due.push_back(f);
  }
  if (!due.empty()) {
    start(comm, due, c_.overlap_steps, total);
    if (c_.overlap_steps == 0) {
      merge(comm, s.flights.back(), total);
      s.flights.pop_back();
    }
    ran = true;
  }
  if (ran) s.averaged_after = taken_;
  return ran;
}

// The fragments, made once: the parameters' elements in order, cut between rows (a row: the
// shape's cols elements) into Config::fragments parts of about equal elements. Paced
// (overlap_steps T >= 2): cut into F T parts the same way (the fragments' edges where they are
// with T = 1), each fragment T of them, numbered over those that hold something.
void Optimizer::make_fragments() {
  Periodic& s = periodic_;
  const std::size_t count = c_.fragments;
  const std::size_t parts = c_.overlap_steps >= 2 ? c_.overlap_steps : 1;
  const std::size_t cuts = count * parts;
  std::size_t total = 0;
  for (Param* q : params_) total += q->value.size();
  std::vector<std::vector<Piece>> cut(cuts);
  std::size_t pos = 0, f = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::size_t n = params_[i]->value.size();
    if (n == 0) continue;
    const std::size_t row = std::max<std::size_t>(1, shapes_[i].cols);
    std::size_t lo = 0;
    while (f + 1 < cuts && (f + 1) * total / cuts < pos + n) {
      const std::size_t at = (f + 1) * total / cuts - pos;
      const std::size_t c = std::min(n, (at + row / 2) / row * row);
      if (c > lo) {
        cut[f].push_back({i, lo, c});
        lo = c;
      }
      ++f;
    }
    if (lo < n) cut[f].push_back({i, lo, n});
    pos += n;
  }
  s.fragments.assign(count, {});
  for (std::size_t g = 0; g < count; ++g) {
    std::size_t number = 0;
    for (std::size_t j = g * parts; j < (g + 1) * parts; ++j) {
      if (cut[j].empty()) continue;
      for (const Piece& pc : cut[j]) {
        s.fragments[g].push_back(pc);
        s.pieces.push_back(pc);
        s.fragment_of.push_back(g);
        s.part_of.push_back(number);
      }
      ++number;
    }
    if (s.fragments[g].empty()) {
      throw Error(Status::invalid_argument,
                  "--fragments " + std::to_string(count) + " leaves fragment " +
                      std::to_string(g) + " empty: the model has too few rows to cut so");
    }
  }
}

// x = anchor - value (+ the carry) for every piece of the fragments (with "average", the
// velocities' after them), averaged over the ranks in one allreduce_buckets: at once, or on a
// thread of its own with overlap > 0. Called only after a local step, so the anchors
// exist.
void Optimizer::start(Communicator& comm, const std::vector<std::size_t>& fragments,
                      std::uint64_t overlap, EpochRecord& total) {
  Periodic& s = periodic_;
  const bool velocities = c_.momentum_at_average == "average";
  const bool keep = overlap > 0;
  const double t0 = now();
  if (velocities && s.velocity_anchors.empty()) {
    for (Param* q : params_) s.velocity_anchors.emplace_back(q->value.size(), 0.0f);
  }
  if (keep && s.carry.empty()) {
    s.carry.resize(s.pieces.size());
    s.velocity_carry.resize(s.pieces.size());
  }
  if (compress_ && c_.error_feedback && s.memories.empty()) {  // all now: a thread holds them
    for (const Piece& pc : s.pieces) s.memories.emplace_back(pc.hi - pc.lo);
    if (velocities) {
      for (const Piece& pc : s.pieces) s.velocity_memories.emplace_back(pc.hi - pc.lo);
    }
  }
  s.flights.emplace_back();
  Flight& fl = s.flights.back();
  fl.taken = taken_;
  fl.merge_at = taken_ + overlap;
  fl.whole = fragments.size() == s.fragments.size();
  for (std::size_t i = 0; i < s.pieces.size(); ++i) {
    if (std::find(fragments.begin(), fragments.end(), s.fragment_of[i]) != fragments.end()) {
      fl.pieces.push_back(i);
    }
  }
  const std::size_t m = fl.pieces.size();
  const std::size_t tensors = velocities ? 2 * m : m;
  fl.changes.resize(tensors);
  if (keep) fl.starts.resize(tensors);
  for (std::size_t t = 0; t < tensors; ++t) {
    const std::size_t i = fl.pieces[t % m];
    const Piece& pc = s.pieces[i];
    const bool value = t < m;
    const std::vector<float>& a = value ? s.anchors[pc.param] : s.velocity_anchors[pc.param];
    const std::vector<float>& v = value ? params_[pc.param]->value : velocity_[pc.param];
    std::vector<float>& x = fl.changes[t];
    x.resize(pc.hi - pc.lo);
    for (std::size_t k = pc.lo; k < pc.hi; ++k) x[k - pc.lo] = a[k] - v[k];
    if (keep) {  // what this rank moved it while its last average was out
      std::vector<float>& carry = value ? s.carry[i] : s.velocity_carry[i];
      for (std::size_t k = 0; k < carry.size(); ++k) x[k] += carry[k];
      carry.clear();
    }
    if (keep) fl.starts[t].assign(v.begin() + static_cast<std::ptrdiff_t>(pc.lo),
                                  v.begin() + static_cast<std::ptrdiff_t>(pc.hi));
    const MatrixShape& shape = shapes_[pc.param];
    const bool whole = pc.lo == 0 && pc.hi == v.size();
    // Paced: the part of its piece; else one part of every tensor.
    const std::size_t j = overlap >= 2 && !s.part_of.empty() ? s.part_of[i] : 0;
    if (fl.parts.size() <= j) fl.parts.resize(j + 1);
    Part& part = fl.parts[j];
    part.tensors.push_back(t);
    part.xs.emplace_back(x);
    part.shapes.push_back(whole ? shape
                                : MatrixShape{(pc.hi - pc.lo) / std::max<std::size_t>(1, shape.cols),
                                              std::max<std::size_t>(1, shape.cols)});
    if (!s.memories.empty()) {
      part.efs.push_back(value ? &s.memories[i] : &s.velocity_memories[i]);
    }
  }
  std::erase_if(fl.parts, [](const Part& p) { return p.tensors.empty(); });
  total.compute_seconds += now() - t0;
  send(comm, fl, total);
}

void Optimizer::send(Communicator& comm, Flight& fl, EpochRecord& total) {
  Periodic& s = periodic_;
  const std::size_t j = fl.sent++;
  Part* part = &fl.parts[j];  // a deque's elements (and their parts) stay where they are

  // The gradients' codec and algorithm; float32 and dense after a warm-up epoch's step. The
  // seed's tensor 1 keeps the averages' draws apart from the steps' (tensor 0).
  BucketOptions bo = bucket_;
  bo.allreduce.seed = derive_seed(c_.seed, 1, fl.taken, j);  // part 0: as unpaced
  const bool coded = compress_;
  if (coded) {
    bo.allreduce.algorithm = c_.algorithm.value_or(Algorithm::fewest_bytes);
  } else {
    bo.allreduce.algorithm = Algorithm::dense;
  }
  auto run = [this, &comm, part, bo, coded] {
    if (coded) {
      comm.allreduce_buckets(part->xs, part->shapes, codec_, part->efs, bo);
    } else {
      comm.allreduce_buckets(part->xs, none_, {}, bo);
    }
    return comm.last_stats();
  };
  if (fl.merge_at > fl.taken) {
    // After the collective handed on before it (its error, if any, is this one's too).
    part->done = std::async(std::launch::async, [run, before = s.last] {
                   if (before.valid()) (void)before.get();
                   return run();
                 }).share();
    s.last = part->done;
  } else {
    if (s.last.valid()) s.last.wait();
    add_stats(total, run());
  }
}

// The outer step on each piece's average, the same on every rank: d = avg (Nesterov: b = mu b +
// avg, d = avg + mu b), anchor -= outer_lr d, value = anchor (with overlap, this rank's progress
// since the start kept as the piece's carry first); the velocities as momentum_at_average says.
void Optimizer::merge(Communicator& comm, Flight& fl, EpochRecord& total) {
  Periodic& s = periodic_;
  while (fl.sent < fl.parts.size()) send(comm, fl, total);  // pacing: what is left, now
  for (Part& part : fl.parts) {
    if (part.done.valid()) add_stats(total, part.done.get());  // rethrows the collective's error
  }
  const double t0 = now();
  const bool velocities = c_.momentum_at_average == "average";
  const bool keep = !fl.starts.empty();
  const auto lr = static_cast<float>(c_.outer_lr);
  const auto mu = static_cast<float>(c_.outer_momentum);
  if (mu > 0 && s.outer.empty()) {
    for (Param* q : params_) s.outer.emplace_back(q->value.size(), 0.0f);
  }
  const std::size_t m = fl.pieces.size();
  for (std::size_t t = 0; t < m; ++t) {
    const std::size_t i = fl.pieces[t];
    const Piece& pc = s.pieces[i];
    std::vector<float>& a = s.anchors[pc.param];
    std::vector<float>& value = params_[pc.param]->value;
    const std::vector<float>& x = fl.changes[t];
    if (keep) {
      std::vector<float>& c = s.carry[i];
      c.resize(x.size());
      for (std::size_t k = 0; k < x.size(); ++k) c[k] = fl.starts[t][k] - value[pc.lo + k];
    }
    for (std::size_t k = pc.lo; k < pc.hi; ++k) {
      const float xk = x[k - pc.lo];
      float d = xk;
      if (mu > 0) {
        float& b = s.outer[pc.param][k];
        b = mu * b + xk;
        d = xk + mu * b;  // Nesterov: the step looks ahead along b
      }
      a[k] -= lr * d;
      value[k] = a[k];
    }
  }
  for (std::size_t t = 0; t < m; ++t) {
    const std::size_t i = fl.pieces[t];
    const Piece& pc = s.pieces[i];
    std::vector<float>& u = velocity_[pc.param];
    if (velocities) {
      std::vector<float>& a = s.velocity_anchors[pc.param];
      const std::vector<float>& x = fl.changes[m + t];
      if (keep) {
        std::vector<float>& c = s.velocity_carry[i];
        c.resize(x.size());
        for (std::size_t k = 0; k < x.size(); ++k) c[k] = fl.starts[m + t][k] - u[pc.lo + k];
      }
      for (std::size_t k = pc.lo; k < pc.hi; ++k) {
        a[k] -= x[k - pc.lo];
        u[k] = a[k];
      }
    } else if (c_.momentum_at_average == "reset") {
      std::fill(u.begin() + static_cast<std::ptrdiff_t>(pc.lo),
                u.begin() + static_cast<std::ptrdiff_t>(pc.hi), 0.0f);
    }
  }
  ++total.averages;
  if (fl.whole && s.flights.size() == 1) s.agreed_after = taken_;
  total.compute_seconds += now() - t0;
}

void Optimizer::synchronize(Communicator& comm, EpochRecord& total) {
  if (c_.period > 1) {
    // The averages in flight merged; then the local steps since the ranks last agreed (or
    // since the local phase began) averaged by one more, every fragment at once.
    Periodic& s = periodic_;
    while (!s.flights.empty()) {
      merge(comm, s.flights.front(), total);
      s.flights.pop_front();
    }
    if (taken_ > c_.period_from && s.agreed_after != taken_) {
      std::vector<std::size_t> all(s.fragments.size());
      for (std::size_t f = 0; f < all.size(); ++f) all[f] = f;
      start(comm, all, 0, total);  // merged at once
      merge(comm, s.flights.back(), total);
      s.flights.pop_back();
      s.averaged_after = taken_;
    }
    return;
  }
  if (!adam_) return;
  std::vector<std::span<float>> values;
  for (Param* q : params_) values.emplace_back(q->value);
  const double t0 = now();
  adam_->synchronize(comm, values);
  if (!adam_->last_step_sent()) return;
  const CallStats& st = comm.last_stats();
  add_stats(total, st);
  total.compute_seconds +=
      std::max(0.0, now() - t0 - st.encode_seconds - st.comm_seconds - st.decode_seconds);
}

void Optimizer::dgc_step(Communicator& comm, double lr_now, double density,
                         const AllreduceOptions& opt, EpochRecord& total) {
  const int p = comm.size();
  const auto lr = static_cast<float>(lr_now);
  // Local clipping of the whole gradient to clip / sqrt(ranks).
  double t0 = now();
  if (dgc_.clip > 0) {
    double norm = 0;
    for (Param* q : params_) {
      for (float g : q->grad) norm += static_cast<double>(g) * g;
    }
    norm = std::sqrt(norm);
    const double limit = dgc_.clip / std::sqrt(static_cast<double>(p));
    if (norm > limit) {
      const auto scale = static_cast<float>(limit / norm);
      for (Param* q : params_) {
        for (float& g : q->grad) g *= scale;
      }
    }
  }
  // Small tensors: a dense average and plain momentum.
  std::vector<std::span<float>> small;
  std::vector<std::size_t> small_ids;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i]->value.size() < c_.dense_below) {
      small.emplace_back(params_[i]->grad);
      small_ids.push_back(i);
    }
  }
  total.compute_seconds += now() - t0;
  if (!small.empty()) {
    BucketOptions dense = bucket_;
    dense.allreduce = opt;
    dense.dense_below = 0;
    dense.allreduce.algorithm = Algorithm::dense;
    comm.allreduce_buckets(small, none_, {}, dense);
    add_stats(total, comm.last_stats());
  }
  t0 = now();
  for (std::size_t i : small_ids) momentum_update(i, lr);
  total.compute_seconds += now() - t0;
  // Large tensors: momentum correction (gcomp/momentum.hpp). The velocity u = mu u + g is sent
  // by top-k with error feedback, so the residual is where the velocities accumulate and top-k
  // selects on the accumulation; wherever the residual is then 0 (sent) the velocity is zeroed
  // (momentum factor masking); the average of what was sent is the step.
  const auto mu = static_cast<float>(c_.momentum);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Param& q = *params_[i];
    if (q.value.size() < c_.dense_below) continue;
    t0 = now();
    momentum_correct(velocity_[i], q.grad, mu);
    const auto k = std::max<std::size_t>(
        1, static_cast<std::size_t>(std::llround(density * static_cast<double>(q.grad.size()))));
    const Codec select("topk:k=" + std::to_string(k));
    total.compute_seconds += now() - t0;
    comm.allreduce(q.grad, select, &dgc_memories_[i], opt);
    add_stats(total, comm.last_stats());
    t0 = now();
    mask_momentum(velocity_[i], dgc_memories_[i].residual());
    for (std::size_t j = 0; j < q.value.size(); ++j) q.value[j] -= lr * q.grad[j];
    total.compute_seconds += now() - t0;
  }
}

}  // namespace gcomp::train
