// The trainer's pieces without MPI: every layer's gradient against central finite differences,
// and the IDX reader on good, corrupt and truncated files.
//
// Finite differences: with eps = 1e-2 the central difference's truncation error is about
// eps^2 |f'''| / 6 (~1e-5 here) and float rounding of a loss of order 10 adds ~1e-6 / (2 eps);
// the checks allow 2e-3 relative plus 2e-3 absolute, well above both and far below the size of
// any real mistake (a wrong index or a missing term changes gradients by O(1)).
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "gcomp/error.hpp"
#include "idx.hpp"
#include "layers.hpp"
#include "model.hpp"
#include "train.hpp"

namespace gcomp::train {
namespace {

constexpr float kEps = 1e-2f;

// f() with v at v + eps and at v - eps; v is restored.
struct Sides {
  double up, down;
};
template <typename F>
Sides nudge(float& v, float eps, F&& f) {
  const float keep = v;
  v = keep + eps;
  const double up = f();
  v = keep - eps;
  const double down = f();
  v = keep;
  return {up, down};
}

// L = sum(R .* layer(x)), in double.
double probe(Layer& l, const Matrix& x, const Matrix& r) {
  Matrix y;
  l.forward(x, y);
  double s = 0;
  for (Eigen::Index i = 0; i < y.size(); ++i) s += static_cast<double>(r.data()[i]) * y.data()[i];
  return s;
}

void expect_close(double numeric, double analytic, const std::string& what) {
  EXPECT_LE(std::fabs(numeric - analytic), 2e-3 * (std::fabs(numeric) + std::fabs(analytic)) + 2e-3)
      << what << ": numeric " << numeric << " analytic " << analytic;
}

// Checks dL/dx and dL/dparam of a layer against central differences.
void gradcheck(Layer& l, Matrix x, const std::string& name, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  Matrix y;
  l.forward(x, y);
  Matrix r(y.rows(), y.cols());
  for (Eigen::Index i = 0; i < r.size(); ++i) r.data()[i] = d(g);
  Matrix dx;
  l.forward(x, y);
  l.backward(r, dx);
  std::vector<std::vector<float>> grads;
  for (Param* p : l.params()) grads.push_back(p->grad);
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    const auto [up, down] = nudge(x.data()[i], kEps, [&] { return probe(l, x, r); });
    expect_close((up - down) / (2 * kEps), dx.data()[i], name + " dx[" + std::to_string(i) + "]");
  }
  const auto params = l.params();
  for (std::size_t k = 0; k < params.size(); ++k) {
    std::vector<float>& v = params[k]->value;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto [up, down] = nudge(v[i], kEps, [&] { return probe(l, x, r); });
      expect_close((up - down) / (2 * kEps), grads[k][i], params[k]->name + "[" + std::to_string(i) + "]");
    }
  }
}

Matrix random_matrix(Eigen::Index rows, Eigen::Index cols, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = d(g);
  return m;
}

TEST(Gradients, Dense) {
  std::mt19937 rng(1);
  Dense l(7, 5, rng, "fc");
  gradcheck(l, random_matrix(7, 3, 2), "dense", 3);
}

TEST(Gradients, Relu) {
  Relu l(9);
  Matrix x = random_matrix(9, 4, 4);
  for (Eigen::Index i = 0; i < x.size(); ++i) {  // away from the kink at 0
    float& v = x.data()[i];
    if (std::fabs(v) < 0.1f) v = v < 0 ? -0.1f - std::fabs(v) : 0.1f + v;
  }
  gradcheck(l, x, "relu", 5);
}

TEST(Gradients, Conv2d) {
  std::mt19937 rng(6);
  Conv2d l(2, 3, 6, 5, 3, rng, "conv");
  gradcheck(l, random_matrix(2 * 6 * 5, 2, 7), "conv", 8);
  Conv2d l5(1, 2, 4, 4, 5, rng, "conv5");  // the models' 5x5 kernel, padding 2
  gradcheck(l5, random_matrix(16, 2, 9), "conv5", 10);
}

TEST(Gradients, MaxPool) {
  MaxPool2 l(2, 4, 6);
  // Distinct values 0.1 apart, so no eps step changes which one is the maximum.
  Matrix x(2 * 4 * 6, 2);
  std::vector<int> order(static_cast<std::size_t>(x.size()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::shuffle(order.begin(), order.end(), std::mt19937(11));
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = 0.1f * static_cast<float>(order[static_cast<std::size_t>(i)]);
  gradcheck(l, x, "maxpool", 12);
}

TEST(Gradients, SoftmaxCrossEntropy) {
  Matrix z = random_matrix(10, 4, 13);
  const std::uint8_t labels[4] = {3, 0, 9, 3};
  Matrix dz, tmp;
  softmax_cross_entropy(z, labels, dz);
  for (Eigen::Index i = 0; i < z.size(); ++i) {
    const auto [up, down] =
        nudge(z.data()[i], kEps, [&] { return softmax_cross_entropy(z, labels, tmp); });
    expect_close((up - down) / (2 * kEps), dz.data()[i], "softmax dz[" + std::to_string(i) + "]");
  }
}

// The whole model: a sample of parameters of each tensor, through every layer. The CNN runs on
// 8x8 images: every layer is the same code as at 28x28, and a bias of conv1, which moves every
// pixel of its channel, then crosses few ReLU and max-pool switches within eps.
TEST(Gradients, WholeModels) {
  struct Case {
    const char* kind;
    std::size_t side;
    float eps;
  };
  for (const Case c : {Case{"mlp", 28, 1e-2f}, Case{"cnn", 8, 1e-3f}}) {
    Model m(c.kind, c.side, c.side, 14);
    const Matrix x =
        random_matrix(static_cast<Eigen::Index>(c.side * c.side), 2, 15).cwiseAbs() * 0.3f;
    const std::uint8_t labels[2] = {1, 7};
    m.train_step(x, labels);
    std::vector<std::vector<float>> grads;
    for (Param* p : m.params()) grads.push_back(p->grad);
    std::mt19937 g(16);
    const auto params = m.params();
    int checked = 0, tried = 0;
    for (std::size_t k = 0; k < params.size(); ++k) {
      std::vector<float>& v = params[k]->value;
      for (int trial = 0; trial < 6; ++trial) {
        const std::size_t i = g() % v.size();
        const auto [up, down] = nudge(v[i], c.eps, [&] { return m.train_step(x, labels); });
        const double mid = m.train_step(x, labels);
        ++tried;
        // A kink (ReLU or max-pool switch) at distance a < eps shifts the central difference
        // by delta (eps - a) / (2 eps) and the second difference by delta (eps - a), where delta
        // is the change of slope: skip points whose second difference, over 2 eps, could move
        // the central difference by more than a quarter of the absolute tolerance.
        const double second = (up - mid) - (mid - down);
        if (std::fabs(second) / (2 * c.eps) > 5e-4) continue;
        ++checked;
        expect_close((up - down) / (2 * c.eps), grads[k][i], std::string(c.kind) + " " + params[k]->name);
      }
    }
    EXPECT_GE(checked, tried / 2) << c.kind << ": too many points skipped as kinks";
  }
}

TEST(Config, WarnsOfFeedbackThatCannotContract) {
  Config c;
  c.codec = "qsgd:bits=4";  // s = 7, d = 512: min(512 / 49, sqrt(512) / 7) = 3.23
  const std::string w = feedback_warning(c);
  EXPECT_NE(w.find("3.23"), std::string::npos) << w;
  EXPECT_NE(w.find("--no-ef"), std::string::npos) << w;
  c.codec = "qsgd:bits=8";  // s = 127: 0.18
  EXPECT_EQ(feedback_warning(c), "");
  c.codec = "qsgd:bits=2,bucket=1";  // s = 1, d = 1: exactly 1, the edge counts
  EXPECT_NE(feedback_warning(c), "");
  c.codec = "qsgd:bits=4";
  c.error_feedback = false;
  EXPECT_EQ(feedback_warning(c), "");
  c.error_feedback = true;
  for (const char* spec : {"terngrad", "sign", "topk:ratio=0.01", "none", "dgc:ratio=0.01"}) {
    c.codec = spec;
    EXPECT_EQ(feedback_warning(c), "") << spec;
  }
}

TEST(Schedule, CosineDecaysToZeroAndConstantStays) {
  Config c;
  c.lr = 0.08;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, 100), 0.08);
  EXPECT_NEAR(learning_rate(c, 50, 100), 0.04, 1e-12);
  EXPECT_NEAR(learning_rate(c, 25, 100), 0.04 * (1 + std::sqrt(0.5)), 1e-12);
  EXPECT_LT(learning_rate(c, 99, 100), 0.08 * 3e-4);  // (1 + cos(0.99 pi)) / 2 = 2.5e-4
  c.schedule = "constant";
  EXPECT_DOUBLE_EQ(learning_rate(c, 99, 100), 0.08);
  c.schedule = "step";
  EXPECT_THROW(validate(c), Error);
}

// ---- the IDX reader ----

class Idx : public ::testing::Test {
 protected:
  // One directory per test and process: ctest runs the tests of this fixture in parallel.
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("gcomp_idx_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
       "_" + std::to_string(::getpid()));
  void SetUp() override {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  static std::vector<std::uint8_t> idx(std::uint32_t magic, std::vector<std::uint32_t> dims,
                                       std::size_t data_bytes, std::uint8_t fill = 7) {
    std::vector<std::uint8_t> b;
    const auto put = [&](std::uint32_t v) {
      for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(v >> s));
    };
    put(magic);
    for (auto d : dims) put(d);
    for (std::size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<std::uint8_t>((fill + i) % 10));
    return b;
  }
  std::string write(const std::string& name, const std::vector<std::uint8_t>& b, bool gz) {
    const std::string p = (dir / name).string();
    if (gz) {
      gzFile f = gzopen(p.c_str(), "wb");
      gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
      gzclose(f);
    } else {
      std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                               static_cast<std::streamsize>(b.size()));
    }
    return p;
  }
  static std::string error_of(const std::string& images, const std::string& labels) {
    try {
      read_idx(images, labels);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Status::invalid_argument);
      return e.what();
    }
    return "";
  }
};

TEST_F(Idx, ReadsGzipAndPlainFiles) {
  for (bool gz : {true, false}) {
    const auto images = write("img", idx(0x803, {5, 28, 28}, 5 * 784), gz);
    const auto labels = write("lab", idx(0x801, {5}, 5), gz);
    const Dataset d = read_idx(images, labels);
    EXPECT_EQ(d.count, 5u);
    EXPECT_EQ(d.rows, 28u);
    EXPECT_EQ(d.features(), 784u);
    EXPECT_FLOAT_EQ(d.images[0], 7 / 255.0f);
    EXPECT_FLOAT_EQ(d.images[1], 8 / 255.0f);
    EXPECT_EQ(d.labels[3], 0);
  }
}

TEST_F(Idx, RejectsCorruptAndTruncatedFiles) {
  const auto labels = write("lab", idx(0x801, {5}, 5), true);
  const auto good = idx(0x803, {5, 28, 28}, 5 * 784);
  // Wrong magic (a labels file where images belong).
  EXPECT_NE(error_of(labels, labels).find("magic"), std::string::npos);
  // Truncated data: one byte short, and a gzip stream cut in half.
  auto shortened = good;
  shortened.pop_back();
  auto msg = error_of(write("short", shortened, false), labels);
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("short"), std::string::npos) << msg;
  const auto gzpath = write("full.gz", good, true);
  const auto size = std::filesystem::file_size(gzpath);
  std::filesystem::resize_file(gzpath, size / 2);
  msg = error_of(gzpath, labels);
  EXPECT_NE(msg.find("full.gz"), std::string::npos) << msg;
  // Too long, a header shorter than itself, labels that do not match, a label out of range.
  auto longer = good;
  longer.push_back(1);
  EXPECT_NE(error_of(write("long", longer, false), labels).find("header says"), std::string::npos);
  EXPECT_NE(error_of(write("tiny", {0, 0, 8}, false), labels).find("header"), std::string::npos);
  EXPECT_NE(error_of(write("cut", {0, 0, 8, 3, 0, 0, 0}, false), labels).find("header"),
            std::string::npos);
  EXPECT_NE(error_of(write("img4", idx(0x803, {4, 28, 28}, 4 * 784), true), labels).find("labels for"),
            std::string::npos);
  auto bad_label = idx(0x801, {5}, 5);
  bad_label.back() = 12;
  EXPECT_NE(error_of(write("img", good, true), write("badlab", bad_label, true)).find("not a class"),
            std::string::npos);
  // Garbage that is not gzip and not IDX.
  EXPECT_NE(error_of(write("junk", std::vector<std::uint8_t>(100, 0x55), false), labels).find("magic"),
            std::string::npos);
  EXPECT_NE(error_of((dir / "missing").string(), labels).find("no such file"), std::string::npos);
}

TEST_F(Idx, MissingDirectoryNamesThePackage) {
  try {
    load_fashion_mnist(kDefaultDataDir + std::string("-does-not-exist"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such directory"), std::string::npos);
  }
  try {
    load_fashion_mnist(dir.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train-images-idx3-ubyte"), std::string::npos) << e.what();
  }
  if (!std::filesystem::exists(kDefaultDataDir)) {
    try {
      load_fashion_mnist(kDefaultDataDir);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("apt-get install dataset-fashion-mnist"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace gcomp::train
