// The shared pieces of common.cuh: errors, workspaces, small writes, non-finite reports.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common.cuh"
#include "nonfinite.hpp"

namespace gcomp::cuda::detail {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  throw Error(Status::cuda, std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                                cudaGetErrorString(e) + ")");
}

Workspace::~Workspace() {
  // Process teardown: the driver may already be gone; errors are of no use here.
  if (dev_) cudaFree(dev_);
  if (report_dev_) cudaFree(report_dev_);
  if (report_host_) cudaFreeHost(report_host_);
  if (side_) cudaStreamDestroy(side_);
  if (event_) cudaEventDestroy(event_);
}

cudaStream_t Workspace::side_stream() {
  if (!side_) GCOMP_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  return side_;
}

cudaEvent_t Workspace::side_event() {
  if (!event_) GCOMP_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  return event_;
}

void* Workspace::reserve(std::size_t bytes) {
  if (bytes <= bytes_ && dev_) return dev_;
  // Earlier work on this stream may still read the old buffer.
  GCOMP_CUDA(cudaStreamSynchronize(stream_));
  if (dev_) GCOMP_CUDA(cudaFree(dev_));
  dev_ = nullptr;
  bytes_ = 0;
  const std::size_t grown = bytes + bytes / 4;  // room to grow without reallocating every time
  GCOMP_CUDA(cudaMalloc(&dev_, grown));
  bytes_ = grown;
  return dev_;
}

void Workspace::ensure_report() {
  if (report_dev_) return;
  GCOMP_CUDA(cudaMalloc(&report_dev_, sizeof(Report)));
  GCOMP_CUDA(cudaMallocHost(&report_host_, sizeof(Report)));
}

void Workspace::reset_report() {
  ensure_report();
  GCOMP_CUDA(cudaMemsetAsync(report_dev_, 0, sizeof(Report), stream_));
  GCOMP_CUDA(cudaMemsetAsync(&report_dev_->first, 0xff,
                             sizeof(report_dev_->first) + sizeof(report_dev_->second), stream_));
}

const Report& Workspace::finish() {
  ensure_report();
  GCOMP_CUDA(cudaMemcpyAsync(report_host_, report_dev_, sizeof(Report), cudaMemcpyDeviceToHost,
                             stream_));
  GCOMP_CUDA(cudaStreamSynchronize(stream_));
  return *report_host_;
}

namespace {

bool stages_on() {
  static const bool on = [] {
    const char* v = std::getenv("GCOMP_CUDA_STAGES");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace

Stages::Stages(cudaStream_t s, const char* op, const char* codec, std::size_t n)
    : stream_(s), op_(op), codec_(codec), n_(n) {
  if (!stages_on()) return;
  if (cudaEventCreate(&events_[0]) == cudaSuccess) cudaEventRecord(events_[0], stream_);
}

void Stages::mark(const char* stage) {
  if (!events_[0] || count_ >= kMax) return;
  if (cudaEventCreate(&events_[count_ + 1]) != cudaSuccess) return;
  cudaEventRecord(events_[count_ + 1], stream_);
  names_[count_++] = stage;
}

Stages::~Stages() {
  if (!events_[0]) return;
  // Timing only: errors here change nothing of the call's result.
  std::string line =
      std::string("gcomp-cuda-stages ") + op_ + "/" + codec_ + " n=" + std::to_string(n_);
  if (count_ > 0 && cudaEventSynchronize(events_[count_]) == cudaSuccess) {
    for (int i = 0; i < count_; ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, events_[i], events_[i + 1]);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.4f", ms);
      line += std::string(" ") + names_[i] + "=" + buf;
    }
  }
  for (int i = 0; i <= count_; ++i) cudaEventDestroy(events_[i]);
  std::fprintf(stderr, "%s\n", line.c_str());
}

unsigned multiprocessors() {
  static std::mutex mu;
  static std::map<int, unsigned> by_device;
  int device = 0;
  GCOMP_CUDA(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  const auto it = by_device.find(device);
  if (it != by_device.end()) return it->second;
  int count = 0;
  GCOMP_CUDA(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return by_device[device] = count > 0 ? static_cast<unsigned>(count) : 1u;
}

Workspace& workspace_for(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Workspace>>* spaces =
      new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Workspace>>();  // never freed:
  // workspaces may be used by other static destructors' CUDA calls
  int device = 0;
  GCOMP_CUDA(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto& w = (*spaces)[{device, stream}];
  if (!w) w = std::make_unique<Workspace>(stream);
  return *w;
}

namespace {

__global__ void write_small_kernel(unsigned char* dst, SmallBytes bytes) {
  const unsigned i = threadIdx.x;
  if (i < bytes.len) dst[i] = bytes.b[i];
}

// The first i with x[i] non-finite (e == nullptr), or with x[i] + e[i] non-finite.
__global__ void first_nonfinite_kernel(const float* x, const float* e, std::size_t n,
                                       unsigned long long* first) {
  GCOMP_GRID_LOOP(i, n) {
    const float v = e ? x[i] + e[i] : x[i];
    if (nonfinite(v)) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

}  // namespace

SmallBytes small_bytes(const std::byte* p, std::size_t len) {
  SmallBytes s{};
  if (len > sizeof s.b) throw Error(Status::internal, "small_bytes: too long");
  for (std::size_t i = 0; i < len; ++i) s.b[i] = static_cast<unsigned char>(p[i]);
  s.len = static_cast<unsigned>(len);
  return s;
}

void write_small(unsigned char* dst, const SmallBytes& bytes, cudaStream_t s) {
  write_small_kernel<<<1, sizeof bytes.b, 0, s>>>(dst, bytes);
  GCOMP_LAUNCHED("write_small");
}

std::size_t first_nonfinite(const float* x, const float* e, std::size_t n, Workspace& ws) {
  if (n == 0) return 0;
  ws.reset_report();
  first_nonfinite_kernel<<<grid_for(n), kThreads, 0, ws.stream()>>>(x, e, n, &ws.report()->first);
  GCOMP_LAUNCHED("first_nonfinite");
  const unsigned long long i = ws.finish().first;
  return i < n ? static_cast<std::size_t>(i) : n;
}

void throw_nonfinite(const float* x, const float* e, std::size_t n, Workspace& ws) {
  const cudaStream_t s = ws.stream();
  ws.reset_report();
  first_nonfinite_kernel<<<grid_for(n), kThreads, 0, s>>>(x, nullptr, n, &ws.report()->first);
  GCOMP_LAUNCHED("first_nonfinite");
  std::size_t i = ws.finish().first;
  bool sum = false;
  if (i >= n && e) {
    ws.reset_report();
    first_nonfinite_kernel<<<grid_for(n), kThreads, 0, s>>>(x, e, n, &ws.report()->first);
    GCOMP_LAUNCHED("first_nonfinite");
    i = ws.finish().first;
    sum = true;
  }
  if (i >= n) throw Error(Status::internal, "non-finite value reported but none found");
  float xi = 0;
  float ei = 0;
  GCOMP_CUDA(cudaMemcpy(&xi, x + i, sizeof xi, cudaMemcpyDeviceToHost));
  if (!sum) gcomp::detail::throw_nonfinite_at(i, xi);
  GCOMP_CUDA(cudaMemcpy(&ei, e + i, sizeof ei, cudaMemcpyDeviceToHost));
  gcomp::detail::throw_nonfinite_sum_at(i, xi, ei);
}

}  // namespace gcomp::cuda::detail
