// Reading payloads: decode_add on host and device memory, the sparse codecs' entries, inspect,
// and the collectives' reads of their own fresh payloads (no second validation).
#include <cmath>
#include <string>

#include "codec_impl.hpp"
#include "device_backend.hpp"
#include "parallel.hpp"
#include "gcomp/codec.hpp"
#include "nonfinite.hpp"
#include "views.hpp"

namespace gcomp {

void decode_add(std::span<const std::byte> payload, std::span<float> acc, float alpha) {
  if (payload.data() == nullptr && !payload.empty()) {
    throw Error(Status::invalid_argument, "payload is null");
  }
  if (!std::isfinite(alpha)) throw Error(Status::invalid_argument, "alpha is not finite");
  detail::check_environment();
  const detail::Payload p = detail::parse_payload(payload);
  const detail::CodecEntry* e = detail::find_codec(p.kind);
  if (e->validate_decode_add) {
    e->validate_layout(p);
  } else {
    e->validate(p);
  }
  if (p.n != acc.size()) {
    throw Error(Status::mismatch, "payload holds " + std::to_string(p.n) +
                                      " elements but the accumulator has " +
                                      std::to_string(acc.size()));
  }
  if (acc.data() == nullptr && !acc.empty())
    throw Error(Status::invalid_argument, "accumulator is null");
  if (e->validate_decode_add) {
    e->validate_decode_add(p, acc.data(), alpha);
  } else {
    e->decode_add(p, acc.data(), alpha);
  }
}

void decode_add(TensorView<const std::byte> payload, TensorView<float> acc, float alpha) {
  const detail::DeviceBackend* dev = detail::one_place("decode_add", payload, acc);
  if (!dev) return decode_add(payload.host(), acc.host(), alpha);
  if (payload.data() == nullptr && !payload.empty()) {
    throw Error(Status::invalid_argument, "payload is null");
  }
  if (acc.data() == nullptr && !acc.empty())
    throw Error(Status::invalid_argument, "accumulator is null");
  if (!std::isfinite(alpha)) throw Error(Status::invalid_argument, "alpha is not finite");
  dev->decode_add(payload.data(), payload.size(), acc.data(), acc.size(), alpha, acc.stream());
}

void sparse_entries(std::span<const std::byte> payload, SparseEntries& out) {
  detail::read_sparse_entries(detail::parse_payload(payload), out);
}

namespace detail {

void decode_add_own(std::span<const std::byte> payload, std::span<float> acc, float alpha) {
  const Payload p = parse_payload(payload);
  if (p.n != acc.size()) {
    throw Error(Status::mismatch, "payload holds " + std::to_string(p.n) +
                                      " elements but the accumulator has " +
                                      std::to_string(acc.size()));
  }
  find_codec(p.kind)->decode_add(p, acc.data(), alpha);
}

void sparse_entries_own(std::span<const std::byte> payload, SparseEntries& out) {
  read_sparse_entries(parse_payload(payload), out, true);
}

}  // namespace detail

PayloadInfo inspect(std::span<const std::byte> payload) {
  const detail::Payload p = detail::parse_payload(payload);
  const detail::CodecEntry* e = detail::find_codec(p.kind);
  e->validate(p);
  PayloadInfo info;
  info.kind = p.kind;
  info.version = p.version;
  info.elements = p.n;
  info.params = e->describe(p);
  for (std::size_t i = 0; i < p.section_count; ++i) info.sections.push_back(p.sections[i].size);
  info.header_bytes = p.header_bytes;
  info.total_bytes = p.total_bytes;
  return info;
}

}  // namespace gcomp
