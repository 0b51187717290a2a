// The interface every CPU codec implements, and the registry entry that ties a codec's spec
// parser, encoder, payload validator and decoder together. Internal to gcomp_core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gcomp/codec.hpp"
#include "spec.hpp"
#include "wire.hpp"

namespace gcomp::detail {

// A codec's parameters as plain numbers, for the CUDA backend (0 where a codec has none).
struct CodecParams {
  int bits = 0;               // qsgd; topk_chunked's code bits (0: values as f32 or f16)
  std::uint64_t bucket = 0;   // qsgd
  double clip = 0;            // terngrad
  double tau = 0;             // threshold
  bool scale = false;         // randomk: values times n / k
  bool fp16_values = false;   // topk, randomk, threshold, topk_chunked
  std::uint64_t chunk = 0;    // topk_chunked: the elements of a chunk
};

class CodecImpl {
 public:
  virtual ~CodecImpl() = default;
  virtual CodecKind kind() const = 0;
  virtual std::string spec() const = 0;
  virtual CodecProperties properties() const = 0;
  virtual std::size_t selected(std::size_t /*n*/) const { return 0; }
  virtual std::size_t max_bytes(std::size_t n) const = 0;
  // The bytes to expect from a payload of `entries` entries (sparse codecs; the others:
  // max_bytes), for the cost model before any payload exists.
  virtual std::size_t expected_bytes(std::size_t n, std::size_t /*entries*/) const {
    return max_bytes(n);
  }
  virtual CodecParams params() const { return {}; }
  // topk_chunked: the entries a chunk of len elements keeps (1 <= len <= its chunk).
  virtual std::uint64_t chunk_entries(std::uint64_t /*len*/) const { return 0; }

  // Writes the payload of x[0..n) into out[0..cap) and returns its size. Throws Error.
  // With error feedback (e_old != nullptr) it encodes v = x + e_old instead and writes
  // e_new = v - D(payload) into a separate buffer of n floats, which the caller commits only on
  // success; every codec fuses this into its own passes.
  virtual std::size_t encode(const float* x, const float* e_old, float* e_new, std::size_t n,
                             std::uint64_t seed, std::byte* out, std::size_t cap) const = 0;
};

// One codec's entry in the registry (registry.cpp holds the list).
struct CodecEntry {
  CodecKind kind;
  const char* name;
  const char* summary;
  std::vector<SpecKey> keys;
  // Its parameter bytes and section count in the wire format ({0, 0}: no payload, powersgd's).
  Layout layout;
  std::unique_ptr<CodecImpl> (*make)(SpecReader& spec);
  // Checks everything codec-specific of a parsed payload (parameters, section sizes, values);
  // throws Error(bad_payload).
  void (*validate)(const Payload& p);
  // acc += alpha * decode(p) for a validated payload.
  void (*decode_add)(const Payload& p, float* acc, float alpha);
  // "bits=4,bucket=512" for inspect.
  std::string (*describe)(const Payload& p);
  // The part of validate that reads only the header and parameters (section sizes against n),
  // for payloads whose sections are in device memory; validate includes it.
  void (*validate_layout)(const Payload& p);
  // validate then decode_add in one pass, for the families where validating does work decoding
  // would repeat (packed sparse indices are unpacked once); nullptr where the two are separate.
  // The layout is checked first; nothing is added to acc unless all of the payload is valid.
  void (*validate_decode_add)(const Payload& p, float* acc, float alpha) = nullptr;
  // A payload's name that no spec spells (topk_chunked: top-k's own spec with chunk=): its
  // `make` refuses, saying how to write it, and the catalog leaves it out.
  bool wire_only = false;
};

// Every codec's entry, in wire-id order (registry.cpp).
const std::vector<const CodecEntry*>& codec_entries();
const CodecEntry* find_codec(CodecKind kind) noexcept;
const CodecEntry* find_codec(std::string_view name) noexcept;

// topk with chunk= or bits= (topk_chunked.cpp): its parser, its payloads' entry count (the layout
// checked) and entries (as read_sparse_entries).
std::unique_ptr<CodecImpl> make_topk_chunked(SpecReader& spec);
std::uint64_t chunked_nnz(const Payload& p);
void read_chunked_entries(const Payload& p, SparseEntries& out, bool own);

// The entries of a parsed sparse payload (sparse.cpp); throws for other codecs or bad payloads.
// own: a payload this process just encoded, whose values need no second check.
void read_sparse_entries(const Payload& p, SparseEntries& out, bool own = false);

// For the payloads a collective just encoded on this rank: decode_add and sparse_entries
// without validating them a second time (the encoder checked the input; codec.cpp).
void decode_add_own(std::span<const std::byte> payload, std::span<float> acc, float alpha);
void sparse_entries_own(std::span<const std::byte> payload, SparseEntries& out);
// Its entry count alone, from the parameters (the layout checked, not the sections).
std::uint64_t sparse_nnz(const Payload& p);

// n, or Error(invalid_argument) naming `what` when n is above kMaxElements.
std::size_t checked_count(std::size_t n, const char* what);

// Throws Error(buffer_too_small) when need > cap.
void require_capacity(std::size_t need, std::size_t cap);

}  // namespace gcomp::detail
