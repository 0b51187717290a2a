// IDX reader (see idx.hpp). The format: a 4-byte big-endian magic 0x000008DD (0x08 = unsigned
// byte data, DD = number of dimensions), then DD big-endian u32 sizes, then the data.
#include "idx.hpp"

#include <zlib.h>

#include <filesystem>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp::train {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(Status::invalid_argument, path + ": " + why);
}

// The whole (decompressed) file. zlib reads plain files too.
std::vector<std::uint8_t> slurp(const std::string& path) {
  if (!std::filesystem::exists(path)) fail(path, "no such file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail(path, "cannot open");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  while (true) {
    const int got = gzread(f, buf, sizeof buf);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      const std::string why = std::string("corrupt gzip data (") + (msg ? msg : "?") + ")";
      gzclose(f);
      fail(path, why);
    }
    if (got == 0) break;
    out.insert(out.end(), buf, buf + got);
    if (out.size() > (std::size_t{1} << 30)) {
      gzclose(f);
      fail(path, "larger than 1 GiB: not an IDX file of this data set");
    }
  }
  // A truncated gzip stream reads as EOF without an error on some zlib versions: check it ended.
  int code = 0;
  gzerror(f, &code);
  const int eof = gzeof(f);
  gzclose(f);
  if (code != Z_OK && code != Z_STREAM_END) fail(path, "corrupt or truncated gzip data");
  if (!eof) fail(path, "could not read to the end");
  return out;
}

std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) |
         (std::uint32_t{b[at + 2]} << 8) | std::uint32_t{b[at + 3]};
}

// Checks the header and returns the dimensions.
std::vector<std::uint32_t> header(const std::string& path, const std::vector<std::uint8_t>& b,
                                  std::uint32_t dims) {
  if (b.size() < 4) fail(path, "shorter than its IDX header");
  const std::uint32_t magic = be32(b, 0);
  const std::uint32_t want = 0x00000800u | dims;
  if (magic != want) {
    char text[64];
    std::snprintf(text, sizeof text, "magic 0x%08x, expected 0x%08x", magic, want);
    fail(path, std::string(text) + " (not an IDX file of unsigned bytes with " +
                   std::to_string(dims) + " dimensions)");
  }
  if (b.size() < 4 + 4 * dims) fail(path, "shorter than its IDX header");
  std::vector<std::uint32_t> d(dims);
  std::uint64_t total = 1;
  for (std::uint32_t i = 0; i < dims; ++i) {
    d[i] = be32(b, 4 + 4 * i);
    total *= d[i];
  }
  const std::uint64_t have = b.size() - (4 + 4 * dims);
  if (have != total) {
    fail(path, "holds " + std::to_string(have) + " data bytes, its header says " +
                   std::to_string(total) + (have < total ? " (truncated)" : ""));
  }
  return d;
}

}  // namespace

Dataset read_idx(const std::string& images_path, const std::string& labels_path) {
  const auto ib = slurp(images_path);
  const auto d = header(images_path, ib, 3);
  const auto lb = slurp(labels_path);
  const auto l = header(labels_path, lb, 1);
  if (d[0] != l[0]) {
    fail(labels_path, std::to_string(l[0]) + " labels for " + std::to_string(d[0]) + " images in " +
                          images_path);
  }
  if (d[1] == 0 || d[2] == 0 || d[1] > 1024 || d[2] > 1024) {
    fail(images_path, "image size " + std::to_string(d[1]) + "x" + std::to_string(d[2]));
  }
  Dataset ds;
  ds.count = d[0];
  ds.rows = d[1];
  ds.cols = d[2];
  ds.images.resize(ds.count * ds.features());
  for (std::size_t i = 0; i < ds.images.size(); ++i) ds.images[i] = ib[16 + i] / 255.0f;
  ds.labels.assign(lb.begin() + 8, lb.end());
  for (std::size_t i = 0; i < ds.count; ++i) {
    if (ds.labels[i] > 9) fail(labels_path, "label " + std::to_string(ds.labels[i]) + " of item " +
                                                std::to_string(i) + " is not a class 0-9");
  }
  return ds;
}

FashionMnist load_fashion_mnist(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) {
    std::string why = dir + ": no such directory";
    if (dir == kDefaultDataDir) {
      why += " (Fashion-MNIST comes from Debian's package: apt-get install dataset-fashion-mnist;"
             " or pass --data DIR)";
    }
    throw Error(Status::invalid_argument, why);
  }
  const auto find = [&](const std::string& stem) {
    for (const char* ext : {".gz", ""}) {
      const std::string p = dir + "/" + stem + ext;
      if (std::filesystem::exists(p)) return p;
    }
    throw Error(Status::invalid_argument, dir + ": no " + stem + "[.gz] (expected the four "
                                          "Fashion-MNIST IDX files)");
  };
  FashionMnist f;
  // One at a time, so a missing file is named in this order whatever the compiler's order of
  // evaluating arguments.
  const std::string train_images = find("train-images-idx3-ubyte");
  const std::string train_labels = find("train-labels-idx1-ubyte");
  const std::string test_images = find("t10k-images-idx3-ubyte");
  const std::string test_labels = find("t10k-labels-idx1-ubyte");
  f.train = read_idx(train_images, train_labels);
  f.test = read_idx(test_images, test_labels);
  if (f.train.rows != f.test.rows || f.train.cols != f.test.cols) {
    throw Error(Status::invalid_argument, dir + ": train and test images differ in size");
  }
  return f;
}

}  // namespace gcomp::train
