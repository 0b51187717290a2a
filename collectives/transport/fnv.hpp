// FNV-1a over text and integers (each as its 8 little-endian bytes), built up without strings:
// the collectives key their per-call state with it (the agreement's signature, auto's groups,
// the calibration cache).
#pragma once

#include <cstdint>
#include <string_view>

namespace gcomp::detail {

struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ull;
  Fnv& add(std::string_view s) {
    for (char c : s) byte(static_cast<unsigned char>(c));
    return *this;
  }
  Fnv& add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(v >> (8 * i)));
    return *this;
  }
  void byte(unsigned char c) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
};

}  // namespace gcomp::detail
