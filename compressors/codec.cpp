// The registry of codecs and the public C++ API on top of it: Codec, ErrorFeedback, decode_add,
// inspect. Everything codec-specific lives in the family files; this file only dispatches.
#include "gcomp/codec.hpp"

#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>

#include "bytes.hpp"
#include "chunks.hpp"
#include "codec_impl.hpp"
#include "device_backend.hpp"
#include "kernels.hpp"
#include "nonfinite.hpp"
#include "parallel.hpp"
#include "philox.hpp"

namespace gcomp {

namespace detail {

namespace {
const std::vector<const CodecEntry*>& registry() {
  static const std::vector<const CodecEntry*> r = {
      &dense_none_entry(), &dense_fp16_entry(), &dense_bf16_entry(),
      &topk_entry(),       &randomk_entry(),    &threshold_entry(),
      &qsgd_entry(),       &terngrad_entry(),   &sign_entry()};
  return r;
}
}  // namespace

const CodecEntry* find_codec(CodecKind kind) noexcept {
  for (const CodecEntry* e : registry()) {
    if (e->kind == kind) return e;
  }
  return nullptr;
}

const CodecEntry* find_codec(std::string_view name) noexcept {
  for (const CodecEntry* e : registry()) {
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
    for (const detail::CodecEntry* e : detail::registry()) {
      out.push_back({e->name, e->summary, e->keys});
    }
    return out;
  }();
  return c;
}

Codec::Codec(std::string_view spec) {
  detail::check_environment();
  detail::SpecReader reader(spec);
  const detail::CodecEntry* e = detail::find_codec(reader.name());
  if (!e) {
    std::string names;
    for (const detail::CodecEntry* r : detail::registry())
      names += std::string(names.empty() ? "" : ", ") + r->name;
    reader.fail("unknown codec '" + reader.name() + "' (known: " + names + ")");
  }
  impl_ = e->make(reader);
  spec_ = impl_->spec();
}

CodecKind Codec::kind() const noexcept { return impl_->kind(); }
CodecProperties Codec::properties() const { return impl_->properties(); }
std::size_t Codec::selected(std::size_t n) const { return impl_->selected(n); }
namespace {
std::size_t checked_count(std::size_t n, const char* what) {
  if (n > kMaxElements) {
    throw Error(Status::invalid_argument, std::string(what) + ": " + std::to_string(n) +
                                              " elements is more than the 2^60 gcomp supports");
  }
  return n;
}
}  // namespace

std::size_t Codec::max_bytes(std::size_t n) const {
  return impl_->max_bytes(checked_count(n, "max_bytes"));
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

namespace {

// The backend and stream of a call whose views must all be in one memory; nullptr for host.
template <class... V>
const detail::DeviceBackend* one_place(const char* what, const V&... views) {
  const detail::DeviceBackend* backend = nullptr;
  void* stream = nullptr;
  bool first = true;
  bool mixed = false;
  bool streams = false;
  auto visit = [&](const auto& v) {
    if (first) {
      backend = v.backend();
      stream = v.stream();
      first = false;
      return;
    }
    if (v.backend() != backend) mixed = true;
    if (v.stream() != stream) streams = true;
  };
  (visit(views), ...);
  if (mixed) {
    throw Error(Status::invalid_argument,
                std::string(what) +
                    ": the views are in different memories (host and device); "
                    "copy them to one side first");
  }
  if (streams) {
    throw Error(Status::invalid_argument,
                std::string(what) + ": the device views name different CUDA streams");
  }
  return backend;
}

}  // namespace

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

void check_finite(std::span<const float> x, std::span<const float> residual) {
  if (!residual.empty() && residual.size() != x.size()) {
    throw Error(Status::invalid_argument, "residual of " + std::to_string(residual.size()) +
                                              " elements for an input of " +
                                              std::to_string(x.size()));
  }
  std::atomic<bool> bad{false};
  detail::for_chunks(x.size(), std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
    const bool hit = residual.empty()
                         ? detail::any_nonfinite(x.data() + b, e - b)
                         : detail::any_nonfinite_sum(x.data() + b, residual.data() + b, e - b);
    if (hit) bad.store(true, std::memory_order_relaxed);
  });
  if (!bad.load()) return;
  if (residual.empty()) detail::throw_nonfinite(x.data(), x.size());
  detail::throw_nonfinite_sum(x.data(), residual.data(), x.size());
}

void copy_checked(std::span<const float> x, std::span<const float> residual, std::span<float> out) {
  if ((!residual.empty() && residual.size() != x.size()) || out.size() != x.size()) {
    throw Error(Status::invalid_argument, "copy_checked: sizes differ");
  }
  std::atomic<bool> bad{false};
  detail::for_chunks(x.size(), std::size_t{1} << 16, [&](std::size_t b, std::size_t e) {
    const bool hit =
        residual.empty()
            ? detail::encode_f32(x.data() + b, nullptr, e - b,
                                 reinterpret_cast<std::byte*>(out.data() + b), nullptr)
            : detail::add_checked(x.data() + b, residual.data() + b, e - b, out.data() + b);
    if (hit) bad.store(true, std::memory_order_relaxed);
  });
  if (!bad.load()) return;
  if (residual.empty()) detail::throw_nonfinite(x.data(), x.size());
  detail::throw_nonfinite_sum(x.data(), residual.data(), x.size());
}

ErrorFeedback::ErrorFeedback(std::size_t n)
    : n_(checked_count(n, "ErrorFeedback")), residual_(n, 0.0f) {}

ErrorFeedback::ErrorFeedback(std::size_t n, const detail::DeviceBackend* device, void* stream)
    : n_(checked_count(n, "ErrorFeedback")), device_(device), stream_(stream) {
  if (!device) throw Error(Status::invalid_argument, "ErrorFeedback: no device backend");
  try {
    d_residual_ = static_cast<float*>(device->alloc(4 * n));
    d_scratch_ = static_cast<float*>(device->alloc(4 * n));
    device->zero(d_residual_, n, stream);
    device->sync(stream);
  } catch (...) {
    release();
    throw;
  }
}

void ErrorFeedback::release() noexcept {
  if (device_) {
    device_->free(d_residual_);
    device_->free(d_scratch_);
  }
  d_residual_ = nullptr;
  d_scratch_ = nullptr;
}

ErrorFeedback::~ErrorFeedback() { release(); }

ErrorFeedback::ErrorFeedback(const ErrorFeedback& o)
    : n_(o.n_),
      residual_(o.residual_),
      secondary_(o.secondary_),
      device_(o.device_),
      stream_(o.stream_) {
  if (!device_) return;
  try {
    d_residual_ = static_cast<float*>(device_->alloc(4 * n_));
    d_scratch_ = static_cast<float*>(device_->alloc(4 * n_));
    device_->copy(d_residual_, o.d_residual_, 4 * n_, stream_);
  } catch (...) {
    release();
    throw;
  }
}

ErrorFeedback& ErrorFeedback::operator=(const ErrorFeedback& o) {
  if (this != &o) {
    ErrorFeedback copy(o);
    *this = std::move(copy);
  }
  return *this;
}

ErrorFeedback::ErrorFeedback(ErrorFeedback&& o) noexcept
    : n_(std::exchange(o.n_, 0)),
      residual_(std::move(o.residual_)),
      scratch_(std::move(o.scratch_)),
      secondary_(std::move(o.secondary_)),
      device_(std::exchange(o.device_, nullptr)),
      stream_(o.stream_),
      d_residual_(std::exchange(o.d_residual_, nullptr)),
      d_scratch_(std::exchange(o.d_scratch_, nullptr)) {}

ErrorFeedback& ErrorFeedback::operator=(ErrorFeedback&& o) noexcept {
  if (this != &o) {
    release();
    n_ = std::exchange(o.n_, 0);
    residual_ = std::move(o.residual_);
    scratch_ = std::move(o.scratch_);
    secondary_ = std::move(o.secondary_);
    device_ = std::exchange(o.device_, nullptr);
    stream_ = o.stream_;
    d_residual_ = std::exchange(o.d_residual_, nullptr);
    d_scratch_ = std::exchange(o.d_scratch_, nullptr);
  }
  return *this;
}

namespace {
[[noreturn]] void device_residual() {
  throw Error(Status::invalid_argument,
              "this error-feedback memory is in device memory; use view() for it");
}
}  // namespace

std::span<const float> ErrorFeedback::residual() const {
  if (device_) device_residual();
  return residual_;
}

std::span<float> ErrorFeedback::residual() {
  if (device_) device_residual();
  return residual_;
}

TensorView<float> ErrorFeedback::view() const {
  if (device_) return TensorView<float>::device(d_residual_, n_, stream_, device_);
  return TensorView<float>(std::span<float>(const_cast<float*>(residual_.data()), n_));
}

void ErrorFeedback::reset() {
  if (device_) {
    device_->zero(d_residual_, n_, stream_);
    device_->sync(stream_);
  } else {
    std::fill(residual_.begin(), residual_.end(), 0.0f);
  }
  secondary_.clear();
}

std::span<float> ErrorFeedback::scratch() {
  if (device_) device_residual();
  scratch_.resize(residual_.size());
  return scratch_;
}

TensorView<float> ErrorFeedback::scratch_view() {
  if (device_) return TensorView<float>::device(d_scratch_, n_, stream_, device_);
  return TensorView<float>(scratch());
}

void ErrorFeedback::commit() noexcept {
  if (device_) {
    std::swap(d_residual_, d_scratch_);
  } else {
    residual_.swap(scratch_);
  }
}

void decode_add(std::span<const std::byte> payload, std::span<float> acc, float alpha) {
  if (payload.data() == nullptr && !payload.empty()) {
    throw Error(Status::invalid_argument, "payload is null");
  }
  if (!std::isfinite(alpha)) throw Error(Status::invalid_argument, "alpha is not finite");
  detail::check_environment();
  const detail::Payload p = detail::parse_payload(payload);
  const detail::CodecEntry* e = detail::find_codec(p.kind);
  e->validate(p);
  if (p.n != acc.size()) {
    throw Error(Status::mismatch, "payload holds " + std::to_string(p.n) +
                                      " elements but the accumulator has " +
                                      std::to_string(acc.size()));
  }
  if (acc.data() == nullptr && !acc.empty())
    throw Error(Status::invalid_argument, "accumulator is null");
  e->decode_add(p, acc.data(), alpha);
}

void decode_add(TensorView<const std::byte> payload, TensorView<float> acc, float alpha) {
  const detail::DeviceBackend* dev = one_place("decode_add", payload, acc);
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

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t tensor, std::uint64_t step,
                          std::uint64_t rank) noexcept {
  // Two Philox4x32-10 calls: the seed keys a draw over the rank, which keys a draw over
  // (tensor, step); every input bit reaches the result.
  r123::Philox4x32 rng;
  const auto lo = [](std::uint64_t v) { return static_cast<std::uint32_t>(v); };
  const auto hi = [](std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); };
  const auto k = rng({{lo(rank), hi(rank), 0x67636d70u, 0}}, {{lo(seed), hi(seed)}});
  const auto r = rng({{lo(tensor), hi(tensor), lo(step), hi(step)}}, {{k[0], k[1]}});
  return (static_cast<std::uint64_t>(r[1]) << 32) | r[0];
}

}  // namespace gcomp
