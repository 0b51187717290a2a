// Helpers shared by the unit tests: inputs with a fixed seed, and encode/decode shorthands.
#pragma once

#include <cstdint>
#include <gcomp/codec.hpp>
#include <random>
#include <string>
#include <vector>

namespace gcomp::test {

// n standard-normal floats from a fixed seed.
inline std::vector<float> normal(std::size_t n, std::uint32_t seed = 1, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(g);
  return x;
}

inline std::vector<float> decode(const std::vector<std::byte>& p, std::size_t n) {
  std::vector<float> y(n, 0.0f);
  decode_add(p, y, 1.0f);
  return y;
}

// The codec specs the tests sweep: every codec, and the variants that take other code paths
// (fp16 values, buckets that are not a multiple of 16, odd bit widths; top-k per chunk with
// codes of 1, 2, 3 and 8 bits, with fp16 and fp32 values, chunks whose indices pack as gaps or
// as fixed widths, every element kept).
inline const std::vector<std::string>& all_specs() {
  static const std::vector<std::string> s = {"none",
                                             "fp16",
                                             "bf16",
                                             "topk:ratio=0.01",
                                             "topk:k=7,values=fp16",
                                             "randomk:ratio=0.05",
                                             "randomk:ratio=0.1,scale=true",
                                             "threshold:tau=1.5",
                                             "threshold:tau=1,values=fp16",
                                             "qsgd",
                                             "qsgd:bits=8",
                                             "qsgd:bits=2,bucket=64",
                                             "qsgd:bits=3,bucket=100",
                                             "qsgd:bits=7,bucket=1",
                                             "terngrad",
                                             "terngrad:clip=0",
                                             "sign",
                                             "topk:ratio=0.01,chunk=4096,bits=2",
                                             "topk:k=3,chunk=100,bits=3",
                                             "topk:k=2,chunk=7,bits=8",
                                             "topk:ratio=0.05,chunk=64,values=fp16",
                                             "topk:ratio=0.3,chunk=10",
                                             "topk:ratio=1,chunk=16,bits=1"};
  return s;
}

inline std::string name_of(const std::string& spec) {
  std::string s;
  for (char c : spec) s += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return s;
}

}  // namespace gcomp::test
