// Adam, AdamW and 1-bit and 0/1 Adam's steps (include/gcomp/adam.hpp). The scalars are worked
// out in double and rounded to float once, as torch.optim does with Python floats; the
// element-wise products and sums (compressors/adam_kernel.hpp) are float, each rounded on its
// own (-ffp-contract=off), on the host here or by the device backend for device views.
#include "gcomp/adam.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "adam_kernel.hpp"
#include "device_backend.hpp"
#include "gcomp/error.hpp"

namespace gcomp {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(Status::invalid_argument, what); }

bool finite_in(double x, double lo, double hi) { return std::isfinite(x) && x >= lo && x < hi; }

// One argument of a call: its name, size and memory.
struct Arg {
  const char* name;
  std::size_t size;
  const detail::DeviceBackend* backend;
  void* stream;
};
template <class T>
Arg arg(const char* name, const TensorView<T>& v) {
  return {name, v.size(), v.backend(), v.stream()};
}

// Where a call runs: host memory (backend null), or one device backend on one stream. Throws
// Error(invalid_argument) for arguments of two sizes or two memories.
struct Where {
  const detail::DeviceBackend* backend = nullptr;
  void* stream = nullptr;
};
Where where_of(const char* who, std::initializer_list<Arg> args) {
  const Arg& first = *args.begin();
  for (const Arg& a : args) {
    if (a.size != first.size) {
      bad(std::string(who) + ": the tensors differ in size (" + first.name + " has " +
          std::to_string(first.size) + " elements, " + a.name + " " + std::to_string(a.size) + ")");
    }
    if ((a.backend == nullptr) != (first.backend == nullptr)) {
      bad(std::string(who) + ": " + a.name + " is in " + (a.backend ? "device" : "host") +
          " memory, " + first.name + " in " + (first.backend ? "device" : "host") +
          " memory (one call takes one memory)");
    }
    if (a.backend != first.backend || a.stream != first.stream) {
      bad(std::string(who) + ": " + a.name + " is on another device backend or stream than " +
          first.name);
    }
  }
  return {first.backend, first.stream};
}

void run(const detail::AdamKernel& k, const detail::AdamArrays& a, std::size_t n, Where w) {
  if (n == 0) return;
  if (w.backend) {
    w.backend->adam(k, a, n, w.stream);
  } else {
    detail::adam_host(k, a, n);
  }
}

// The kernel of a call with settings s and learning rate lr: betas, Adam's L2 term and AdamW's
// factor.
detail::AdamKernel kernel_of(detail::AdamOp op, const AdamSettings& s, double lr) {
  detail::AdamKernel k;
  k.op = op;
  k.beta1 = static_cast<float>(s.beta1);
  k.keep1 = static_cast<float>(1.0 - s.beta1);
  k.beta2 = static_cast<float>(s.beta2);
  k.keep2 = static_cast<float>(1.0 - s.beta2);
  k.l2 = s.decoupled ? 0.0f : static_cast<float>(s.weight_decay);
  k.shrink = s.decoupled ? static_cast<float>(1.0 - lr * s.weight_decay) : 1.0f;
  k.eps = static_cast<float>(s.eps);
  return k;
}

float root2_of(const AdamSettings& s, std::uint64_t variance_steps) {
  return static_cast<float>(
      std::sqrt(1.0 - std::pow(s.beta2, static_cast<double>(variance_steps))));
}

void check_lr(const char* who, double lr) {
  if (!std::isfinite(lr) || lr < 0) {
    bad(std::string(who) + ": lr must be finite and >= 0, not " + std::to_string(lr));
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

void adam_step(TensorView<float> param, TensorView<const float> grad, TensorView<float> exp_avg,
               TensorView<float> exp_avg_sq, const AdamSettings& s, double lr, std::uint64_t step,
               std::uint64_t variance_steps) {
  check_adam_settings(s);
  check_lr("adam_step", lr);
  const Where w = where_of("adam_step", {arg("param", param), arg("grad", grad),
                                         arg("exp_avg", exp_avg), arg("exp_avg_sq", exp_avg_sq)});
  if (step == 0) bad("adam_step: step counts from 1, not 0");
  if (variance_steps > step) {
    bad("adam_step: variance_steps must be at most step = " + std::to_string(step) + ", not " +
        std::to_string(variance_steps));
  }
  const std::uint64_t tv = variance_steps == 0 ? step : variance_steps;
  const double bias1 = 1.0 - std::pow(s.beta1, static_cast<double>(step));
  detail::AdamKernel k = kernel_of(detail::AdamOp::step, s, lr);
  k.step_size = static_cast<float>(lr / bias1);
  k.root2 = root2_of(s, tv);
  k.limit = tv == step ? 0.0f : static_cast<float>(bound_of(s) * bias1);
  run(k,
      {.param = param.data(),
       .param_out = param.data(),
       .grad = grad.data(),
       .exp_avg = exp_avg.data(),
       .exp_avg_out = exp_avg.data(),
       .exp_avg_sq = exp_avg_sq.data(),
       .exp_avg_sq_out = exp_avg_sq.data()},
      param.size(), w);
}

void adam_local_momentum(TensorView<const float> param, TensorView<const float> grad,
                         TensorView<const float> exp_avg, TensorView<float> out,
                         const AdamSettings& s) {
  check_adam_settings(s);
  const Where w = where_of("adam_local_momentum", {arg("param", param), arg("grad", grad),
                                                   arg("exp_avg", exp_avg), arg("out", out)});
  run(kernel_of(detail::AdamOp::local_momentum, s, 0.0),
      {.param = param.data(), .grad = grad.data(), .exp_avg = exp_avg.data(), .out = out.data()},
      out.size(), w);
}

void adam_frozen_update(TensorView<float> param, TensorView<const float> momentum,
                        TensorView<float> exp_avg, TensorView<const float> exp_avg_sq,
                        const AdamSettings& s, double lr, std::uint64_t step,
                        std::uint64_t variance_steps) {
  check_adam_settings(s);
  check_lr("adam_frozen_update", lr);
  const Where w =
      where_of("adam_frozen_update", {arg("param", param), arg("momentum", momentum),
                                      arg("exp_avg", exp_avg), arg("exp_avg_sq", exp_avg_sq)});
  if (variance_steps == 0 || variance_steps > step) {
    bad("adam_frozen_update: variance_steps must be in [1, step = " + std::to_string(step) +
        "], not " + std::to_string(variance_steps) +
        " (the variance is frozen after at least one exact step)");
  }
  const double bias1 = 1.0 - std::pow(s.beta1, static_cast<double>(step));
  detail::AdamKernel k = kernel_of(detail::AdamOp::frozen_update, s, lr);
  k.step_size = static_cast<float>(lr / bias1);
  k.root2 = root2_of(s, variance_steps);
  k.limit = static_cast<float>(bound_of(s) * bias1);
  run(k,
      {.param = param.data(),
       .param_out = param.data(),
       .grad = momentum.data(),
       .exp_avg_out = exp_avg.data(),
       .exp_avg_sq = exp_avg_sq.data()},
      param.size(), w);
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

void adam_sync_momentum(TensorView<const float> param, TensorView<const float> anchor,
                        TensorView<const float> exp_avg_sq, TensorView<float> out,
                        const AdamSettings& s, double lr_sum, double decay,
                        std::uint64_t variance_steps) {
  check_sync("adam_sync_momentum", s, lr_sum, decay, variance_steps);
  const Where w = where_of("adam_sync_momentum", {arg("param", param), arg("anchor", anchor),
                                                  arg("exp_avg_sq", exp_avg_sq), arg("out", out)});
  detail::AdamKernel k = kernel_of(detail::AdamOp::sync_momentum, s, 0.0);
  k.shrink = static_cast<float>(decay);
  k.root2 = root2_of(s, variance_steps);
  k.scale = static_cast<float>(1.0 / lr_sum);
  run(k,
      {.param = param.data(),
       .exp_avg_sq = exp_avg_sq.data(),
       .anchor = anchor.data(),
       .out = out.data()},
      out.size(), w);
}

void adam_sync_update(TensorView<float> param, TensorView<float> anchor,
                      TensorView<const float> momentum, TensorView<float> exp_avg,
                      TensorView<const float> exp_avg_sq, const AdamSettings& s, double lr_sum,
                      double decay, std::uint64_t step, std::uint64_t variance_steps) {
  check_sync("adam_sync_update", s, lr_sum, decay, variance_steps);
  const Where w = where_of("adam_sync_update",
                           {arg("param", param), arg("anchor", anchor), arg("momentum", momentum),
                            arg("exp_avg", exp_avg), arg("exp_avg_sq", exp_avg_sq)});
  if (variance_steps > step) {
    bad("adam_sync_update: variance_steps must be at most step = " + std::to_string(step) +
        ", not " + std::to_string(variance_steps));
  }
  detail::AdamKernel k = kernel_of(detail::AdamOp::sync_update, s, 0.0);
  k.shrink = static_cast<float>(decay);
  k.step_size = static_cast<float>(lr_sum);
  k.root2 = root2_of(s, variance_steps);
  k.limit = static_cast<float>(bound_of(s));
  k.scale = static_cast<float>(1.0 - std::pow(s.beta1, static_cast<double>(step)));
  run(k,
      {.param_out = param.data(),
       .grad = momentum.data(),
       .exp_avg_out = exp_avg.data(),
       .exp_avg_sq = exp_avg_sq.data(),
       .anchor = anchor.data(),
       .anchor_out = anchor.data()},
      param.size(), w);
}

// The host spans: the same functions on host views.
void adam_step(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
               std::span<float> exp_avg_sq, const AdamSettings& s, double lr, std::uint64_t step,
               std::uint64_t variance_steps) {
  adam_step(TensorView<float>(param), TensorView<const float>(grad), TensorView<float>(exp_avg),
            TensorView<float>(exp_avg_sq), s, lr, step, variance_steps);
}

void adam_local_momentum(std::span<const float> param, std::span<const float> grad,
                         std::span<const float> exp_avg, std::span<float> out,
                         const AdamSettings& s) {
  adam_local_momentum(TensorView<const float>(param), TensorView<const float>(grad),
                      TensorView<const float>(exp_avg), TensorView<float>(out), s);
}

void adam_frozen_update(std::span<float> param, std::span<const float> momentum,
                        std::span<float> exp_avg, std::span<const float> exp_avg_sq,
                        const AdamSettings& s, double lr, std::uint64_t step,
                        std::uint64_t variance_steps) {
  adam_frozen_update(TensorView<float>(param), TensorView<const float>(momentum),
                     TensorView<float>(exp_avg), TensorView<const float>(exp_avg_sq), s, lr, step,
                     variance_steps);
}

void adam_sync_momentum(std::span<const float> param, std::span<const float> anchor,
                        std::span<const float> exp_avg_sq, std::span<float> out,
                        const AdamSettings& s, double lr_sum, double decay,
                        std::uint64_t variance_steps) {
  adam_sync_momentum(TensorView<const float>(param), TensorView<const float>(anchor),
                     TensorView<const float>(exp_avg_sq), TensorView<float>(out), s, lr_sum, decay,
                     variance_steps);
}

void adam_sync_update(std::span<float> param, std::span<float> anchor,
                      std::span<const float> momentum, std::span<float> exp_avg,
                      std::span<const float> exp_avg_sq, const AdamSettings& s, double lr_sum,
                      double decay, std::uint64_t step, std::uint64_t variance_steps) {
  adam_sync_update(TensorView<float>(param), TensorView<float>(anchor),
                   TensorView<const float>(momentum), TensorView<float>(exp_avg),
                   TensorView<const float>(exp_avg_sq), s, lr_sum, decay, step, variance_steps);
}

}  // namespace gcomp
