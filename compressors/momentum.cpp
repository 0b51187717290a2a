// DGC's momentum correction (include/gcomp/momentum.hpp).
#include "gcomp/momentum.hpp"

#include <algorithm>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp {

namespace {
void same_size(std::size_t a, std::size_t b, const char* what) {
  if (a != b) {
    throw Error(Status::invalid_argument, std::string(what) + ": velocity of " +
                                              std::to_string(a) + " elements, the other of " +
                                              std::to_string(b));
  }
}
}  // namespace

void momentum_correct(std::span<float> velocity, std::span<float> grad, float momentum) {
  same_size(velocity.size(), grad.size(), "momentum_correct");
  if (!(momentum >= 0.0f && momentum < 1.0f)) {
    throw Error(Status::invalid_argument,
                "momentum_correct: momentum must be in [0, 1), not " + std::to_string(momentum));
  }
  float* u = velocity.data();
  float* g = grad.data();
  for (std::size_t i = 0; i < velocity.size(); ++i) {
    const float v = momentum * u[i] + g[i];
    u[i] = v;
    g[i] = v;
  }
}

bool mask_momentum(std::span<float> velocity, std::span<const float> residual) {
  same_size(velocity.size(), residual.size(), "mask_momentum");
  if (std::all_of(residual.begin(), residual.end(), [](float r) { return r == 0.0f; })) {
    return false;
  }
  for (std::size_t i = 0; i < velocity.size(); ++i) {
    if (residual[i] == 0.0f) velocity[i] = 0.0f;
  }
  return true;
}

}  // namespace gcomp
