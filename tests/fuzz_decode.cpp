// libFuzzer target: any bytes through inspect() and decode_add() must give a result or a
// gcomp::Error, never a crash, a sanitizer report or a hang. Build with GCOMP_FUZZ=ON (clang).
#include <gcomp/codec.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(data), size);
  std::uint64_t n = 0;
  try {
    n = gcomp::inspect(payload).elements;
  } catch (const gcomp::Error&) {
    return 0;
  }
  if (n > (std::uint64_t{1} << 22)) return 0;  // valid but too large to decode here
  std::vector<float> acc(static_cast<std::size_t>(n), 0.0f);
  try {
    gcomp::decode_add(payload, acc, 1.0f);
  } catch (const gcomp::Error&) {
    __builtin_trap();  // inspect accepted it, so decode_add must too
  }
  return 0;
}
