// The CUDA backend behind device TensorViews: encode and decode_add dispatched to the codec
// families' kernels, the views themselves, and device memory helpers.
#include <string>

#include "codecs.cuh"
#include "device_backend.hpp"
#include "parallel.hpp"
#include "gcomp/cuda.hpp"

namespace gcomp::cuda {

namespace detail {

void check_size(const DecodeCall& d) {
  if (d.p.n != d.acc_n) {
    throw Error(Status::mismatch, "payload holds " + std::to_string(d.p.n) +
                                      " elements but the accumulator has " +
                                      std::to_string(d.acc_n));
  }
}

void finish_encode(const EncodeCall& c) {
  if (c.ws->finish().code == kNonfinite) throw_nonfinite(c.x, c.e_old, c.n, *c.ws);
}

const Report* decode_failure(const DecodeCall& d, Stages* stages) {
  const Report& r = d.ws->finish();
  if (stages) stages->mark("finish");
  if (r.code == kBadPayload) return &r;
  check_size(d);
  return nullptr;
}

unsigned char* put_header(const EncodeCall& c, const unsigned char* host_header, std::size_t len) {
  write_small(c.out, small_bytes(reinterpret_cast<const std::byte*>(host_header), len),
              c.ws->stream());
  return c.out + len;
}

namespace {

// The device entry points of a codec (codecs.cuh), or null.
const DeviceCodec* device_codec(CodecKind kind) {
  for (const auto list : {cast_device_codecs, quantizer_device_codecs, sparse_device_codecs,
                           chunked_device_codecs}) {
    for (const DeviceCodec& d : list()) {
      if (d.kind == kind) return &d;
    }
  }
  return nullptr;
}

__global__ void scale_kernel(float* p, std::size_t n, float a) {
  GCOMP_GRID_LOOP(i, n) p[i] *= a;
}

class CudaBackend final : public gcomp::detail::DeviceBackend {
 public:
  void* alloc(std::size_t bytes) const override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    GCOMP_CUDA(cudaMalloc(&p, bytes));
    return p;
  }
  void free(void* p) const noexcept override {
    if (p) cudaFree(p);
  }
  void copy(void* dst, const void* src, std::size_t bytes, void* stream) const override {
    const auto s = static_cast<cudaStream_t>(stream);
    if (bytes > 0) GCOMP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    GCOMP_CUDA(cudaStreamSynchronize(s));
  }
  void zero(float* p, std::size_t n, void* stream) const override {
    if (n > 0) GCOMP_CUDA(cudaMemsetAsync(p, 0, 4 * n, static_cast<cudaStream_t>(stream)));
  }
  void scale(float* p, std::size_t n, float a, void* stream) const override {
    if (n == 0) return;
    scale_kernel<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, n, a);
    GCOMP_LAUNCHED("scale");
  }
  void sync(void* stream) const override {
    GCOMP_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
  void* alloc_host(std::size_t bytes) const override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    GCOMP_CUDA(cudaMallocHost(&p, bytes));
    return p;
  }
  void free_host(void* p) const noexcept override {
    if (p) cudaFreeHost(p);
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, void* stream) const override {
    if (bytes == 0) return;
    Workspace& ws = workspace_for(static_cast<cudaStream_t>(stream));
    std::lock_guard<std::mutex> lock(ws.mutex());
    const cudaStream_t side = ws.side_stream();
    GCOMP_CUDA(cudaEventRecord(ws.side_event(), ws.stream()));
    GCOMP_CUDA(cudaStreamWaitEvent(side, ws.side_event(), 0));
    GCOMP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, side));
  }
  void wait_copies(void* stream) const override {
    Workspace& ws = workspace_for(static_cast<cudaStream_t>(stream));
    std::lock_guard<std::mutex> lock(ws.mutex());
    GCOMP_CUDA(cudaStreamSynchronize(ws.side_stream()));
  }
  void check_finite(const float* x, const float* e, std::size_t n, void* stream) const override {
    Workspace& ws = workspace_for(static_cast<cudaStream_t>(stream));
    std::lock_guard<std::mutex> lock(ws.mutex());
    if (first_nonfinite(x, e, n, ws) < n) throw_nonfinite(x, e, n, ws);
  }

  void add(const float* a, const float* b, float* out, std::size_t n, void* stream) const override {
    lr_add(a, b, out, n, static_cast<cudaStream_t>(stream));
  }
  void lr_multiply(const float* m, std::size_t rows, std::size_t cols, const float* q,
                   std::size_t r, float* p, void* stream) const override {
    gcomp::cuda::detail::lr_multiply(m, rows, cols, q, r, p, static_cast<cudaStream_t>(stream));
  }
  void lr_multiply_t(const float* m, std::size_t rows, std::size_t cols, const float* p,
                     std::size_t r, float* q, void* stream) const override {
    gcomp::cuda::detail::lr_multiply_t(m, rows, cols, p, r, q, static_cast<cudaStream_t>(stream));
  }
  void lr_reconstruct(const float* a, const float* b, std::size_t rows, std::size_t cols,
                      std::size_t r, double out_scale, float* out, double share_scale,
                      const float* m, float* e, void* stream) const override {
    gcomp::cuda::detail::lr_reconstruct(a, b, rows, cols, r, out_scale, out, share_scale, m, e,
                                        static_cast<cudaStream_t>(stream));
  }
  void adam(const gcomp::detail::AdamKernel& k, const gcomp::detail::AdamArrays& a, std::size_t n,
            void* stream) const override {
    gcomp::cuda::detail::adam(k, a, n, static_cast<cudaStream_t>(stream));
  }

  std::size_t encode(const gcomp::detail::CodecImpl& codec, const float* x, const float* e_old,
                     float* e_new, std::size_t n, std::uint64_t seed, std::byte* out,
                     std::size_t cap, void* stream) const override {
    Workspace& ws = workspace_for(static_cast<cudaStream_t>(stream));
    std::lock_guard<std::mutex> lock(ws.mutex());
    const EncodeCall c{&codec, x, e_old, e_new, n, seed, reinterpret_cast<unsigned char*>(out),
                       cap, &ws};
    if (const DeviceCodec* d = device_codec(codec.kind())) return d->encode(c);
    const gcomp::detail::CodecEntry* e = gcomp::detail::find_codec(codec.kind());
    if (e != nullptr && e->layout.sections == 0) {
      return codec.encode(x, e_old, e_new, n, seed, out, cap);  // no payload: the CPU's refusal
    }
    throw Error(Status::internal, "no CUDA encoder for codec id " +
                                      std::to_string(static_cast<int>(codec.kind())));
  }

  void decode_add(const std::byte* payload, std::size_t bytes, float* acc, std::size_t n,
                  float alpha, void* stream) const override {
    gcomp::detail::check_environment();  // as the CPU's decode_add: a bad GCOMP_NUM_THREADS
    Workspace& ws = workspace_for(static_cast<cudaStream_t>(stream));
    std::lock_guard<std::mutex> lock(ws.mutex());
    // The header comes to the host (after the work already on the stream), is checked there by
    // the CPU's code, and the sections are checked on the device.
    std::byte head[gcomp::detail::kMaxHeaderBytes] = {};
    const std::size_t h = bytes < sizeof head ? bytes : sizeof head;
    if (h > 0) {
      GCOMP_CUDA(cudaMemcpyAsync(head, payload, h, cudaMemcpyDeviceToHost, ws.stream()));
      GCOMP_CUDA(cudaStreamSynchronize(ws.stream()));
    }
    DecodeCall d{};
    d.p = gcomp::detail::parse_payload_head(head, bytes);
    const gcomp::detail::CodecEntry* e = gcomp::detail::find_codec(d.p.kind);
    e->validate_layout(d.p);
    d.acc_n = n;
    d.apply = d.p.n == n;  // else: validate only, then the mismatch (the CPU's order)
    for (std::size_t i = 0; i < d.p.section_count; ++i) {
      d.sections[i] = reinterpret_cast<const unsigned char*>(payload) +
                      (d.p.sections[i].data - head);
    }
    d.acc = acc;
    d.alpha = alpha;
    d.ws = &ws;
    // A kind without a payload (powersgd) parse_payload_head has refused already.
    if (const DeviceCodec* k = device_codec(d.p.kind)) return k->decode_add(d);
    throw Error(Status::internal, "no CUDA decoder for codec id " +
                                      std::to_string(static_cast<int>(d.p.kind)));
  }
};

// Never destroyed: objects that outlive static destruction (a static Communicator's staging,
// an ErrorFeedback) free their device memory through it.
const CudaBackend* backend() {
  static const CudaBackend* b = new CudaBackend;
  return b;
}

}  // namespace
}  // namespace detail

TensorView<float> view(float* data, std::size_t n, void* stream) {
  return TensorView<float>::device(data, n, stream, detail::backend());
}
TensorView<const float> view(const float* data, std::size_t n, void* stream) {
  return TensorView<const float>::device(data, n, stream, detail::backend());
}
TensorView<std::byte> view(std::byte* data, std::size_t n, void* stream) {
  return TensorView<std::byte>::device(data, n, stream, detail::backend());
}
TensorView<const std::byte> view(const std::byte* data, std::size_t n, void* stream) {
  return TensorView<const std::byte>::device(data, n, stream, detail::backend());
}

ErrorFeedback error_feedback(std::size_t n, void* stream) {
  return ErrorFeedback(n, detail::backend(), stream);
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  GCOMP_CUDA(cudaMalloc(&p, bytes));
  return p;
}

void device_free(void* p) noexcept {
  if (p) cudaFree(p);
}

void copy(void* dst, const void* src, std::size_t bytes) {
  GCOMP_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void synchronize(void* stream) {
  GCOMP_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

int current_device() {
  int d = 0;
  GCOMP_CUDA(cudaGetDevice(&d));
  return d;
}

void set_device(int device) { GCOMP_CUDA(cudaSetDevice(device)); }

int device_of(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // a pointer CUDA does not know: clear the error, it is host memory
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

void order_after(void* stream, void* producer) {
  if (stream == producer) return;
  // One event per call: cheap (timing disabled), and it keeps concurrent callers apart.
  cudaEvent_t e = nullptr;
  GCOMP_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(e, static_cast<cudaStream_t>(producer));
  const cudaError_t waited =
      recorded == cudaSuccess ? cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), e, 0)
                              : recorded;
  cudaEventDestroy(e);  // released once the wait is done; the wait stays queued
  GCOMP_CUDA(waited);
}

}  // namespace gcomp::cuda
