// The registry of codecs: each family's entry (codec_impl.hpp), found by kind or name, and the
// names and catalog the public API gives.
#include <string>
#include <vector>

#include "codec_impl.hpp"
#include "gcomp/codec.hpp"

namespace gcomp {

namespace detail {

// Each codec's entry, defined in its family's file.
const CodecEntry& cast_none_entry();
const CodecEntry& cast_fp16_entry();
const CodecEntry& cast_bf16_entry();
const CodecEntry& topk_entry();
const CodecEntry& randomk_entry();
const CodecEntry& threshold_entry();
const CodecEntry& qsgd_entry();
const CodecEntry& terngrad_entry();
const CodecEntry& sign_entry();
const CodecEntry& powersgd_entry();
const CodecEntry& topk_chunked_entry();

const std::vector<const CodecEntry*>& codec_entries() {
  static const std::vector<const CodecEntry*> r = {
      &cast_none_entry(), &cast_fp16_entry(), &cast_bf16_entry(), &topk_entry(), &randomk_entry(),
      &threshold_entry(), &qsgd_entry(),      &terngrad_entry(),  &sign_entry(), &powersgd_entry(),
      &topk_chunked_entry()};
  return r;
}

const CodecEntry* find_codec(CodecKind kind) noexcept {
  for (const CodecEntry* e : codec_entries()) {
    if (e->kind == kind) return e;
  }
  return nullptr;
}

const CodecEntry* find_codec(std::string_view name) noexcept {
  for (const CodecEntry* e : codec_entries()) {
    if (name == e->name) return e;
  }
  return nullptr;
}

void require_capacity(std::size_t need, std::size_t cap) {
  if (need > cap) {
    throw Error(Status::buffer_too_small, "output buffer of " + std::to_string(cap) +
                                              " bytes is too small: the payload needs " +
                                              std::to_string(need));
  }
}

}  // namespace detail

const char* status_name(Status s) noexcept {
  switch (s) {
    case Status::ok:
      return "ok";
    case Status::invalid_argument:
      return "invalid_argument";
    case Status::bad_payload:
      return "bad_payload";
    case Status::buffer_too_small:
      return "buffer_too_small";
    case Status::nonfinite:
      return "nonfinite";
    case Status::mpi:
      return "mpi";
    case Status::cuda:
      return "cuda";
    case Status::mismatch:
      return "mismatch";
    case Status::internal:
      return "internal";
    case Status::timeout:
      return "timeout";
    case Status::transport:
      return "transport";
  }
  return "unknown";
}

const char* codec_name(CodecKind kind) noexcept {
  const detail::CodecEntry* e = detail::find_codec(kind);
  return e ? e->name : "unknown";
}

const std::vector<CodecDescription>& codec_catalog() {
  static const std::vector<CodecDescription> c = [] {
    std::vector<CodecDescription> out;
    for (const detail::CodecEntry* e : detail::codec_entries()) {
      if (!e->wire_only) out.push_back({e->name, e->summary, e->keys});
    }
    return out;
  }();
  return c;
}

std::size_t detail::checked_count(std::size_t n, const char* what) {
  if (n > kMaxElements) {
    throw Error(Status::invalid_argument, std::string(what) + ": " + std::to_string(n) +
                                              " elements is more than the 2^60 gcomp supports");
  }
  return n;
}

}  // namespace gcomp
