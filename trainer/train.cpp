// The training loop (see train.hpp).
#include "train.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <numeric>
#include <random>
#include <string>

#include "gcomp/adam.hpp"
#include "gcomp/codec.hpp"
#include "optimizer.hpp"

namespace gcomp::train {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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

std::string feedback_warning(const Config& c) {
  if (!c.error_feedback || parse_dgc(c.codec).on) return {};
  const Codec k(c.codec);
  const CodecProperties p = k.properties();
  if (p.contraction) return {};           // what error feedback is for
  const double omega = p.variance_bound;  // NaN where none is known
  if (!(omega >= 1)) return {};
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "error feedback with %s: its variance bound is %.2f x |x|^2 (>= 1), so it is "
                "not a contraction and the residual can grow until the run diverges; an "
                "unbiased codec is meant to run without it (--no-ef)",
                k.spec().c_str(), omega);
  return buf;
}

double learning_rate(const Config& c, std::uint64_t step, std::uint64_t total_steps) {
  if (c.schedule == "constant" || total_steps == 0) return c.lr;
  const double t = static_cast<double>(step) / static_cast<double>(total_steps);
  return c.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

std::vector<std::size_t> epoch_order(const Config& c, std::size_t n_train, int epoch) {
  std::vector<std::size_t> order(n_train);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 shuffle(c.seed * 1000003ull + static_cast<std::uint64_t>(epoch));
  std::shuffle(order.begin(), order.end(), shuffle);
  return order;
}

std::span<const std::size_t> local_batch(const Config& c, std::span<const std::size_t> order,
                                         std::size_t step, int rank, int ranks) {
  const std::size_t global = c.batch * static_cast<std::size_t>(ranks);
  return order.subspan(step * global + static_cast<std::size_t>(rank) * c.batch, c.batch);
}

namespace {

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// Periodic averaging's settings (Config::period and the six after it).
void validate_periodic(const Config& c) {
  const auto bad = [](const std::string& why) { throw Error(Status::invalid_argument, why); };
  if (c.period < 1) bad("--period must be at least 1 (1: every step synchronized), not 0");
  if (!(c.outer_lr > 0) || !std::isfinite(c.outer_lr)) {
    bad("--outer-lr must be finite and > 0, not " + number(c.outer_lr));
  }
  if (!(c.outer_momentum >= 0 && c.outer_momentum < 1)) {
    bad("--outer-momentum must be in [0, 1), not " + number(c.outer_momentum));
  }
  const std::string& m = c.momentum_at_average;
  if (m != "local" && m != "reset" && m != "average") {
    bad("--momentum-at-average must be local, reset or average, not '" + m + "'");
  }
  if (c.fragments < 1) bad("--fragments must be at least 1, not 0");
  if (c.period > 1 && c.fragments > c.period) {
    bad("--fragments " + std::to_string(c.fragments) + " is more than --period " +
        std::to_string(c.period) + ": each fragment is averaged at its own step of the period");
  }
  if (c.period > 1 && c.overlap_steps >= c.period) {
    bad("--overlap-steps " + std::to_string(c.overlap_steps) + " must be less than --period " +
        std::to_string(c.period) + " (a fragment's average is merged before its next starts)");
  }
  if (c.period == 1) {
    std::vector<std::string> set;
    if (c.period_from != 0) set.push_back("--period-from");
    if (c.fragments != 1) set.push_back("--fragments");
    if (c.overlap_steps != 0) set.push_back("--overlap-steps");
    if (c.outer_lr != 1.0) set.push_back("--outer-lr");
    if (c.outer_momentum != 0.0) set.push_back("--outer-momentum");
    if (m != "local") set.push_back("--momentum-at-average");
    if (set.empty()) return;
    std::string names = set[0];
    for (std::size_t i = 1; i < set.size(); ++i) names += ", " + set[i];
    bad(names + (set.size() == 1 ? " means" : " mean") +
        " nothing without --period > 1 (every step synchronized)");
  }
  if (c.optimizer != "sgd") {
    bad("--period > 1 averages momentum SGD's local steps, not " + c.optimizer +
        "'s (0/1 Adam's local steps are --zero-one)");
  }
  if (parse_dgc(c.codec).on) {
    bad("--period > 1 with dgc: DGC's momentum correction is the synchronized steps' (a top-k "
        "codec with error feedback averages the local steps)");
  }
}

}  // namespace

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
  if (c.ef_scaled_by_lr && !c.ef_on_velocity) {
    bad("error feedback on the update is on the velocity");
  }
  if (c.optimizer != "sgd" && c.optimizer != "adam" && c.optimizer != "adamw") {
    bad("unknown optimizer '" + c.optimizer + "' (sgd, adam or adamw)");
  }
  if (c.optimizer != "sgd") {
    if (parse_dgc(c.codec).on) bad("dgc is SGD's momentum correction, not " + c.optimizer + "'s");
    if (c.warmup_epochs != 0) {
      bad(c.optimizer + "'s warm-up is --warmup-steps (its exact steps), not --warmup-epochs");
    }
    if (c.warmup_steps < 1 && c.zero_one.empty()) {
      bad(c.optimizer +
          " needs --warmup-steps of at least 1 (the variance frozen after them is "
          "the one they estimate) or --zero-one");
    }
    if (!c.zero_one.empty() && c.warmup_steps != 0) {
      bad("--zero-one's warm-up is its KAPPA steps: --warmup-steps goes without it");
    }
    adam_schedule(c).check();
    check_adam_settings({c.beta1, c.beta2, c.eps, c.weight_decay, c.optimizer == "adamw"});
  } else if (c.warmup_steps != 0) {
    bad("--warmup-steps is Adam's; SGD's warm-up is --warmup-epochs");
  } else if (!c.zero_one.empty()) {
    bad("--zero-one is Adam's");
  }
  validate_periodic(c);
}

AdamSchedule adam_schedule(const Config& c) {
  if (c.zero_one.empty()) return AdamSchedule::one_bit(c.warmup_steps);
  std::vector<std::uint64_t> v;
  std::size_t at = 0;
  while (at <= c.zero_one.size()) {
    const std::size_t comma = std::min(c.zero_one.find(',', at), c.zero_one.size());
    const std::string field = c.zero_one.substr(at, comma - at);
    std::uint64_t x = 0;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), x);
    if (field.empty() || ec != std::errc() || end != field.data() + field.size() || v.size() == 4) {
      throw Error(
          Status::invalid_argument,
          "--zero-one must be FREEZE[,KAPPA[,H[,DOUBLE]]] (counts), not '" + c.zero_one + "'");
    }
    v.push_back(x);
    at = comma + 1;
  }
  return AdamSchedule::zero_one(v[0], v.size() > 1 ? v[1] : 16, v.size() > 2 ? v[2] : 16,
                                v.size() > 3 ? v[3] : 32);
}

History run(const Config& c, const Dataset& train, const Dataset& test, Communicator& comm,
            Model& model, const std::function<void(const EpochRecord&)>& on_epoch,
            const std::function<void(std::size_t, std::size_t)>& on_step) {
  validate(c);
  const Dgc dgc = parse_dgc(c.codec);
  const int p = comm.size();
  const std::size_t n_train = train_count(c, train);
  const std::size_t global_batch = c.batch * static_cast<std::size_t>(p);
  const std::size_t steps = n_train / global_batch;
  if (steps == 0) {
    throw Error(Status::invalid_argument, "the global batch (" + std::to_string(global_batch) +
                                              ") is larger than the " + std::to_string(n_train) +
                                              " training samples");
  }
  const std::vector<Param*> params = model.params();
  const std::size_t f = train.features();
  Optimizer optimizer(c, params);

  History h;
  h.parameters = model.parameter_count();
  h.ranks = p;
  EpochRecord total;
  Matrix x(static_cast<Eigen::Index>(f), static_cast<Eigen::Index>(c.batch));
  std::vector<std::uint8_t> labels(c.batch);
  std::uint64_t step_counter = 0;
  const std::uint64_t total_steps = static_cast<std::uint64_t>(c.epochs) * steps;
  const double dense_step_bytes =
      p > 1 ? 2.0 * (p - 1) / p * 4.0 * static_cast<double>(h.parameters) : 0.0;

  for (int epoch = 0; epoch < c.epochs; ++epoch) {
    const std::vector<std::size_t> order = epoch_order(c, n_train, epoch);
    const bool compress = epoch >= c.warmup_epochs;
    const double ratio = dgc.on ? dgc_ratio(epoch, dgc.ratio) : 1.0;
    double loss_sum = 0;
    const double epoch_start = now();
    for (std::size_t s = 0; s < steps; ++s) {
      try {
        double t0 = now();
        const std::span<const std::size_t> ids = local_batch(c, order, s, comm.rank(), p);
        for (std::size_t j = 0; j < c.batch; ++j) {
          const std::size_t id = ids[j];
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

        optimizer.step(comm, lr_now, compress, ratio, step_counter, total);
        optimizer.average_if_due(comm, total);  // periodic averaging's schedule
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
    // 0/1 Adam between two synchronizations, or local steps since the last periodic average:
    // the ranks agree before the evaluation, which splits the test set over them.
    optimizer.synchronize(comm, total);
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
          throw Error(Status::nonfinite, "the model diverged in epoch " +
                                             std::to_string(epoch + 1) + " (a weight of " +
                                             q->name + " is not finite; try a smaller --lr)");
        }
      }
    }
    h.epochs.push_back(rec);
    if (on_epoch) on_epoch(rec);
  }
  return h;
}

}  // namespace gcomp::train
