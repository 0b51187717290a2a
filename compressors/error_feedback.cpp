// gcomp::ErrorFeedback: a residual in host or device memory, written by an encode into a
// scratch buffer and committed (swapped in) only when the encode succeeded.
#include <algorithm>
#include <utility>

#include "codec_impl.hpp"
#include "device_backend.hpp"
#include "gcomp/codec.hpp"

namespace gcomp {

ErrorFeedback::ErrorFeedback(std::size_t n)
    : n_(detail::checked_count(n, "ErrorFeedback")), residual_(n, 0.0f) {}

ErrorFeedback::ErrorFeedback(std::size_t n, const detail::DeviceBackend* device, void* stream)
    : n_(detail::checked_count(n, "ErrorFeedback")), device_(device), stream_(stream) {
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
    : n_(o.n_), residual_(o.residual_), slot_(o.slot_), device_(o.device_), stream_(o.stream_) {
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
      slot_(std::move(o.slot_)),
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
    slot_ = std::move(o.slot_);
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
  slot_.clear();
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

}  // namespace gcomp
