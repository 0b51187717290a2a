// The models (see model.hpp).
#include "model.hpp"

#include "gcomp/error.hpp"

namespace gcomp::train {

Model::Model(const std::string& kind, std::size_t rows, std::size_t cols, unsigned seed)
    : kind_(kind) {
  std::mt19937 rng(seed);
  const std::size_t in = rows * cols;
  if (kind == "mlp") {
    layers_.push_back(std::make_unique<Dense>(in, 512, rng, "fc1"));
    layers_.push_back(std::make_unique<Relu>(512));
    layers_.push_back(std::make_unique<Dense>(512, 256, rng, "fc2"));
    layers_.push_back(std::make_unique<Relu>(256));
    layers_.push_back(std::make_unique<Dense>(256, 10, rng, "fc3"));
  } else if (kind == "cnn") {
    if (rows % 4 != 0 || cols % 4 != 0) {
      throw Error(Status::invalid_argument, "cnn needs image sides divisible by 4");
    }
    layers_.push_back(std::make_unique<Conv2d>(1, 8, rows, cols, 5, rng, "conv1"));
    layers_.push_back(std::make_unique<Relu>(8 * rows * cols));
    layers_.push_back(std::make_unique<MaxPool2>(8, rows, cols));
    layers_.push_back(std::make_unique<Conv2d>(8, 16, rows / 2, cols / 2, 5, rng, "conv2"));
    layers_.push_back(std::make_unique<Relu>(16 * rows * cols / 4));
    layers_.push_back(std::make_unique<MaxPool2>(16, rows / 2, cols / 2));
    layers_.push_back(std::make_unique<Dense>(16 * rows * cols / 16, 128, rng, "fc1"));
    layers_.push_back(std::make_unique<Relu>(128));
    layers_.push_back(std::make_unique<Dense>(128, 10, rng, "fc2"));
  } else {
    throw Error(Status::invalid_argument, "unknown model '" + kind + "' (mlp or cnn)");
  }
  acts_.resize(layers_.size());
}

const Matrix& Model::logits(const Matrix& x) {
  const Matrix* in = &x;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->forward(*in, acts_[i]);
    in = &acts_[i];
  }
  return *in;
}

double Model::train_step(const Matrix& x, const std::uint8_t* labels) {
  const Matrix& out = logits(x);
  const double loss = softmax_cross_entropy(out, labels, grad_a_);
  for (std::size_t i = layers_.size(); i-- > 0;) {
    layers_[i]->backward(grad_a_, grad_b_);
    std::swap(grad_a_, grad_b_);
  }
  return loss;
}

std::vector<Param*> Model::params() {
  std::vector<Param*> all;
  for (auto& l : layers_) {
    for (Param* p : l->params()) all.push_back(p);
  }
  return all;
}

std::size_t Model::parameter_count() {
  std::size_t n = 0;
  for (Param* p : params()) n += p->value.size();
  return n;
}

}  // namespace gcomp::train
