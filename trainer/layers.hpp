// The layers of the trainer's models, on Eigen: a batch is a matrix with one column per sample
// (features down the rows, an image as channels x height x width). Each layer caches what its
// backward pass needs; backward() writes the parameter gradients (it does not accumulate) and
// returns the gradient with respect to its input.
#pragma once

#include <Eigen/Dense>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gcomp/communicator.hpp"

namespace gcomp::train {

using Matrix = Eigen::MatrixXf;

// A trainable tensor and its gradient, flat (the collectives see it as one float span), and
// its shape as the row-major matrix its flat memory is (for the low-rank codecs): a weight
// stored column-major out x in is the row-major in x out; a bias n x 1 (unset: 1-D).
struct Param {
  std::string name;
  std::vector<float> value;
  std::vector<float> grad;
  MatrixShape shape;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual void forward(const Matrix& x, Matrix& y) = 0;
  virtual void backward(const Matrix& dy, Matrix& dx) = 0;
  virtual std::vector<Param*> params() { return {}; }
  virtual std::size_t out_features() const = 0;
};

// y = W x + b; W is out x in, He-initialised.
class Dense final : public Layer {
 public:
  Dense(std::size_t in, std::size_t out, std::mt19937& rng, const std::string& name);
  void forward(const Matrix& x, Matrix& y) override;
  void backward(const Matrix& dy, Matrix& dx) override;
  std::vector<Param*> params() override { return {&w_, &b_}; }
  std::size_t out_features() const override { return out_; }

 private:
  std::size_t in_, out_;
  Param w_, b_;
  Matrix x_;
};

class Relu final : public Layer {
 public:
  explicit Relu(std::size_t features) : features_(features) {}
  void forward(const Matrix& x, Matrix& y) override;
  void backward(const Matrix& dy, Matrix& dx) override;
  std::size_t out_features() const override { return features_; }

 private:
  std::size_t features_;
  Matrix x_;
};

// 2-D convolution, stride 1, zero padding k/2 ("same"), by im2col and one matrix product.
class Conv2d final : public Layer {
 public:
  Conv2d(std::size_t in_channels, std::size_t out_channels, std::size_t height, std::size_t width,
         std::size_t kernel, std::mt19937& rng, const std::string& name);
  void forward(const Matrix& x, Matrix& y) override;
  void backward(const Matrix& dy, Matrix& dx) override;
  std::vector<Param*> params() override { return {&w_, &b_}; }
  std::size_t out_features() const override { return cout_ * h_ * w_size_; }

 private:
  template <typename F>
  void for_each_tap(F&& f) const;
  void im2col(const Matrix& x);
  std::size_t cin_, cout_, h_, w_size_, k_;
  Param w_, b_;    // w: cout x (cin k k)
  Matrix cols_;    // (cin k k) x (h w batch)
  std::size_t batch_ = 0;
};

// 2x2 max pooling, stride 2 (height and width must be even).
class MaxPool2 final : public Layer {
 public:
  MaxPool2(std::size_t channels, std::size_t height, std::size_t width)
      : c_(channels), h_(height), w_(width) {}
  void forward(const Matrix& x, Matrix& y) override;
  void backward(const Matrix& dy, Matrix& dx) override;
  std::size_t out_features() const override { return c_ * (h_ / 2) * (w_ / 2); }

 private:
  std::size_t c_, h_, w_;
  std::vector<std::uint32_t> argmax_;  // per output element, the input row it came from
  std::size_t batch_ = 0;
};

// Mean softmax cross-entropy of logits (classes x batch) against labels; dlogits for backward.
double softmax_cross_entropy(const Matrix& logits, const std::uint8_t* labels, Matrix& dlogits);

}  // namespace gcomp::train
