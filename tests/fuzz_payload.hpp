// What the payload fuzz targets share (fuzz_decode.cpp, fuzz_payload_header.cpp): each input is
// tried as it is and, so that mutations of the header reach the checks behind its checksum, once
// more with the checksum recomputed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bytes.hpp"
#include "wire.hpp"

namespace gcomp::fuzz {

template <class Check>
void as_given_and_with_checksum(const std::uint8_t* data, std::size_t size, Check&& check) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  check(std::span<const std::byte>(bytes, size));
  gcomp::detail::Layout l{};
  if (size >= gcomp::detail::kFixedHeader && gcomp::detail::layout_of(data[5], &l) &&
      size >= gcomp::detail::header_bytes(l)) {
    std::vector<std::byte> copy(bytes, bytes + size);
    const std::size_t at = gcomp::detail::header_bytes(l) - 4;
    gcomp::detail::store_le<std::uint32_t>(copy.data() + at,
                                           gcomp::detail::crc32c(copy.data(), at));
    check(std::span<const std::byte>(copy));
  }
}

}  // namespace gcomp::fuzz
