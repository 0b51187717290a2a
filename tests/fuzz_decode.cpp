// libFuzzer target: any bytes through inspect() and decode_add() must give a result or a
// gcomp::Error, never a crash, a sanitizer report or a hang; and whatever inspect() accepts,
// decode_add() decodes, and for a sparse codec sparse_entries() reads the same sum (what the
// sparse collectives read). Build with GCOMP_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gcomp/codec.hpp>
#include <vector>

#include "bytes.hpp"
#include "fuzz_payload.hpp"
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
  const gcomp::CodecKind kind = gcomp::inspect(payload).kind;
  if (kind != gcomp::CodecKind::topk && kind != gcomp::CodecKind::randomk &&
      kind != gcomp::CodecKind::threshold && kind != gcomp::CodecKind::topk_chunked) {
    return;
  }
  gcomp::SparseEntries e;
  try {
    gcomp::sparse_entries(payload, e);
  } catch (const gcomp::Error&) {
    __builtin_trap();  // a valid sparse payload's entries read
  }
  std::vector<float> sum(acc.size(), 0.0f);
  for (std::size_t j = 0; j < e.indices.size(); ++j) sum[e.indices[j]] += e.values[j];
  for (std::size_t i = 0; i < sum.size(); ++i) {
    // The same value added to zero once (indices are distinct), bit for bit.
    if (std::memcmp(&sum[i], &acc[i], sizeof(float)) != 0) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gcomp::fuzz::as_given_and_with_checksum(data, size, check);
  return 0;
}
