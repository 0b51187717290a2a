// The trainer's models: a stack of layers with the loss on top. mlp: 784-512-256-10 with ReLU;
// cnn: conv 5x5 (1->8) + ReLU + pool, conv 5x5 (8->16) + ReLU + pool, dense 784->128 + ReLU,
// dense 128->10. Deterministic for a given seed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers.hpp"

namespace gcomp::train {

class Model {
 public:
  // "mlp" or "cnn"; throws gcomp::Error(invalid_argument) for another name.
  Model(const std::string& kind, std::size_t rows, std::size_t cols, unsigned seed);

  // Forward and backward on a batch (one column per sample); fills every Param::grad with the
  // gradient of the mean loss and returns that loss.
  double train_step(const Matrix& x, const std::uint8_t* labels);
  // Logits of a batch (no caching needed by the caller).
  const Matrix& logits(const Matrix& x);

  std::vector<Param*> params();
  std::size_t parameter_count();
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Matrix> acts_;  // activations of the last forward: acts_[i] is layer i's output
  Matrix grad_a_, grad_b_;
};

}  // namespace gcomp::train
