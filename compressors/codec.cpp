// gcomp::Codec: a spec parsed into its family's implementation (registry.cpp), and the encodes
// on host and device memory. Everything codec-specific lives in the family files; this file
// only dispatches.
#include "gcomp/codec.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "codec_impl.hpp"
#include "device_backend.hpp"
#include "parallel.hpp"
#include "spec.hpp"
#include "views.hpp"

namespace gcomp {

Codec::Codec(std::string_view spec) {
  detail::check_environment();
  detail::SpecReader reader(spec);
  const detail::CodecEntry* e = detail::find_codec(reader.name());
  if (!e) {
    std::string names;
    for (const detail::CodecEntry* r : detail::codec_entries()) {
      if (!r->wire_only) names += std::string(names.empty() ? "" : ", ") + r->name;
    }
    reader.fail("unknown codec '" + reader.name() + "' (known: " + names + ")");
  }
  impl_ = e->make(reader);
  spec_ = impl_->spec();
}

CodecKind Codec::kind() const noexcept { return impl_->kind(); }
CodecProperties Codec::properties() const { return impl_->properties(); }
std::size_t Codec::selected(std::size_t n) const { return impl_->selected(n); }
using detail::checked_count;

std::size_t Codec::max_bytes(std::size_t n) const {
  return impl_->max_bytes(checked_count(n, "max_bytes"));
}

std::size_t Codec::expected_bytes(std::size_t n, std::size_t entries) const {
  return impl_->expected_bytes(checked_count(n, "expected_bytes"), std::min(entries, n));
}

std::size_t Codec::encode(std::span<const float> x, std::uint64_t seed,
                          std::span<std::byte> out) const {
  if (x.data() == nullptr && !x.empty()) throw Error(Status::invalid_argument, "input is null");
  return impl_->encode(x.data(), nullptr, nullptr, x.size(), seed, out.data(), out.size());
}

std::vector<std::byte> Codec::encode(std::span<const float> x, std::uint64_t seed) const {
  std::vector<std::byte> out(max_bytes(x.size()));
  out.resize(encode(x, seed, out));
  return out;
}

std::size_t Codec::encode_ef(ErrorFeedback& ef, std::span<const float> x, std::uint64_t seed,
                             std::span<std::byte> out) const {
  if (ef.size() != x.size()) {
    throw Error(Status::invalid_argument,
                "error-feedback memory holds " + std::to_string(ef.size()) +
                    " elements but the input has " + std::to_string(x.size()));
  }
  if (x.data() == nullptr && !x.empty()) throw Error(Status::invalid_argument, "input is null");
  std::span<float> next = ef.scratch();
  const std::size_t bytes = impl_->encode(x.data(), ef.residual().data(), next.data(), x.size(),
                                          seed, out.data(), out.size());
  ef.commit();
  return bytes;
}

std::vector<std::byte> Codec::encode_ef(ErrorFeedback& ef, std::span<const float> x,
                                        std::uint64_t seed) const {
  std::vector<std::byte> out(max_bytes(x.size()));
  out.resize(encode_ef(ef, x, seed, out));
  return out;
}

namespace {
// The caller-owned error-feedback buffers must match the input; the input must not be null.
void check_ef_buffers(std::size_t n, std::size_t e_old, std::size_t e_new, bool x_null) {
  if (e_old != n || e_new != n) {
    throw Error(Status::invalid_argument, "error-feedback buffers of " + std::to_string(e_old) +
                                              " and " + std::to_string(e_new) +
                                              " elements for an input of " + std::to_string(n));
  }
  if (x_null && n > 0) throw Error(Status::invalid_argument, "input is null");
}
}  // namespace

std::size_t Codec::encode_ef(std::span<const float> x, std::span<const float> e_old,
                             std::span<float> e_new, std::uint64_t seed,
                             std::span<std::byte> out) const {
  check_ef_buffers(x.size(), e_old.size(), e_new.size(), x.data() == nullptr);
  return impl_->encode(x.data(), e_old.data(), e_new.data(), x.size(), seed, out.data(),
                       out.size());
}

using detail::one_place;

std::size_t Codec::encode(TensorView<const float> x, std::uint64_t seed,
                          TensorView<std::byte> out) const {
  const detail::DeviceBackend* dev = one_place("encode", x, out);
  if (!dev) return encode(x.host(), seed, out.host());
  if (x.data() == nullptr && !x.empty()) throw Error(Status::invalid_argument, "input is null");
  return dev->encode(*impl_, x.data(), nullptr, nullptr, x.size(), seed, out.data(), out.size(),
                     x.stream());
}

std::size_t Codec::encode_ef(TensorView<const float> x, TensorView<const float> e_old,
                             TensorView<float> e_new, std::uint64_t seed,
                             TensorView<std::byte> out) const {
  const detail::DeviceBackend* dev = one_place("encode_ef", x, e_old, e_new, out);
  if (!dev) return encode_ef(x.host(), e_old.host(), e_new.host(), seed, out.host());
  check_ef_buffers(x.size(), e_old.size(), e_new.size(), x.data() == nullptr);
  return dev->encode(*impl_, x.data(), e_old.data(), e_new.data(), x.size(), seed, out.data(),
                     out.size(), x.stream());
}

std::size_t Codec::encode_ef(ErrorFeedback& ef, TensorView<const float> x, std::uint64_t seed,
                             TensorView<std::byte> out) const {
  if (ef.size() != x.size()) {
    throw Error(Status::invalid_argument,
                "error-feedback memory holds " + std::to_string(ef.size()) +
                    " elements but the input has " + std::to_string(x.size()));
  }
  if (!ef.on_device()) return encode_ef(ef, x.host(), seed, out.host());
  const TensorView<float> e = ef.view();
  // The views must agree on memory and stream; the residual takes the input's stream.
  const TensorView<float> e_old =
      TensorView<float>::device(e.data(), e.size(), x.stream(), e.backend());
  const TensorView<float> s = ef.scratch_view();
  const TensorView<float> e_new =
      TensorView<float>::device(s.data(), s.size(), x.stream(), s.backend());
  const std::size_t bytes = encode_ef(x, e_old, e_new, seed, out);
  ef.commit();
  return bytes;
}

}  // namespace gcomp
