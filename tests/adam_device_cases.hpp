// Adam's functions (gcomp/adam.hpp) on device views against the same calls on host memory, bit
// for bit: every function, Adam's L2 decay and AdamW's, the refresh's own variance count, and
// the in-place forms the contracts allow (out = grad, momentum = exp_avg). For any device
// memory: Memory has
//   TensorView<float> upload(const std::vector<float>&)  // a device copy, viewed on its stream
//   std::vector<float> download(TensorView<float>)       // after the stream's work
// Used by tests/adam_test.cpp (the stand-in backend) and tests/cuda/adam_test.cpp (a GPU).
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gcomp/adam.hpp"
#include "test_util.hpp"

namespace gcomp::test {

// param, grad (or momentum), exp_avg, exp_avg_sq, anchor (or out).
using AdamViews = std::array<TensorView<float>, 5>;

// Inputs of n elements that reach every branch: normal values, v 0 at every 7th element (not
// moved), v tiny at every 11th (the frozen step's bound holds it), the anchor near param.
inline std::array<std::vector<float>, 5> adam_inputs(std::size_t n) {
  std::array<std::vector<float>, 5> x = {normal(n, 11), normal(n, 12, 0.1f), normal(n, 13, 0.05f),
                                         normal(n, 14, 0.03f), normal(n, 15, 1e-3f)};
  for (std::size_t i = 0; i < n; ++i) {
    x[3][i] = x[3][i] * x[3][i];
    if (i % 7 == 0) x[3][i] = 0.0f;
    if (i % 11 == 0) x[3][i] = 1e-14f;
    x[4][i] += x[0][i];
  }
  return x;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  }
  return true;
}

template <class Memory>
void expect_adam_on_device_as_on_host(Memory& mem, std::size_t n) {
  const auto init = adam_inputs(n);
  const auto same = [&](const std::string& what, const std::function<void(const AdamViews&)>& f) {
    auto host = init;
    AdamViews hv, dv;
    for (std::size_t i = 0; i < 5; ++i) {
      hv[i] = TensorView<float>(std::span<float>(host[i]));
      dv[i] = mem.upload(init[i]);
    }
    f(hv);
    f(dv);
    for (std::size_t i = 0; i < 5; ++i) {
      EXPECT_TRUE(same_bits(mem.download(dv[i]), host[i]))
          << what << ", n = " << n << ": array " << i << " differs from the host's";
    }
  };
  const AdamSettings adamw{.weight_decay = 0.05, .decoupled = true};
  const AdamSettings adam_l2{.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.01};
  const double decay = (1 - 1e-3 * 0.05) * (1 - 2e-3 * 0.05);
  for (const AdamSettings& s : {adamw, adam_l2}) {
    const std::string kind = s.decoupled ? "AdamW: " : "Adam: ";
    same(kind + "adam_step", [&](const AdamViews& x) {
      adam_step(x[0], x[1], x[2], x[3], s, 1e-3, 1);
      adam_step(x[0], x[1], x[2], x[3], s, 1e-3, 2);
    });
    same(kind + "adam_step, a refresh",
         [&](const AdamViews& x) { adam_step(x[0], x[1], x[2], x[3], s, 1e-3, 9, 3); });
    same(kind + "adam_local_momentum",
         [&](const AdamViews& x) { adam_local_momentum(x[0], x[1], x[2], x[4], s); });
    same(kind + "adam_local_momentum in place",
         [&](const AdamViews& x) { adam_local_momentum(x[0], x[1], x[2], x[1], s); });
    same(kind + "adam_frozen_update",
         [&](const AdamViews& x) { adam_frozen_update(x[0], x[1], x[2], x[3], s, 1e-3, 12, 5); });
    same(kind + "adam_frozen_update in place",
         [&](const AdamViews& x) { adam_frozen_update(x[0], x[2], x[2], x[3], s, 1e-3, 12, 5); });
    same(kind + "adam_sync_momentum", [&](const AdamViews& x) {
      adam_sync_momentum(x[0], x[4], x[3], x[1], s, 3e-3, decay, 5);
    });
    same(kind + "adam_sync_update", [&](const AdamViews& x) {
      adam_sync_update(x[0], x[4], x[1], x[2], x[3], s, 3e-3, decay, 12, 5);
    });
    same(kind + "adam_sync_update in place", [&](const AdamViews& x) {
      adam_sync_update(x[0], x[4], x[2], x[2], x[3], s, 3e-3, decay, 12, 5);
    });
  }
}

}  // namespace gcomp::test
