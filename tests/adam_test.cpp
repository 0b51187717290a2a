// Adam, AdamW and 1-bit Adam's two halves (gcomp/adam.hpp): the first step's closed form, the
// two weight decays, many steps against the formula in double, the compressed stage's halves
// against the exact step they split, and the errors; device views through the stand-in backend.
#include "gcomp/adam.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "adam_device_cases.hpp"
#include "gcomp/error.hpp"
#include "standin/standin_device.hpp"
#include "test_util.hpp"

namespace gcomp {
namespace {

// The ulp of x's magnitude in float, the smallest a float result near x can be off by.
double ulp(double x) { return std::ldexp(1.0, std::ilogb(std::max(std::fabs(x), 0x1p-126)) - 23); }

TEST(Adam, FirstStepMovesEveryElementByLrAgainstItsGradient) {
  // From zero moments, m / (1 - beta1) = g and v / (1 - beta2) = g^2: the step is
  // lr * g / (|g| + eps), whatever the betas.
  const std::size_t n = 1000;
  auto p = test::normal(n, 1);
  const auto p0 = p;
  const auto g = test::normal(n, 2);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  const AdamSettings s{.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-8};
  const double lr = 0.01;
  adam_step(p, g, m, v, s, lr, 1);
  for (std::size_t i = 0; i < n; ++i) {
    const double want = p0[i] - lr * g[i] / (std::fabs(g[i]) + 1e-8);
    // About ten float roundings of the step (each 2^-24 of it) and the final sum's.
    EXPECT_NEAR(p[i], want, 1e-5 * lr + ulp(want)) << i;
  }
}

TEST(Adam, AdamWShrinksTheParameterByLrTimesDecay) {
  // Zero gradient and moments: no update but AdamW's p *= 1 - lr wd (exactly that product).
  const std::size_t n = 257;
  auto p = test::normal(n, 3);
  const auto p0 = p;
  std::vector<float> g(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  const AdamSettings s{.weight_decay = 0.1, .decoupled = true};
  adam_step(p, g, m, v, s, 0.01, 1);
  const auto shrink = static_cast<float>(1.0 - 0.01 * 0.1);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(p[i], p0[i] * shrink) << i;
}

TEST(Adam, AdamsWeightDecayIsAGradientTerm) {
  // Adam's L2 decay is the step without decay on g + wd p, bit for bit.
  const std::size_t n = 999;
  const auto p0 = test::normal(n, 4);
  const auto g = test::normal(n, 5);
  auto p1 = p0, p2 = p0;
  std::vector<float> m1(n, 0.5f), v1(n, 0.25f), m2 = m1, v2 = v1, g2(n);
  const float wd = 0.05f;
  for (std::size_t i = 0; i < n; ++i) g2[i] = g[i] + wd * p0[i];
  adam_step(p1, g, m1, v1, {.weight_decay = 0.05}, 0.001, 7);
  adam_step(p2, g2, m2, v2, {}, 0.001, 7);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
}

TEST(Adam, ManyStepsFollowTheFormulaInDouble) {
  const std::size_t n = 300;
  const int steps = 50;
  auto p = test::normal(n, 6);
  std::vector<double> pd(p.begin(), p.end()), md(n, 0), vd(n, 0);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  const AdamSettings s{
      .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .decoupled = true};
  const double lr = 2e-3;
  for (int t = 1; t <= steps; ++t) {
    const auto g = test::normal(n, 100 + t);
    adam_step(p, g, m, v, s, lr, t);
    for (std::size_t i = 0; i < n; ++i) {
      pd[i] *= 1 - lr * s.weight_decay;
      md[i] = s.beta1 * md[i] + (1 - s.beta1) * g[i];
      vd[i] = s.beta2 * vd[i] + (1 - s.beta2) * g[i] * g[i];
      const double mh = md[i] / (1 - std::pow(s.beta1, t));
      const double vh = vd[i] / (1 - std::pow(s.beta2, t));
      pd[i] -= lr * mh / (std::sqrt(vh) + s.eps);
    }
  }
  // Each step's move is lr |m^| / sqrt(v^) <= lr (1 - beta1) / sqrt(1 - beta2) (Kingma & Ba,
  // section 2.1). In float it is off by the roundings of the moments' t terms and of the step's
  // own ten operations, each 2^-24 relative: (t + 10) 2^-24 of that bound. Every step also rounds
  // p once (an ulp of it).
  const double bound = lr * (1 - s.beta1) / std::sqrt(1 - s.beta2);
  double moves = 0;
  for (int t = 1; t <= steps; ++t) moves += bound * (t + 10) * 0x1p-24;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], pd[i], moves + steps * ulp(pd[i])) << i;
  }
}

TEST(Adam, TheCompressedStagesHalvesAreTheExactStepWithItsMomentum) {
  // adam_local_momentum then adam_frozen_update with the variance the exact step would have
  // made: the exact step, bit for bit (Adam's and AdamW's decay both).
  for (const bool decoupled : {false, true}) {
    const std::size_t n = 777;
    const auto g = test::normal(n, 8);
    const AdamSettings s{.weight_decay = 0.02, .decoupled = decoupled};
    const double lr = 0.003;
    const std::uint64_t t = 12;
    // The moments of 11 exact steps (an exact step's m and v belong together: its move stays
    // within the bound the frozen update keeps).
    auto p0 = test::normal(n, 7);
    std::vector<float> m0(n, 0.0f), v0(n, 0.0f);
    for (std::uint64_t k = 1; k < t; ++k) adam_step(p0, test::normal(n, 20 + k), m0, v0, s, lr, k);
    auto p1 = p0, m1 = m0, v1 = v0;
    adam_step(p1, g, m1, v1, s, lr, t);
    auto p2 = p0, m2 = m0, sent = g;
    adam_local_momentum(p0, sent, m0, sent, s);  // in place on the gradient
    EXPECT_EQ(sent, m1);
    adam_frozen_update(p2, sent, m2, v1, s, lr, t, t);
    EXPECT_EQ(p2, p1) << decoupled;
    EXPECT_EQ(m2, m1);
  }
}

TEST(Adam, TheFrozenVarianceKeepsItsBiasCorrection) {
  // One element, m = v = 1 after the update: the move is lr / (1 - beta1^t) / (1 / sqrt(1 -
  // beta2^tv) + eps), with tv the variance's updates, not t.
  std::vector<float> p{0.0f}, m{1.0f}, v{1.0f};
  const AdamSettings s{.eps = 1e-8};
  const double lr = 0.1;
  adam_frozen_update(p, m, m, v, s, lr, 20, 5);
  const double want =
      -lr / (1 - std::pow(0.9, 20)) / (1 / std::sqrt(1 - std::pow(0.999, 5)) + 1e-8);
  EXPECT_NEAR(p[0], want, 1e-6 * std::fabs(want));
}

TEST(Adam, TheFrozenStepKeepsExactAdamsBoundAndLeavesUnseenElements) {
  // v = 0 (no gradient in the warm-up): no move but AdamW's decay, whatever the momentum. A tiny
  // v: the move is lr * max(1, (1 - beta1) / sqrt(1 - beta2)), not m / sqrt(v).
  const AdamSettings s{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1,
                       .decoupled = true};
  const double lr = 0.01, bound = 0.1 / std::sqrt(0.001);
  std::vector<float> p{1.0f, 1.0f, 1.0f, 1.0f}, m{0.5f, -0.5f, 0.5f, 1e-9f};
  const std::vector<float> v{0.0f, 1e-20f, 1.0f, 1.0f};
  adam_frozen_update(p, m, m, v, s, lr, 100, 50);
  const auto shrink = static_cast<float>(1.0 - lr * 0.1);
  EXPECT_EQ(p[0], shrink);
  EXPECT_NEAR(p[1], shrink + lr * bound, 1e-6);
  // Within the bound: the formula (m^ = 0.5 / (1 - 0.9^100), v^ = 1 / (1 - 0.999^50)).
  const double within = lr * 0.5 / (1 - std::pow(0.9, 100)) /
                        (1 / std::sqrt(1 - std::pow(0.999, 50)) + 1e-8);
  EXPECT_NEAR(p[2], shrink - within, 1e-6);
  EXPECT_LT(std::fabs(p[3] - shrink), 1e-7);
}

// f() throws Error(invalid_argument) with `part` in its message.
template <class F>
void invalid(F f, const char* part) {
  try {
    f();
    ADD_FAILURE() << "no error for " << part;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Adam, BadInputIsAnErrorNamingIt) {
  std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4, 1.0f), d(4, 1.0f), short3(3, 1.0f);
  invalid([&] { adam_step(a, short3, c, d, {}, 0.1, 1); }, "differ in size");
  invalid([&] { adam_step(a, b, c, d, {}, 0.1, 0); }, "step counts from 1");
  invalid([&] { adam_step(a, b, c, d, {}, -1.0, 1); }, "lr must be");
  invalid([&] { adam_step(a, b, c, d, {.beta1 = 1.0}, 0.1, 1); }, "beta1");
  invalid([&] { adam_step(a, b, c, d, {.beta2 = -0.1}, 0.1, 1); }, "beta2");
  invalid([&] { adam_step(a, b, c, d, {.eps = 0}, 0.1, 1); }, "eps");
  invalid([&] { adam_step(a, b, c, d, {.weight_decay = NAN}, 0.1, 1); }, "weight_decay");
  invalid([&] { adam_local_momentum(a, b, c, short3, {}); }, "differ in size");
  invalid([&] { adam_frozen_update(a, b, c, d, {}, 0.1, 5, 0); }, "variance_steps");
  invalid([&] { adam_frozen_update(a, b, c, d, {}, 0.1, 5, 6); }, "variance_steps");
  EXPECT_EQ(a, std::vector<float>(4, 1.0f));  // nothing moved
}

TEST(Adam, ARefreshAfterCompressedStepsCorrectsEachMomentByItsOwnUpdates) {
  // step 9 with the variance's 4th update: m^ = m / (1 - beta1^9), v^ = v / (1 - beta2^4), and
  // m^ / (sqrt(v^) + eps) within exact Adam's bound max(1, (1 - beta1) / sqrt(1 - beta2)).
  const AdamSettings s{.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};
  const std::vector<float> m0{0.5f, -0.02f, 0.0f, 3.0f}, v0{0.01f, 0.0004f, 0.0f, 1e-6f};
  const std::vector<float> g{0.1f, -0.1f, 0.0f, 0.0f};
  std::vector<float> p(4, 1.0f), m = m0, v = v0;
  const double lr = 0.01, bound = std::max(1.0, 0.1 / std::sqrt(0.01));
  adam_step(p, g, m, v, s, lr, 9, 4);
  for (std::size_t i = 0; i < 4; ++i) {
    const double mi = 0.9 * m0[i] + 0.1 * g[i], vi = 0.99 * v0[i] + 0.01 * g[i] * g[i];
    EXPECT_NEAR(m[i], mi, 4 * ulp(mi)) << i;
    EXPECT_NEAR(v[i], vi, 4 * ulp(vi)) << i;
    const double q = mi / (1 - std::pow(0.9, 9)) / (std::sqrt(vi / (1 - std::pow(0.99, 4))) + 1e-8);
    const double want = 1.0 - lr * (vi == 0 ? 0.0 : std::clamp(q, -bound, bound));
    EXPECT_NEAR(p[i], want, 1e-5 * lr + ulp(want)) << i;
  }
  EXPECT_EQ(p[2], 1.0f);                      // v 0: not moved
  EXPECT_LT(p[3], 1.0f - 0.99 * lr * bound);  // the bound is what held it
  EXPECT_THROW(adam_step(p, g, m, v, s, lr, 3, 4), Error);
}

TEST(Adam, ASynchronizationOfOneRankGivesBackItsWayAndItsMomentum) {
  // One rank's way from the anchor, as a momentum and back: p again (within the roundings of a
  // product and a quotient), the anchor moved there, m the momentum times 1 - beta1^step; v 0
  // only decays.
  const std::size_t n = 500;
  const AdamSettings s{
      .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .decoupled = true};
  auto anchor = test::normal(n, 3);
  auto v = test::normal(n, 4);
  for (float& x : v) x = x * x * 1e-4f;
  v[7] = 0.0f;
  const double lr_sum = 4e-3, decay = (1 - 1e-3 * 0.1) * (1 - 3e-3 * 0.1);
  const double root2 = std::sqrt(1 - std::pow(0.999, 30));
  std::vector<float> p(n);
  const auto way = test::normal(n, 5);
  for (std::size_t i = 0; i < n; ++i) {
    // a way the steps could have taken: |m^ / (sqrt(v^) + eps)| <= 1 a step
    p[i] = static_cast<float>(decay * anchor[i] - lr_sum * std::tanh(way[i]));
  }
  p[7] = static_cast<float>(decay * anchor[7]);
  std::vector<float> u(n), m(n);
  adam_sync_momentum(p, anchor, v, u, s, lr_sum, decay, 30);
  for (std::size_t i = 0; i < n; ++i) {
    const double denom = std::sqrt(v[i]) / root2 + 1e-8;
    const double want = (decay * anchor[i] - p[i]) * denom / lr_sum;
    // decay anchor is rounded to float before the difference (and decay itself): two ulps of
    // the anchor in the way, the rest a few roundings of the result.
    EXPECT_NEAR(u[i], want, 2 * ulp(anchor[i]) * denom / lr_sum + 1e-5 * std::fabs(want)) << i;
  }
  const auto p0 = p;
  const float a7 = anchor[7];
  adam_sync_update(p, anchor, u, m, v, s, lr_sum, decay, 40, 30);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], p0[i], 1e-5 * lr_sum + 4 * ulp(p0[i])) << i;
    EXPECT_EQ(anchor[i], p[i]) << i;
    EXPECT_NEAR(m[i], u[i] * (1 - std::pow(0.9, 40)), 2 * ulp(u[i])) << i;
  }
  EXPECT_EQ(p[7], static_cast<float>(decay) * a7);  // v 0: only the decay
  EXPECT_THROW(adam_sync_momentum(p, anchor, v, u, s, 0.0, decay, 30), Error);
  EXPECT_THROW(adam_sync_momentum(p, anchor, v, u, s, lr_sum, 1.5, 30), Error);
  EXPECT_THROW(adam_sync_update(p, anchor, u, m, v, s, lr_sum, decay, 20, 30), Error);
}

// The stand-in's "device" memory for adam_device_cases.hpp, viewed on `stream`.
struct StandinMemory {
  explicit StandinMemory(void* s) : stream(s) {}
  ~StandinMemory() {
    for (void* p : blocks) dev.free(p);
  }
  TensorView<float> upload(const std::vector<float>& x) {
    void* p = dev.alloc(x.size() * sizeof(float));
    blocks.push_back(p);
    if (!x.empty()) std::memcpy(p, x.data(), x.size() * sizeof(float));
    return TensorView<float>::device(static_cast<float*>(p), x.size(), stream, &dev);
  }
  std::vector<float> download(TensorView<float> v) const { return {v.data(), v.data() + v.size()}; }
  test::StandinDevice dev;
  void* stream;
  std::vector<void*> blocks;
};

TEST(Adam, DeviceViewsRunTheBackendsKernelOnTheirStream) {
  // Every function on device views goes to the backend, once a call, on the views' stream, with
  // every array in its memory (the stand-in checks), and computes what the host computes.
  void* const stream = reinterpret_cast<void*>(0x5eed);
  StandinMemory mem(stream);
  test::expect_adam_on_device_as_on_host(mem, 37);
  // Per settings (2): two adam_steps and a refresh, two local momenta, two frozen updates, one
  // sync_momentum, two sync_updates.
  EXPECT_EQ(mem.dev.adams, (std::array<int, 5>{6, 4, 4, 2, 4}));
  EXPECT_EQ(mem.dev.streams, std::set<void*>{stream});
  test::expect_adam_on_device_as_on_host(mem, 0);  // nothing to run: no call
  EXPECT_EQ(mem.dev.adams, (std::array<int, 5>{6, 4, 4, 2, 4}));
}

TEST(Adam, OneCallTakesOneMemoryAndOneStream) {
  StandinMemory mem(nullptr);
  std::vector<float> host(8, 1.0f);
  const auto d = [&] { return mem.upload(host); };
  const TensorView<float> h(host);
  invalid([&] { adam_step(d(), h, d(), d(), {}, 0.1, 1); }, "grad is in host memory");
  invalid([&] { adam_local_momentum(h, h, h, d(), {}); }, "out is in device memory");
  TensorView<float> other = d();
  other =
      TensorView<float>::device(other.data(), other.size(), reinterpret_cast<void*>(7), &mem.dev);
  invalid([&] { adam_sync_update(d(), d(), d(), d(), other, {}, 0.1, 1.0, 2, 1); },
          "exp_avg_sq is on another device backend or stream");
  invalid([&] { adam_frozen_update(d(), d(), d(), mem.upload({1.0f}), {}, 0.1, 2, 1); },
          "differ in size");
  // A host pointer in a device view reaches the stand-in, which refuses it as CUDA would fault.
  const auto fake = TensorView<float>::device(host.data(), host.size(), nullptr, &mem.dev);
  EXPECT_THROW(adam_sync_momentum(d(), d(), fake, d(), {}, 0.1, 1.0, 1), Error);
  EXPECT_EQ(mem.dev.adams, (std::array<int, 5>{0, 0, 0, 1, 0}));
}

}  // namespace
}  // namespace gcomp
