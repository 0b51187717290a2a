// libFuzzer target: the payload headers the collectives read before they decode (the
// envelope, and a sparse payload's entry count, which the agreement carries and sparse_reduce_
// scatter sizes its selection by): parse_payload(), parse_payload_head() on the first bytes, and
// sparse_nnz() give a result or a gcomp::Error, never a crash; both parses agree on what they
// accept, and the entry count of an accepted sparse payload is at most its element count.
// Each input is tried as it is and with its header checksum recomputed (as fuzz_decode does), so
// that mutations reach the checks behind it. Build with GCOMP_FUZZ=ON (clang).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bytes.hpp"
#include "fuzz_payload.hpp"
#include "codec_impl.hpp"
#include "gcomp/error.hpp"
#include "wire.hpp"

namespace {

void check(std::span<const std::byte> bytes) {
  using namespace gcomp::detail;
  bool whole = true, head = true;
  Payload p{};
  try {
    p = parse_payload(bytes);
  } catch (const gcomp::Error&) {
    whole = false;
  }
  try {
    std::vector<std::byte> first(bytes.begin(),
                                 bytes.begin() + std::min(bytes.size(), kMaxHeaderBytes));
    (void)parse_payload_head(first.data(), bytes.size());
  } catch (const gcomp::Error&) {
    head = false;
  }
  if (whole != head) __builtin_trap();  // the head alone decides what the whole accepts
  if (!whole) return;
  if (p.kind == gcomp::CodecKind::topk || p.kind == gcomp::CodecKind::randomk ||
      p.kind == gcomp::CodecKind::threshold) {
    try {
      if (sparse_nnz(p) > p.n) __builtin_trap();
    } catch (const gcomp::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gcomp::fuzz::as_given_and_with_checksum(data, size, check);
  return 0;
}
