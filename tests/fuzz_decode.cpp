// libFuzzer target: any bytes through inspect() and decode_add() must give a result or a
// gcomp::Error, never a crash, a sanitizer report or a hang; and whatever inspect() accepts,
// decode_add() decodes. Build with GCOMP_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <gcomp/codec.hpp>
#include <vector>

#include "bytes.hpp"
#include "wire.hpp"

namespace {

void check(std::span<const std::byte> payload) {
  std::uint64_t n = 0;
  try {
    n = gcomp::inspect(payload).elements;
  } catch (const gcomp::Error&) {
    return;
  }
  if (n > (std::uint64_t{1} << 22)) return;  // valid but too large to decode here
  std::vector<float> acc(static_cast<std::size_t>(n), 0.0f);
  try {
    gcomp::decode_add(payload, acc, 1.0f);
  } catch (const gcomp::Error&) {
    __builtin_trap();  // inspect accepted it, so decode_add must too
  }
}

}  // namespace

// Each input is tried as it is and, so that mutations of the header reach the checks behind the
// header checksum, once more with the checksum recomputed.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  check({bytes, size});
  gcomp::detail::Layout l{};
  if (size >= gcomp::detail::kFixedHeader && gcomp::detail::layout_of(data[5], &l) &&
      size >= gcomp::detail::header_bytes(l)) {
    std::vector<std::byte> copy(bytes, bytes + size);
    const std::size_t at = gcomp::detail::header_bytes(l) - 4;
    gcomp::detail::store_le<std::uint32_t>(copy.data() + at,
                                           gcomp::detail::crc32c(copy.data(), at));
    check(copy);
  }
  return 0;
}
