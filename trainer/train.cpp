// The training loop (see train.hpp).
#include "train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <numeric>
#include <random>
#include <string>

#include "gcomp/codec.hpp"

namespace gcomp::train {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Dgc {
  bool on = false;
  double ratio = 0.001;
  double clip = 0;
};

// "dgc:ratio=R[,clip=C]"; anything else is not DGC.
Dgc parse_dgc(const std::string& spec) {
  Dgc d;
  if (spec != "dgc" && spec.rfind("dgc:", 0) != 0) return d;
  d.on = true;
  bool have_ratio = false;
  const auto bad = [&](const std::string& why) {
    throw Error(Status::invalid_argument, "invalid codec spec '" + spec + "': " + why);
  };
  if (spec.size() > 4) {
    std::string rest = spec.substr(4);
    std::size_t pos = 0;
    while (pos <= rest.size()) {
      const std::size_t comma = rest.find(',', pos);
      const std::string item = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      const std::size_t eq = item.find('=');
      if (eq == std::string::npos) bad("'" + item + "' is not key=value");
      const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
      char* end = nullptr;
      const double v = std::strtod(val.c_str(), &end);
      if (val.empty() || *end != '\0' || !std::isfinite(v)) bad(key + " must be a number, got '" + val + "'");
      if (key == "ratio") {
        if (!(v > 0 && v <= 1)) bad("ratio must be in (0, 1], got " + val);
        d.ratio = v;
        have_ratio = true;
      } else if (key == "clip") {
        if (!(v >= 0)) bad("clip must be >= 0, got " + val);
        d.clip = v;
      } else {
        bad("unknown key '" + key + "' for dgc (ratio, clip)");
      }
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  if (!have_ratio) bad("dgc needs ratio=R");
  return d;
}

std::size_t train_count(const Config& c, const Dataset& d) {
  return c.subset ? std::min(c.subset, d.count) : d.count;
}

// Test accuracy, the test set split over the ranks.
double evaluate(const Config& c, const Dataset& test, Communicator& comm, Model& model) {
  const std::size_t n = c.test_subset ? std::min(c.test_subset, test.count) : test.count;
  const auto p = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t lo = n * r / p, hi = n * (r + 1) / p;
  const std::size_t f = test.features();
  double correct = 0;
  for (std::size_t b = lo; b < hi; b += 1000) {
    const std::size_t e = std::min(hi, b + 1000);
    const Eigen::Map<const Matrix> x(test.images.data() + b * f, static_cast<Eigen::Index>(f),
                                     static_cast<Eigen::Index>(e - b));
    const Matrix& logits = model.logits(x);
    for (std::size_t s = 0; s < e - b; ++s) {
      Eigen::Index arg = 0;
      logits.col(static_cast<Eigen::Index>(s)).maxCoeff(&arg);
      correct += arg == test.labels[b + s] ? 1 : 0;
    }
  }
  double total = 0;
  MPI_Allreduce(&correct, &total, 1, MPI_DOUBLE, MPI_SUM, comm.comm());
  return n ? total / static_cast<double>(n) : 0.0;
}

}  // namespace

double dgc_ratio(int epoch, double target) {
  static const double warm[] = {0.25, 0.0625, 0.015625, 0.004};
  return epoch < 4 ? std::max(warm[epoch], target) : target;
}

Algorithm fewest_bytes_algorithm(const std::string& codec, int ranks) {
  if (parse_dgc(codec).on) return Algorithm::sparse_recursive_doubling;
  const Codec k(codec);
  if (k.kind() == CodecKind::none) return Algorithm::dense;
  if (k.properties().sparse) return Algorithm::sparse_recursive_doubling;
  // An allgather sends (P-1) B, compressed_reduce_scatter 2 (P-1)/P B: the same at two ranks,
  // where the allgather's single compression is the better of the two.
  return ranks <= 2 ? Algorithm::allgather : Algorithm::compressed_reduce_scatter;
}

std::string feedback_warning(const Config& c) {
  if (!c.error_feedback || parse_dgc(c.codec).on) return {};
  const Codec k(c.codec);
  if (k.kind() != CodecKind::qsgd) return {};
  // The canonical spec spells every key: "qsgd:bits=B,bucket=D".
  const std::string spec = k.spec();
  const auto value = [&](const std::string& key) {
    const std::size_t at = spec.find(key + "=");
    return std::stod(spec.substr(at + key.size() + 1));
  };
  const double s = std::exp2(value("bits") - 1) - 1, d = value("bucket");
  const double omega = std::min(d / (s * s), std::sqrt(d) / s);  // QSGD's variance bound
  if (omega < 1) return {};
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "error feedback with %s: QSGD's variance bound is %.2f x |x|^2 (>= 1), so it is "
                "not a contraction and the residual can grow until the run diverges; QSGD is "
                "unbiased and meant to run without it (--no-ef)",
                spec.c_str(), omega);
  return buf;
}

double learning_rate(const Config& c, std::uint64_t step, std::uint64_t total_steps) {
  if (c.schedule == "constant" || total_steps == 0) return c.lr;
  const double t = static_cast<double>(step) / static_cast<double>(total_steps);
  return c.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

void validate(const Config& c) {
  const auto bad = [](const std::string& why) { throw Error(Status::invalid_argument, why); };
  if (c.model != "mlp" && c.model != "cnn") bad("unknown model '" + c.model + "' (mlp or cnn)");
  if (!parse_dgc(c.codec).on) Codec check(c.codec);  // throws naming the spec
  if (c.epochs < 1) bad("epochs must be at least 1");
  if (c.batch < 1) bad("batch must be at least 1");
  if (!(c.lr > 0) || !std::isfinite(c.lr)) bad("lr must be positive");
  if (c.schedule != "cosine" && c.schedule != "constant") {
    bad("unknown schedule '" + c.schedule + "' (cosine or constant)");
  }
  if (!(c.momentum >= 0 && c.momentum < 1)) bad("momentum must be in [0, 1)");
  if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay)) bad("weight decay must be >= 0");
  if (c.warmup_epochs < 0) bad("warm-up epochs must be >= 0");
}

History run(const Config& c, const Dataset& train, const Dataset& test, Communicator& comm,
            Model& model, const std::function<void(const EpochRecord&)>& on_epoch,
            const std::function<void(std::size_t, std::size_t)>& on_step) {
  validate(c);
  const Dgc dgc = parse_dgc(c.codec);
  const int p = comm.size();
  const auto rank = static_cast<std::size_t>(comm.rank());
  const std::size_t n_train = train_count(c, train);
  const std::size_t global_batch = c.batch * static_cast<std::size_t>(p);
  const std::size_t steps = n_train / global_batch;
  if (steps == 0) {
    throw Error(Status::invalid_argument,
                "the global batch (" + std::to_string(global_batch) + ") is larger than the " +
                    std::to_string(n_train) + " training samples");
  }
  const std::vector<Param*> params = model.params();
  const std::size_t f = train.features();
  std::vector<std::vector<float>> velocity(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) velocity[i].assign(params[i]->value.size(), 0.0f);
  std::vector<ErrorFeedback> memories;
  if (c.error_feedback && !dgc.on) {
    for (Param* q : params) memories.emplace_back(q->value.size());
  }
  std::vector<ErrorFeedback*> efs;
  for (auto& m : memories) efs.push_back(&m);
  std::vector<std::vector<float>> dgc_v(params.size());  // DGC accumulation
  if (dgc.on) {
    for (std::size_t i = 0; i < params.size(); ++i) dgc_v[i].assign(params[i]->value.size(), 0.0f);
  }
  const bool velocity_ef = !memories.empty() && c.ef_on_velocity;
  const Codec none("none");
  const Codec codec(dgc.on ? "none" : c.codec);
  std::vector<std::span<float>> grads;
  for (Param* q : params) grads.emplace_back(q->grad);

  BucketOptions bucket;
  bucket.bucket_bytes = c.bucket_bytes;
  bucket.dense_below = c.dense_below;
  bucket.allreduce.average = true;
  bucket.allreduce.algorithm = c.algorithm.value_or(fewest_bytes_algorithm(c.codec, p));
  bucket.allreduce.allow_uncompressed = false;  // an accuracy experiment measures the codec
  bucket.allreduce.seed = c.seed;

  History h;
  h.parameters = model.parameter_count();
  h.ranks = p;
  EpochRecord total;
  std::vector<std::size_t> order(n_train);
  Matrix x(static_cast<Eigen::Index>(f), static_cast<Eigen::Index>(c.batch));
  std::vector<std::uint8_t> labels(c.batch);
  std::uint64_t step_counter = 0;
  const std::uint64_t total_steps = static_cast<std::uint64_t>(c.epochs) * steps;
  const double dense_step_bytes =
      p > 1 ? 2.0 * (p - 1) / p * 4.0 * static_cast<double>(h.parameters) : 0.0;

  for (int epoch = 0; epoch < c.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937_64 shuffle(c.seed * 1000003ull + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), shuffle);
    const bool compress = epoch >= c.warmup_epochs;
    const double ratio = dgc.on ? dgc_ratio(epoch, dgc.ratio) : 1.0;
    double loss_sum = 0;
    const double epoch_start = now();
    for (std::size_t s = 0; s < steps; ++s) {
      try {
        double t0 = now();
        for (std::size_t j = 0; j < c.batch; ++j) {
          const std::size_t id = order[s * global_batch + rank * c.batch + j];
          x.col(static_cast<Eigen::Index>(j)) = Eigen::Map<const Eigen::VectorXf>(
              train.images.data() + id * f, static_cast<Eigen::Index>(f));
          labels[j] = train.labels[id];
        }
        loss_sum += model.train_step(x, labels.data());
        const double lr_now = learning_rate(c, step_counter, total_steps);
        if (c.weight_decay > 0) {
          for (Param* q : params) {
            for (std::size_t i = 0; i < q->value.size(); ++i) {
              q->grad[i] += static_cast<float>(c.weight_decay) * q->value[i];
            }
          }
        }
        total.compute_seconds += now() - t0;

        const auto add_stats = [&](const CallStats& st) {
          total.bytes_sent_per_rank += static_cast<double>(st.bytes_sent);
          total.encode_seconds += st.encode_seconds;
          total.comm_seconds += st.comm_seconds;
          total.decode_seconds += st.decode_seconds;
        };
        const auto momentum_update = [&](std::size_t i) {
          Param& q = *params[i];
          std::vector<float>& m = velocity[i];
          const auto mu = static_cast<float>(c.momentum);
          const auto lr = static_cast<float>(lr_now);
          for (std::size_t k = 0; k < q.value.size(); ++k) {
            m[k] = mu * m[k] + q.grad[k];
            q.value[k] -= lr * m[k];
          }
        };

        BucketOptions bo = bucket;
        bo.allreduce.seed = derive_seed(c.seed, 0, step_counter, 0);
        const AllreduceOptions& opt = bo.allreduce;
        if (!compress || (!dgc.on && !velocity_ef)) {
          // The gradient averaged, then one momentum. Warm-up: float32, whatever algorithm the
          // codec would use.
          BucketOptions o = bo;
          if (!compress) o.allreduce.algorithm = Algorithm::dense;
          if (compress) {
            comm.allreduce_buckets(grads, codec, efs, o);
          } else {
            comm.allreduce_buckets(grads, none, {}, o);
          }
          add_stats(comm.last_stats());
          t0 = now();
          for (std::size_t i = 0; i < params.size(); ++i) momentum_update(i);
          total.compute_seconds += now() - t0;
        } else if (!dgc.on) {
          // Error feedback on the velocity: each rank's momentum m_r = mu m_r + g_r is what is
          // compressed (with its residual), and the average of the sent velocities is the step.
          // Without compression this is exactly the momentum of the averaged gradient.
          t0 = now();
          const auto mu = static_cast<float>(c.momentum);
          for (std::size_t i = 0; i < params.size(); ++i) {
            std::vector<float>& m = velocity[i];
            std::vector<float>& g = params[i]->grad;
            for (std::size_t k = 0; k < m.size(); ++k) {
              m[k] = mu * m[k] + g[k];
              g[k] = m[k];
            }
          }
          total.compute_seconds += now() - t0;
          comm.allreduce_buckets(grads, codec, efs, bo);
          add_stats(comm.last_stats());
          t0 = now();
          const auto lr = static_cast<float>(lr_now);
          for (Param* q : params) {
            for (std::size_t k = 0; k < q->value.size(); ++k) q->value[k] -= lr * q->grad[k];
          }
          total.compute_seconds += now() - t0;
        } else {
          // DGC. Local clipping of the whole gradient to clip / sqrt(ranks).
          t0 = now();
          if (dgc.clip > 0) {
            double norm = 0;
            for (Param* q : params) {
              for (float g : q->grad) norm += static_cast<double>(g) * g;
            }
            norm = std::sqrt(norm);
            const double limit = dgc.clip / std::sqrt(static_cast<double>(p));
            if (norm > limit) {
              const auto scale = static_cast<float>(limit / norm);
              for (Param* q : params) {
                for (float& g : q->grad) g *= scale;
              }
            }
          }
          // Small tensors: a dense average and plain momentum.
          std::vector<std::span<float>> small;
          std::vector<std::size_t> small_ids;
          for (std::size_t i = 0; i < params.size(); ++i) {
            if (params[i]->value.size() < c.dense_below) {
              small.emplace_back(params[i]->grad);
              small_ids.push_back(i);
            }
          }
          total.compute_seconds += now() - t0;
          if (!small.empty()) {
            BucketOptions dense = bo;
            dense.dense_below = 0;
          dense.allreduce.algorithm = Algorithm::dense;
            comm.allreduce_buckets(small, none, {}, dense);
            add_stats(comm.last_stats());
          }
          t0 = now();
          for (std::size_t i : small_ids) momentum_update(i);
          total.compute_seconds += now() - t0;
          // Large tensors: momentum correction, accumulation, top-k, masking.
          for (std::size_t i = 0; i < params.size(); ++i) {
            Param& q = *params[i];
            if (q.value.size() < c.dense_below) continue;
            t0 = now();
            std::vector<float>& u = velocity[i];
            std::vector<float>& v = dgc_v[i];
            const auto mu = static_cast<float>(c.momentum);
            for (std::size_t k = 0; k < u.size(); ++k) {
              u[k] = mu * u[k] + q.grad[k];
              v[k] += u[k];
            }
            const auto k = std::max<std::size_t>(
                1, static_cast<std::size_t>(std::llround(ratio * static_cast<double>(v.size()))));
            const Codec select("topk:k=" + std::to_string(k));
            SparseEntries e;
            sparse_entries(select.encode(v, 0), e);
            std::fill(q.grad.begin(), q.grad.end(), 0.0f);  // reused as the sent tensor
            for (std::size_t j = 0; j < e.indices.size(); ++j) {
              const auto at = static_cast<std::size_t>(e.indices[j]);
              q.grad[at] = v[at];
              v[at] = 0.0f;
              u[at] = 0.0f;
            }
            total.compute_seconds += now() - t0;
            comm.allreduce(q.grad, select, nullptr, opt);
            add_stats(comm.last_stats());
            const auto lr = static_cast<float>(lr_now);
            for (std::size_t j = 0; j < q.value.size(); ++j) q.value[j] -= lr * q.grad[j];
          }
        }
        ++step_counter;
        if (on_step) on_step(s + 1, steps);
      } catch (const Error& e) {
        // Every rank throws here (the collectives agree on failures): say where, and for a
        // non-finite gradient what usually causes it.
        const std::string where =
            "epoch " + std::to_string(epoch + 1) + ", step " + std::to_string(s + 1) + ": ";
        if (e.code() == Status::nonfinite) {
          throw Error(Status::nonfinite, "the model diverged in " + where + e.what() +
                                             " (a gradient is not finite; try a smaller --lr)");
        }
        throw Error(e.code(), where + e.what());
      }
    }
    total.wall_seconds += now() - epoch_start;
    total.dense_bytes_per_rank += dense_step_bytes * static_cast<double>(steps);

    EpochRecord rec = total;
    rec.epoch = epoch + 1;
    rec.sparsity = dgc.on ? 1.0 - ratio : 0.0;
    double sums[2] = {loss_sum, total.bytes_sent_per_rank};
    double all[2];
    MPI_Allreduce(sums, all, 2, MPI_DOUBLE, MPI_SUM, comm.comm());
    rec.train_loss = all[0] / static_cast<double>(steps * static_cast<std::size_t>(p));
    rec.bytes_sent_per_rank = all[1] / p;
    rec.test_accuracy = evaluate(c, test, comm, model);
    for (Param* q : params) {
      for (float w : q->value) {
        if (!std::isfinite(w)) {
          throw Error(Status::nonfinite, "the model diverged in epoch " + std::to_string(epoch + 1) +
                                             " (a weight of " + q->name + " is not finite; try a smaller --lr)");
        }
      }
    }
    h.epochs.push_back(rec);
    if (on_epoch) on_epoch(rec);
  }
  return h;
}

}  // namespace gcomp::train
