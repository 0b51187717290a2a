// The payload envelope (see wire.hpp and docs/wire-format.md).
#include "wire.hpp"

#include <string>

#include "bytes.hpp"
#include "codec_impl.hpp"
#include "gcomp/error.hpp"

namespace gcomp::detail {

namespace {
constexpr std::byte kMagic[4] = {std::byte{'G'}, std::byte{'C'}, std::byte{'M'}, std::byte{'P'}};
}

std::uint32_t crc32c(const std::byte* bytes, std::size_t n) noexcept {
  std::uint32_t crc = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= static_cast<std::uint32_t>(bytes[i]);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

bool layout_of(std::uint8_t codec_id, Layout* out) noexcept {
  const CodecEntry* e = find_codec(static_cast<CodecKind>(codec_id));
  if (e == nullptr || e->layout.sections == 0) return false;  // unknown, or no payload
  *out = e->layout;
  return true;
}

void bad_payload(const std::string& why) {
  throw Error(Status::bad_payload, "bad payload: " + why);
}

std::byte* write_header(std::byte* out, CodecKind kind, std::uint64_t n, const std::byte* params,
                        std::initializer_list<std::uint64_t> section_sizes) {
  Layout l{};
  layout_of(static_cast<std::uint8_t>(kind), &l);
  for (int i = 0; i < 4; ++i) out[i] = kMagic[i];
  out[4] = std::byte{kWireVersion};
  out[5] = static_cast<std::byte>(kind);
  out[6] = static_cast<std::byte>(l.param_bytes);
  out[7] = static_cast<std::byte>(l.sections);
  store_le<std::uint64_t>(out + 8, n);
  std::byte* p = out + kFixedHeader;
  for (std::size_t i = 0; i < l.param_bytes; ++i) p[i] = params[i];
  p += l.param_bytes;
  for (std::uint64_t s : section_sizes) {
    store_le<std::uint64_t>(p, s);
    p += 8;
  }
  store_le<std::uint32_t>(p, crc32c(out, static_cast<std::size_t>(p - out)));
  return p + 4;
}

Payload parse_payload(std::span<const std::byte> bytes) {
  return parse_payload_head(bytes.data(), bytes.size());
}

Payload parse_payload_head(const std::byte* head, std::size_t size) {
  if (size < kFixedHeader) {
    bad_payload(std::to_string(size) + " bytes is shorter than the " +
                std::to_string(kFixedHeader) + "-byte header");
  }
  const std::byte* b = head;
  for (int i = 0; i < 4; ++i) {
    if (b[i] != kMagic[i]) bad_payload("no 'GCMP' magic at the start");
  }
  Payload p;
  p.version = static_cast<int>(b[4]);
  if (p.version < kOldestWireVersion || p.version > kWireVersion) {
    bad_payload("format version " + std::to_string(p.version) +
                " is not supported (this build reads versions " +
                std::to_string(kOldestWireVersion) + " to " + std::to_string(kWireVersion) + ")");
  }
  const auto id = static_cast<std::uint8_t>(b[5]);
  Layout l{};
  if (!layout_of(id, &l)) bad_payload("unknown codec id " + std::to_string(id));
  p.kind = static_cast<CodecKind>(id);
  const auto pb = static_cast<std::size_t>(b[6]);
  const auto sc = static_cast<std::size_t>(b[7]);
  if (pb != l.param_bytes || sc != l.sections) {
    bad_payload(std::string(codec_name(p.kind)) + " payload declares " + std::to_string(pb) +
                " parameter bytes and " + std::to_string(sc) + " sections, expected " +
                std::to_string(l.param_bytes) + " and " + std::to_string(l.sections));
  }
  p.n = load_le<std::uint64_t>(b + 8);
  p.params = b + kFixedHeader;
  p.param_bytes = pb;
  p.section_count = sc;
  p.header_bytes = header_bytes(l);
  if (size < p.header_bytes) {
    bad_payload(std::to_string(size) + " bytes is shorter than the " +
                std::to_string(p.header_bytes) + "-byte " + codec_name(p.kind) + " header");
  }
  const std::size_t crc_at = p.header_bytes - 4;
  if (load_le<std::uint32_t>(b + crc_at) != crc32c(b, crc_at)) {
    bad_payload("header checksum mismatch (corrupt header)");
  }
  std::uint64_t remaining = size - p.header_bytes;
  const std::byte* table = b + kFixedHeader + pb;
  const std::byte* data = b + p.header_bytes;
  for (std::size_t i = 0; i < sc; ++i) {
    const auto len = load_le<std::uint64_t>(table + 8 * i);
    if (len > remaining) {
      bad_payload("section " + std::to_string(i) + " claims " + std::to_string(len) +
                  " bytes but only " + std::to_string(remaining) + " remain (truncated?)");
    }
    p.sections[i] = {data, len};
    data += len;
    remaining -= len;
  }
  if (remaining != 0) {
    bad_payload(std::to_string(remaining) + " trailing bytes after the last section");
  }
  p.total_bytes = size;
  return p;
}

}  // namespace gcomp::detail
