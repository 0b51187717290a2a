// The CUDA codecs, one file per family as in compressors/: each encodes into a device payload
// byte-identical to the CPU codec's, and validates and decode_adds a device payload as the CPU
// does (same checks, same messages). backend.cu dispatches to them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "adam_kernel.hpp"
#include "codec_impl.hpp"
#include "common.cuh"
#include "wire.hpp"

namespace gcomp::cuda::detail {

struct EncodeCall {
  const gcomp::detail::CodecImpl* codec;
  const float* x;
  const float* e_old;  // null without error feedback
  float* e_new;
  std::size_t n;
  std::uint64_t seed;
  unsigned char* out;
  std::size_t cap;
  Workspace* ws;
};

// A payload in device memory whose header was parsed and layout-validated on the host:
// sections[i] is the device address of section i.
// The decoders validate the sections, then (when acc has the payload's element count, `apply`)
// add them, then report in the CPU's order: a bad payload first, then check_size's mismatch.
struct DecodeCall {
  gcomp::detail::Payload p;
  const unsigned char* sections[gcomp::detail::kMaxSections];
  float* acc;
  std::size_t acc_n;
  bool apply;
  float alpha;
  Workspace* ws;
};

// Throws Error(mismatch) when the accumulator's size is not the payload's element count.
void check_size(const DecodeCall& d);

// The end of an encode: waits for its kernels; Error(nonfinite) naming the first NaN or Inf in x
// or x + e where a kernel found one.
void finish_encode(const EncodeCall& c);
// The end of a decode_add: waits for its kernels (marking the stage "finish" where stages are
// given); their report where they found the payload bad (the caller names what, as the CPU
// does), else null once check_size has passed.
const Report* decode_failure(const DecodeCall& d, Stages* stages = nullptr);

// Writes the header (computed on the host by the CPU's write_header) at the payload's start and
// returns the device address of the first section.
unsigned char* put_header(const EncodeCall& c, const unsigned char* host_header, std::size_t len);

// A codec's device entry points: encode a device tensor into a device payload, and validate
// and decode_add one. Each kernel file lists those of its codecs (below); backend.cu looks a
// payload's kind up in every list.
struct DeviceCodec {
  CodecKind kind;
  std::size_t (*encode)(const EncodeCall& c);
  void (*decode_add)(const DecodeCall& d);
};
std::span<const DeviceCodec> cast_device_codecs();       // cast.cu: none, fp16, bf16
std::span<const DeviceCodec> quantizer_device_codecs();  // quantizers.cu: sign, terngrad, qsgd
// QSGD's entry points (qsgd.cu), in quantizer_device_codecs' list.
std::size_t encode_qsgd(const EncodeCall& c);
void decode_qsgd(const DecodeCall& d);
std::span<const DeviceCodec> sparse_device_codecs();     // sparse.cu: topk, randomk, threshold
// The sparse codecs' decode_add (sparse_decode.cu), in sparse_device_codecs' entries.
void decode_sparse(const DecodeCall& d);
std::span<const DeviceCodec> chunked_device_codecs();    // topk_chunked.cu: topk_chunked

// PowerSGD's arithmetic (low_rank.cu; DeviceBackend's add and lr_* say what each computes),
// queued on `stream`.
void lr_add(const float* a, const float* b, float* out, std::size_t n, cudaStream_t stream);
void lr_multiply(const float* m, std::size_t rows, std::size_t cols, const float* q, std::size_t r,
                 float* p, cudaStream_t stream);
void lr_multiply_t(const float* m, std::size_t rows, std::size_t cols, const float* p,
                   std::size_t r, float* q, cudaStream_t stream);
void lr_reconstruct(const float* a, const float* b, std::size_t rows, std::size_t cols,
                    std::size_t r, double out_scale, float* out, double share_scale, const float* m,
                    float* e, cudaStream_t stream);

// Adam's element-wise steps (adam.cu; DeviceBackend::adam), queued on `stream`.
void adam(const gcomp::detail::AdamKernel& k, const gcomp::detail::AdamArrays& a, std::size_t n,
          cudaStream_t stream);

}  // namespace gcomp::cuda::detail
