// The layers (see layers.hpp).
#include "layers.hpp"

#include <cmath>
#include <limits>

namespace gcomp::train {

namespace {
void he_init(Param& p, std::size_t fan_in, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, std::sqrt(2.0f / static_cast<float>(fan_in)));
  for (float& v : p.value) v = d(rng);
}

// out[i] = sum over j of m(i, j), added in column order. Eigen's rowwise().sum() is not used:
// its vectorisation depends on the address of the destination (a std::vector's, aligned as the
// heap happens to be), so the rounding, and the trained model, would change from run to run.
void row_sums(const Matrix& m, float* out) {
  const Eigen::Index rows = m.rows();
  for (Eigen::Index i = 0; i < rows; ++i) out[i] = 0.0f;
  for (Eigen::Index j = 0; j < m.cols(); ++j) {
    const float* col = m.col(j).data();
    for (Eigen::Index i = 0; i < rows; ++i) out[i] += col[i];
  }
}
}  // namespace

Dense::Dense(std::size_t in, std::size_t out, std::mt19937& rng, const std::string& name)
    : in_(in), out_(out) {
  w_.name = name + ".weight";
  w_.value.resize(in * out);
  w_.grad.assign(in * out, 0.0f);
  w_.shape = {in, out};  // out x in, column-major
  he_init(w_, in, rng);
  b_.name = name + ".bias";
  b_.value.assign(out, 0.0f);
  b_.grad.assign(out, 0.0f);
  b_.shape = {out, 1};
}

void Dense::forward(const Matrix& x, Matrix& y) {
  x_ = x;
  const Eigen::Map<const Matrix> w(w_.value.data(), static_cast<Eigen::Index>(out_),
                                   static_cast<Eigen::Index>(in_));
  const Eigen::Map<const Eigen::VectorXf> b(b_.value.data(), static_cast<Eigen::Index>(out_));
  y.noalias() = w * x;
  y.colwise() += b;
}

void Dense::backward(const Matrix& dy, Matrix& dx) {
  const auto out = static_cast<Eigen::Index>(out_);
  const auto in = static_cast<Eigen::Index>(in_);
  Eigen::Map<Matrix> dw(w_.grad.data(), out, in);
  dw.noalias() = dy * x_.transpose();
  row_sums(dy, b_.grad.data());
  const Eigen::Map<const Matrix> w(w_.value.data(), out, in);
  dx.noalias() = w.transpose() * dy;
}

void Relu::forward(const Matrix& x, Matrix& y) {
  x_ = x;
  y = x.cwiseMax(0.0f);
}

void Relu::backward(const Matrix& dy, Matrix& dx) {
  dx = (x_.array() > 0.0f).select(dy, 0.0f);
}

Conv2d::Conv2d(std::size_t in_channels, std::size_t out_channels, std::size_t height,
               std::size_t width, std::size_t kernel, std::mt19937& rng, const std::string& name)
    : cin_(in_channels), cout_(out_channels), h_(height), w_size_(width), k_(kernel) {
  const std::size_t fan_in = cin_ * k_ * k_;
  w_.name = name + ".weight";
  w_.value.resize(cout_ * fan_in);
  w_.grad.assign(w_.value.size(), 0.0f);
  w_.shape = {fan_in, cout_};  // cout x (cin k k), column-major
  he_init(w_, fan_in, rng);
  b_.name = name + ".bias";
  b_.value.assign(cout_, 0.0f);
  b_.grad.assign(cout_, 0.0f);
  b_.shape = {cout_, 1};
}

template <typename F>
void Conv2d::for_each_tap(F&& f) const {
  // Every (column-matrix entry, input pixel) pair of the padded convolution: row (c, ki, kj) of
  // cols_, column (sample, output pixel), and the input pixel (channel c, shifted by the tap).
  const std::size_t hw = h_ * w_size_;
  const auto pad = static_cast<std::ptrdiff_t>(k_ / 2);
  for (std::size_t s = 0; s < batch_; ++s) {
    for (std::size_t c = 0; c < cin_; ++c) {
      for (std::size_t ki = 0; ki < k_; ++ki) {
        for (std::size_t kj = 0; kj < k_; ++kj) {
          const auto row = static_cast<Eigen::Index>((c * k_ + ki) * k_ + kj);
          for (std::size_t i = 0; i < h_; ++i) {
            const std::ptrdiff_t si = static_cast<std::ptrdiff_t>(i + ki) - pad;
            if (si < 0 || si >= static_cast<std::ptrdiff_t>(h_)) continue;
            for (std::size_t j = 0; j < w_size_; ++j) {
              const std::ptrdiff_t sj = static_cast<std::ptrdiff_t>(j + kj) - pad;
              if (sj < 0 || sj >= static_cast<std::ptrdiff_t>(w_size_)) continue;
              f(row, static_cast<Eigen::Index>(s * hw + i * w_size_ + j),
                static_cast<Eigen::Index>(c * hw + static_cast<std::size_t>(si) * w_size_ +
                                          static_cast<std::size_t>(sj)),
                static_cast<Eigen::Index>(s));
            }
          }
        }
      }
    }
  }
}

void Conv2d::im2col(const Matrix& x) {
  cols_.setZero(static_cast<Eigen::Index>(cin_ * k_ * k_),
                static_cast<Eigen::Index>(h_ * w_size_ * batch_));
  for_each_tap([&](Eigen::Index row, Eigen::Index col, Eigen::Index pixel, Eigen::Index sample) {
    cols_(row, col) = x(pixel, sample);
  });
}

void Conv2d::forward(const Matrix& x, Matrix& y) {
  batch_ = static_cast<std::size_t>(x.cols());
  im2col(x);
  const std::size_t hw = h_ * w_size_;
  const Eigen::Map<const Matrix> w(w_.value.data(), static_cast<Eigen::Index>(cout_),
                                   static_cast<Eigen::Index>(cin_ * k_ * k_));
  const Matrix yc = w * cols_;  // cout x (hw batch)
  y.resize(static_cast<Eigen::Index>(cout_ * hw), static_cast<Eigen::Index>(batch_));
  for (std::size_t s = 0; s < batch_; ++s) {
    for (std::size_t o = 0; o < cout_; ++o) {
      for (std::size_t p = 0; p < hw; ++p) {
        y(static_cast<Eigen::Index>(o * hw + p), static_cast<Eigen::Index>(s)) =
            yc(static_cast<Eigen::Index>(o), static_cast<Eigen::Index>(s * hw + p)) + b_.value[o];
      }
    }
  }
}

void Conv2d::backward(const Matrix& dy, Matrix& dx) {
  const std::size_t hw = h_ * w_size_;
  Matrix dyc(static_cast<Eigen::Index>(cout_), static_cast<Eigen::Index>(hw * batch_));
  for (std::size_t s = 0; s < batch_; ++s) {
    for (std::size_t o = 0; o < cout_; ++o) {
      for (std::size_t p = 0; p < hw; ++p) {
        dyc(static_cast<Eigen::Index>(o), static_cast<Eigen::Index>(s * hw + p)) =
            dy(static_cast<Eigen::Index>(o * hw + p), static_cast<Eigen::Index>(s));
      }
    }
  }
  const auto kk = static_cast<Eigen::Index>(cin_ * k_ * k_);
  Eigen::Map<Matrix> dw(w_.grad.data(), static_cast<Eigen::Index>(cout_), kk);
  dw.noalias() = dyc * cols_.transpose();
  row_sums(dyc, b_.grad.data());
  const Eigen::Map<const Matrix> w(w_.value.data(), static_cast<Eigen::Index>(cout_), kk);
  const Matrix dcols = w.transpose() * dyc;
  // col2im: every column entry goes back to the input pixel it was copied from.
  dx.setZero(static_cast<Eigen::Index>(cin_ * hw), static_cast<Eigen::Index>(batch_));
  for_each_tap([&](Eigen::Index row, Eigen::Index col, Eigen::Index pixel, Eigen::Index sample) {
    dx(pixel, sample) += dcols(row, col);
  });
}

void MaxPool2::forward(const Matrix& x, Matrix& y) {
  batch_ = static_cast<std::size_t>(x.cols());
  const std::size_t oh = h_ / 2, ow = w_ / 2;
  y.resize(static_cast<Eigen::Index>(c_ * oh * ow), static_cast<Eigen::Index>(batch_));
  argmax_.resize(c_ * oh * ow * batch_);
  for (std::size_t s = 0; s < batch_; ++s) {
    for (std::size_t c = 0; c < c_; ++c) {
      for (std::size_t i = 0; i < oh; ++i) {
        for (std::size_t j = 0; j < ow; ++j) {
          float best = -std::numeric_limits<float>::infinity();
          std::uint32_t at = 0;
          for (std::size_t di = 0; di < 2; ++di) {
            for (std::size_t dj = 0; dj < 2; ++dj) {
              const std::size_t r = c * h_ * w_ + (2 * i + di) * w_ + 2 * j + dj;
              const float v = x(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(s));
              if (v > best) {  // ties: the first in scan order
                best = v;
                at = static_cast<std::uint32_t>(r);
              }
            }
          }
          const std::size_t o = (c * oh + i) * ow + j;
          y(static_cast<Eigen::Index>(o), static_cast<Eigen::Index>(s)) = best;
          argmax_[s * c_ * oh * ow + o] = at;
        }
      }
    }
  }
}

void MaxPool2::backward(const Matrix& dy, Matrix& dx) {
  const std::size_t outs = c_ * (h_ / 2) * (w_ / 2);
  dx.setZero(static_cast<Eigen::Index>(c_ * h_ * w_), static_cast<Eigen::Index>(batch_));
  for (std::size_t s = 0; s < batch_; ++s) {
    for (std::size_t o = 0; o < outs; ++o) {
      dx(static_cast<Eigen::Index>(argmax_[s * outs + o]), static_cast<Eigen::Index>(s)) +=
          dy(static_cast<Eigen::Index>(o), static_cast<Eigen::Index>(s));
    }
  }
}

double softmax_cross_entropy(const Matrix& logits, const std::uint8_t* labels, Matrix& dlogits) {
  const Eigen::Index classes = logits.rows();
  const Eigen::Index batch = logits.cols();
  dlogits.resize(classes, batch);
  double loss = 0;
  for (Eigen::Index s = 0; s < batch; ++s) {
    const float mx = logits.col(s).maxCoeff();
    double sum = 0;
    for (Eigen::Index c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(logits(c, s) - mx));
    const double log_sum = std::log(sum);
    const auto y = static_cast<Eigen::Index>(labels[s]);
    loss -= static_cast<double>(logits(y, s) - mx) - log_sum;
    for (Eigen::Index c = 0; c < classes; ++c) {
      const double p = std::exp(static_cast<double>(logits(c, s) - mx) - log_sum);
      dlogits(c, s) = static_cast<float>((p - (c == y ? 1.0 : 0.0)) / static_cast<double>(batch));
    }
  }
  return loss / static_cast<double>(batch);
}

}  // namespace gcomp::train
