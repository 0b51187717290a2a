// What measuring a codec's speeds takes (calibration.hpp).
#include "calibration.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace gcomp {

namespace detail {
// A sum of four uniforms from a splitmix64 stream.
std::vector<float> calibration_input(std::size_t n) {
  std::vector<float> x(n);
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (float& f : x) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float sum = static_cast<float>(z & 0xffff) + static_cast<float>((z >> 16) & 0xffff) +
                      static_cast<float>((z >> 32) & 0xffff) + static_cast<float>(z >> 48);
    f = (sum / 65536.0f - 2.0f) * 1.7320508f;
  }
  return x;
}

std::size_t calibration_size(std::size_t n) {
  return std::clamp<std::size_t>(n, std::size_t{1} << 16, std::size_t{1} << 24);
}

ComputeModel time_per_unit(double units, const std::function<void()>& encode,
                           const std::function<void()>& decode) {
  const auto timed = [](const std::function<void()>& f) {
    return [&f] {
      const auto start = std::chrono::steady_clock::now();
      f();
      return seconds_since(start);
    };
  };
  ComputeModel c;
  c.encode = mean_seconds(timed(encode), 0.02, 2) / units;
  c.decode = mean_seconds(timed(decode), 0.01, 2) / units;
  return c;
}
}  // namespace detail

}  // namespace gcomp
