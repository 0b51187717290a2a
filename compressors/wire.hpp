// The payload envelope shared by every codec (docs/wire-format.md):
//
//   offset  size    field
//   0       4       magic "GCMP"
//   4       1       format version (2; 1 is still read: docs/wire-format.md)
//   5       1       codec id (gcomp::CodecKind)
//   6       1       P = parameter bytes (fixed per codec and version)
//   7       1       S = number of sections (fixed per codec and version)
//   8       8       n = element count (u64)
//   16      P       codec parameters
//   16+P    8*S     byte length of each section (u64)
//   16+P+8S 4       CRC-32C of the bytes before it (the header is guarded; any flip shows)
//   ...             the sections, back to back; the payload ends exactly after the last one
//
// All integers little-endian. parse_payload() checks the envelope; each codec's validate checks
// its parameters and section lengths against n.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "gcomp/codec.hpp"

namespace gcomp::detail {

// Written by the encoders; read: kOldestWireVersion..kWireVersion. Version 2 packs the sparse
// codecs' indices as gaps (index_pack.hpp); everything else is as in version 1.
inline constexpr std::uint8_t kWireVersion = 2;
inline constexpr std::uint8_t kOldestWireVersion = 1;
inline constexpr std::size_t kFixedHeader = 16;
inline constexpr std::size_t kMaxSections = 3;

struct Section {
  const std::byte* data = nullptr;
  std::uint64_t size = 0;
};

struct Payload {
  CodecKind kind{};
  int version = 0;
  std::uint64_t n = 0;
  const std::byte* params = nullptr;
  std::size_t param_bytes = 0;
  std::array<Section, kMaxSections> sections{};
  std::size_t section_count = 0;
  std::size_t header_bytes = 0;
  std::size_t total_bytes = 0;
};

// Parameter bytes and section count of each codec in this format version.
struct Layout {
  std::size_t param_bytes;
  std::size_t sections;
};
// False for an unknown codec id.
bool layout_of(std::uint8_t codec_id, Layout* out) noexcept;

constexpr std::size_t header_bytes(const Layout& l) noexcept {
  return kFixedHeader + l.param_bytes + 8 * l.sections + 4;
}

// CRC-32C (Castagnoli, reflected, init and final xor 0xffffffff) of bytes[0..n).
std::uint32_t crc32c(const std::byte* bytes, std::size_t n) noexcept;

// Writes the envelope (params must be layout.param_bytes long) and returns where the first
// section starts. The caller has checked the capacity.
std::byte* write_header(std::byte* out, CodecKind kind, std::uint64_t n, const std::byte* params,
                        std::initializer_list<std::uint64_t> section_sizes);

// Checks magic, version, codec id, parameter and section counts, and that the section lengths
// add up to the payload's size exactly. Throws Error(bad_payload). Reads only the header bytes.
Payload parse_payload(std::span<const std::byte> bytes);

// The longest header of any codec (topk_chunked: 16 + 32 parameter bytes + 3 sections + CRC).
inline constexpr std::size_t kMaxHeaderBytes = 76;

// parse_payload for a payload of `size` bytes of which only the first min(size, kMaxHeaderBytes)
// are at `head` (a host copy of a device payload's start); section pointers point into head's
// address range, so subtract head to get offsets.
Payload parse_payload_head(const std::byte* head, std::size_t size);

[[noreturn]] void bad_payload(const std::string& why);

// ceil(a / b) without overflow for b > 0.
constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) noexcept {
  return a / b + (a % b != 0);
}

}  // namespace gcomp::detail
