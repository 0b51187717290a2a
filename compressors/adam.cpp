// Adam, AdamW and 1-bit Adam's compressed stage (include/gcomp/adam.hpp). The scalars are
// worked out in double and rounded to float once, as torch.optim does with Python floats; the
// element-wise products and sums are float, each rounded on its own (-ffp-contract=off).
#include "gcomp/adam.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(Status::invalid_argument, what); }

bool finite_in(double x, double lo, double hi) { return std::isfinite(x) && x >= lo && x < hi; }

void check_sizes(const char* who, std::size_t n, std::initializer_list<std::size_t> others) {
  for (const std::size_t m : others) {
    if (m != n) {
      bad(std::string(who) + ": the tensors differ in size (" + std::to_string(n) + " and " +
          std::to_string(m) + " elements)");
    }
  }
}

void check_lr(const char* who, double lr) {
  if (!std::isfinite(lr) || lr < 0) {
    bad(std::string(who) + ": lr must be finite and >= 0, not " + std::to_string(lr));
  }
}

// The float factors one step uses.
struct Factors {
  float beta1, keep1;  // m = beta1 m + keep1 g
  float beta2, keep2;  // v = beta2 v + keep2 g^2
  float decay;         // Adam's L2 term (0 for AdamW)
  float shrink;        // AdamW's p *= shrink (1 for Adam)
};

Factors factors_of(const AdamSettings& s, double lr) {
  return {static_cast<float>(s.beta1),
          static_cast<float>(1.0 - s.beta1),
          static_cast<float>(s.beta2),
          static_cast<float>(1.0 - s.beta2),
          s.decoupled ? 0.0f : static_cast<float>(s.weight_decay),
          s.decoupled ? static_cast<float>(1.0 - lr * s.weight_decay) : 1.0f};
}

// p -= step_size * m / (sqrt(v) / root2 + eps), torch's addcdiv_ with denom. limit > 0 (the
// frozen stage): m / denom is clamped to +-limit, and an element whose v is 0 does not move.
void move(float* p, const float* m, const float* v, std::size_t n, float shrink, double lr,
          double bias1, double bias2, double eps, float limit = 0.0f) {
  const auto step_size = static_cast<float>(lr / bias1);
  const auto root2 = static_cast<float>(std::sqrt(bias2));
  const auto e = static_cast<float>(eps);
  for (std::size_t i = 0; i < n; ++i) {
    float x = p[i];
    if (shrink != 1.0f) x *= shrink;
    const float denom = std::sqrt(v[i]) / root2 + e;
    float q = m[i] / denom;
    if (limit > 0.0f) q = v[i] == 0.0f ? 0.0f : std::clamp(q, -limit, limit);
    p[i] = x + -step_size * q;
  }
}

// Exact Adam's step is at most lr * max(1, (1 - beta1) / sqrt(1 - beta2)) (Kingma & Ba, section
// 2.1): its m and v come from the same gradients. A frozen (or seldom refreshed) v does not bound
// a compressed m (a 1-bit codec sends +-scale where m is 0), so the same bound is kept there.
double bound_of(const AdamSettings& s) {
  return std::max(1.0, (1.0 - s.beta1) / std::sqrt(1.0 - s.beta2));
}

}  // namespace

void check_adam_settings(const AdamSettings& s) {
  if (!finite_in(s.beta1, 0, 1))
    bad("Adam: beta1 must be in [0, 1), not " + std::to_string(s.beta1));
  if (!finite_in(s.beta2, 0, 1))
    bad("Adam: beta2 must be in [0, 1), not " + std::to_string(s.beta2));
  if (!std::isfinite(s.eps) || !(s.eps > 0)) {
    bad("Adam: eps must be finite and > 0, not " + std::to_string(s.eps));
  }
  if (!std::isfinite(s.weight_decay) || s.weight_decay < 0) {
    bad("Adam: weight_decay must be finite and >= 0, not " + std::to_string(s.weight_decay));
  }
}

void adam_step(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
               std::span<float> exp_avg_sq, const AdamSettings& s, double lr, std::uint64_t step,
               std::uint64_t variance_steps) {
  check_adam_settings(s);
  check_lr("adam_step", lr);
  check_sizes("adam_step", param.size(), {grad.size(), exp_avg.size(), exp_avg_sq.size()});
  if (step == 0) bad("adam_step: step counts from 1, not 0");
  if (variance_steps > step) {
    bad("adam_step: variance_steps must be at most step = " + std::to_string(step) + ", not " +
        std::to_string(variance_steps));
  }
  const std::uint64_t tv = variance_steps == 0 ? step : variance_steps;
  const Factors f = factors_of(s, lr);
  float* p = param.data();
  const float* g = grad.data();
  float* m = exp_avg.data();
  float* v = exp_avg_sq.data();
  for (std::size_t i = 0; i < param.size(); ++i) {
    float gi = g[i];
    if (f.decay != 0.0f) gi = gi + f.decay * p[i];
    m[i] = m[i] * f.beta1 + f.keep1 * gi;
    v[i] = v[i] * f.beta2 + f.keep2 * (gi * gi);
  }
  const double bias1 = 1.0 - std::pow(s.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(s.beta2, static_cast<double>(tv));
  move(p, m, v, param.size(), f.shrink, lr, bias1, bias2, s.eps,
       tv == step ? 0.0f : static_cast<float>(bound_of(s) * bias1));
}

void adam_local_momentum(std::span<const float> param, std::span<const float> grad,
                         std::span<const float> exp_avg, std::span<float> out,
                         const AdamSettings& s) {
  check_adam_settings(s);
  check_sizes("adam_local_momentum", param.size(), {grad.size(), exp_avg.size(), out.size()});
  const Factors f = factors_of(s, 0.0);
  const float* p = param.data();
  const float* g = grad.data();
  const float* m = exp_avg.data();
  float* o = out.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    float gi = g[i];
    if (f.decay != 0.0f) gi = gi + f.decay * p[i];
    o[i] = m[i] * f.beta1 + f.keep1 * gi;
  }
}

void adam_frozen_update(std::span<float> param, std::span<const float> momentum,
                        std::span<float> exp_avg, std::span<const float> exp_avg_sq,
                        const AdamSettings& s, double lr, std::uint64_t step,
                        std::uint64_t variance_steps) {
  check_adam_settings(s);
  check_lr("adam_frozen_update", lr);
  check_sizes("adam_frozen_update", param.size(),
              {momentum.size(), exp_avg.size(), exp_avg_sq.size()});
  if (variance_steps == 0 || variance_steps > step) {
    bad("adam_frozen_update: variance_steps must be in [1, step = " + std::to_string(step) +
        "], not " + std::to_string(variance_steps) +
        " (the variance is frozen after at least one exact step)");
  }
  if (momentum.data() != exp_avg.data()) {
    std::copy(momentum.begin(), momentum.end(), exp_avg.begin());
  }
  const Factors f = factors_of(s, lr);
  const double bias1 = 1.0 - std::pow(s.beta1, static_cast<double>(step));
  move(param.data(), exp_avg.data(), exp_avg_sq.data(), param.size(), f.shrink, lr, bias1,
       1.0 - std::pow(s.beta2, static_cast<double>(variance_steps)), s.eps,
       static_cast<float>(bound_of(s) * bias1));
}

namespace {

void check_sync(const char* who, const AdamSettings& s, double lr_sum, double decay,
                std::uint64_t variance_steps) {
  check_adam_settings(s);
  if (!std::isfinite(lr_sum) || !(lr_sum > 0)) {
    bad(std::string(who) + ": lr_sum must be finite and > 0, not " + std::to_string(lr_sum));
  }
  if (!(decay > 0 && decay <= 1)) {
    bad(std::string(who) + ": decay must be in (0, 1], not " + std::to_string(decay));
  }
  if (variance_steps == 0) bad(std::string(who) + ": variance_steps must be at least 1");
}

}  // namespace

void adam_sync_momentum(std::span<const float> param, std::span<const float> anchor,
                        std::span<const float> exp_avg_sq, std::span<float> out,
                        const AdamSettings& s, double lr_sum, double decay,
                        std::uint64_t variance_steps) {
  check_sync("adam_sync_momentum", s, lr_sum, decay, variance_steps);
  check_sizes("adam_sync_momentum", param.size(), {anchor.size(), exp_avg_sq.size(), out.size()});
  const auto root2 =
      static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, static_cast<double>(variance_steps))));
  const auto e = static_cast<float>(s.eps);
  const auto d = static_cast<float>(decay);
  const auto inv = static_cast<float>(1.0 / lr_sum);
  const float* p = param.data();
  const float* a = anchor.data();
  const float* v = exp_avg_sq.data();
  float* o = out.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    const float denom = std::sqrt(v[i]) / root2 + e;
    o[i] = (d * a[i] - p[i]) * denom * inv;
  }
}

void adam_sync_update(std::span<float> param, std::span<float> anchor,
                      std::span<const float> momentum, std::span<float> exp_avg,
                      std::span<const float> exp_avg_sq, const AdamSettings& s, double lr_sum,
                      double decay, std::uint64_t step, std::uint64_t variance_steps) {
  check_sync("adam_sync_update", s, lr_sum, decay, variance_steps);
  check_sizes("adam_sync_update", param.size(),
              {anchor.size(), momentum.size(), exp_avg.size(), exp_avg_sq.size()});
  if (variance_steps > step) {
    bad("adam_sync_update: variance_steps must be at most step = " + std::to_string(step) +
        ", not " + std::to_string(variance_steps));
  }
  const auto root2 =
      static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, static_cast<double>(variance_steps))));
  const auto e = static_cast<float>(s.eps);
  const auto d = static_cast<float>(decay);
  const auto size = static_cast<float>(lr_sum);
  const auto limit = static_cast<float>(bound_of(s));
  const auto bias1 = static_cast<float>(1.0 - std::pow(s.beta1, static_cast<double>(step)));
  float* p = param.data();
  float* a = anchor.data();
  const float* u = momentum.data();
  float* m = exp_avg.data();
  const float* v = exp_avg_sq.data();
  for (std::size_t i = 0; i < param.size(); ++i) {
    const float denom = std::sqrt(v[i]) / root2 + e;
    const float q = v[i] == 0.0f ? 0.0f : std::clamp(u[i] / denom, -limit, limit);
    const float x = d * a[i] + -size * q;
    m[i] = u[i] * bias1;
    p[i] = x;
    a[i] = x;
  }
}

}  // namespace gcomp
