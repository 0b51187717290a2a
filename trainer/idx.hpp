// Reading Fashion-MNIST (or MNIST) from IDX files, gzip-compressed or not: the magic number,
// the dimensions and the exact length are all checked, and every complaint names the file. The
// images come back as floats in [0, 1], one 784-float column per image.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gcomp::train {

struct Dataset {
  std::size_t rows = 0, cols = 0;  // 28 x 28
  std::size_t count = 0;
  std::vector<float> images;       // count columns of rows * cols floats
  std::vector<std::uint8_t> labels;
  std::size_t features() const { return rows * cols; }
};

// Reads an images file and its labels file; throws gcomp::Error(invalid_argument) naming the file
// and the problem.
Dataset read_idx(const std::string& images_path, const std::string& labels_path);

struct FashionMnist {
  Dataset train;
  Dataset test;
};

// Looks in dir for {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. When dir is the default
// and it is missing, the message says how to install Debian's dataset-fashion-mnist.
FashionMnist load_fashion_mnist(const std::string& dir);

inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

}  // namespace gcomp::train
