// gcomp's C++ API for compressors: Codec (built from a spec string), ErrorFeedback (the residual
// memory of one tensor), decode_add (any payload into a dense accumulator) and inspect (read and
// validate a payload's header).
//
// Ownership: a Codec is an immutable value (cheap to copy, safe to share between threads).
// ErrorFeedback owns its residual; use one per tensor and one thread at a time.
// Errors: every function throws gcomp::Error; nothing else escapes (std::bad_alloc aside).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gcomp/error.hpp"
#include "gcomp/tensor.hpp"

namespace gcomp {

// Wire identifiers of the codecs (docs/wire-format.md). Never renumber.
enum class CodecKind : std::uint8_t {
  none = 1,
  fp16 = 2,
  bf16 = 3,
  topk = 4,
  randomk = 5,
  threshold = 6,
  qsgd = 7,
  terngrad = 8,
  sign = 9,
  powersgd = 10,  // no payload of its own: its factors travel as float32 or binary16 sums
  // Top-k per chunk, with its values as B-bit codes and a scale per chunk where asked: the
  // payloads of the spec topk:...,chunk=C[,bits=B] (no spec spells this name).
  topk_chunked = 11,
};

// "topk", "qsgd", ...; "unknown" for a value outside the enum.
const char* codec_name(CodecKind kind) noexcept;

// What a codec promises; the collectives choose their algorithm from this.
struct CodecProperties {
  bool sparse = false;           // sends (index, value) pairs; the sum of payloads stays sparse
  bool unbiased = false;         // E[decode(encode(x))] == x over seeds
  bool stochastic = false;       // the bytes depend on the seed
  // Every rank selects the same indices (random-k: its index draw leaves the rank out of the
  // seed), so the sum of the ranks' payloads has as many entries as one.
  bool shared_support = false;
  // Its error contracts: |x - C(x)|^2 <= (1 - delta) |x|^2 with 0 < delta <= 1 (top-k, delta >=
  // k / n; unscaled random-k, k / n in expectation; sign, fp16, bf16; threshold, whose error is
  // what falls below tau), which is what error feedback's analysis asks for: error feedback
  // applies to it by default (gcomp.torch, gcomp-train, the interposer). False for the unbiased
  // quantizers (QSGD, TernGrad, scaled random-k), whose error's variance is omega |x|^2 with
  // omega >= 1 at useful compression, so that a residual fed back grows; and for none, which
  // leaves nothing to feed back.
  bool contraction = false;
  // A scheme across ranks rather than a payload per rank (powersgd): it runs only in the
  // collectives' low_rank algorithm; its encode and decode refuse.
  bool low_rank = false;
  // It needs each tensor's shape (powersgd, which factors each gradient as a matrix):
  // allreduce_buckets must be given the shapes.
  bool needs_shapes = false;
  double bits_per_element = 32;  // for dense codecs, on the wire (headers aside); 0 for sparse
  // Per value sent as such (a sparse codec's values, a low-rank codec's factors): 4 (float32) or
  // 2 (fp16); 0 for the codecs whose payload holds no plain values.
  int value_bytes = 0;

  // What the layers above the collectives ask (gcomp.torch, gcomp-train):
  // Each value sent depends on its own element alone (none, fp16, bf16, threshold), so a bucket
  // compressed whole or tensor by tensor sends the same values.
  bool elementwise = false;
  // One scale per call, which must follow each layer's magnitude (sign's mean |x|, TernGrad's
  // max |x|): gcomp.torch compresses each parameter on its own by default.
  bool split_per_tensor = false;
  // With error feedback it sends much of each gradient late (the sparsifiers; sign), a delay that
  // plain momentum amplifies: momentum then belongs before compression (momentum correction).
  bool sends_late = false;
  // The omega of E|C(x) - x|^2 <= omega |x|^2 that holds for every size of x, where one is known
  // (QSGD: min(D / s^2, sqrt(D) / s) with s = 2^(bits-1) - 1 and D its bucket; none: 0); NaN
  // where none is (the biased codecs, and TernGrad and scaled random-k, whose bounds grow with n).
  double variance_bound = std::numeric_limits<double>::quiet_NaN();
  // Steps sent uncompressed before the first compressed one (powersgd's start=N).
  std::uint64_t start_steps = 0;
};

// One key of a codec's spec, for `gcomp list` and the docs.
struct SpecKey {
  std::string name;
  std::string default_value;  // "" when the key is required or one of a required pair
  std::string help;
};

struct CodecDescription {
  std::string name;
  std::string summary;
  std::vector<SpecKey> keys;
};

// Every codec the registry knows, in wire-id order.
const std::vector<CodecDescription>& codec_catalog();

class ErrorFeedback;

// The most elements a tensor may have (2^60: 4 EiB of float32). Larger counts are an
// invalid_argument wherever a size is computed from them (max_bytes, ErrorFeedback), so that no
// size wraps around.
inline constexpr std::size_t kMaxElements = std::size_t{1} << 60;

namespace detail {
class CodecImpl;
struct FeedbackSlot;
}

class Codec {
 public:
  // Parses a spec "name[:key=value[,key=value...]]". Throws Error(invalid_argument) naming the spec
  // and the bad part for an unknown name, an unknown or repeated key, or a value out of range.
  explicit Codec(std::string_view spec);

  CodecKind kind() const noexcept;
  // The canonical spec, every key spelled out ("qsgd:bits=4,bucket=512").
  const std::string& spec() const noexcept { return spec_; }
  CodecProperties properties() const;

  // Elements a sparse codec selects out of n (0 for dense codecs; threshold: n, an upper bound).
  std::size_t selected(std::size_t n) const;

  // Upper bound of the bytes encode() writes for n floats. Throws Error(invalid_argument) for
  // n > kMaxElements (the bound would not fit in size_t).
  std::size_t max_bytes(std::size_t n) const;
  // The bytes to expect from encode() for n floats of which `entries` are sent (sparse codecs,
  // whose packed indices take what their gaps need; max_bytes(n) for the others). An estimate
  // for cost models, not a bound.
  std::size_t expected_bytes(std::size_t n, std::size_t entries) const;

  // Encodes x into out and returns the bytes written. Throws Error(buffer_too_small) when out is
  // shorter than needed (the message gives the size), Error(nonfinite) for NaN/Inf input.
  std::size_t encode(std::span<const float> x, std::uint64_t seed, std::span<std::byte> out) const;
  std::vector<std::byte> encode(std::span<const float> x, std::uint64_t seed = 0) const;

  // Error-feedback encode: v = x + e; payload = C(v); e = v - D(payload). ef.size() must equal
  // x.size(). On any error ef is left exactly as it was.
  std::size_t encode_ef(ErrorFeedback& ef, std::span<const float> x, std::uint64_t seed,
                        std::span<std::byte> out) const;
  std::vector<std::byte> encode_ef(ErrorFeedback& ef, std::span<const float> x,
                                   std::uint64_t seed = 0) const;

  // Error feedback on caller-owned memory (a slice of a tensor, as the collectives need):
  // v = x + e_old; payload = C(v); e_new = v - D(payload). e_new must not overlap x or e_old and
  // is written only in part when this throws.
  std::size_t encode_ef(std::span<const float> x, std::span<const float> e_old,
                        std::span<float> e_new, std::uint64_t seed, std::span<std::byte> out) const;

  // The same three on a host or a device view (tensor.hpp): host views run the CPU codec, device
  // views (gcomp::cuda::view, library gcomp_cuda) its CUDA kernels, which write the same bytes.
  // All views of one call live in the same memory, device views on the same stream. Device work
  // is queued on that stream after what is already there, in a workspace cached per stream (no
  // allocation once it is big enough); the call returns when the payload is complete, since its
  // size and the finite check come back to the host. Errors as above; with a device view a CUDA
  // failure is Error(cuda).
  std::size_t encode(TensorView<const float> x, std::uint64_t seed,
                     TensorView<std::byte> out) const;
  std::size_t encode_ef(TensorView<const float> x, TensorView<const float> e_old,
                        TensorView<float> e_new, std::uint64_t seed,
                        TensorView<std::byte> out) const;
  // With an ErrorFeedback in the same memory as x (device memory: gcomp::cuda::error_feedback).
  std::size_t encode_ef(ErrorFeedback& ef, TensorView<const float> x, std::uint64_t seed,
                        TensorView<std::byte> out) const;

  const detail::CodecImpl& impl() const noexcept { return *impl_; }

 private:
  std::shared_ptr<const detail::CodecImpl> impl_;
  std::string spec_;  // impl_->spec(), kept: the collectives key their state on it every call
};

// The residual memory of error feedback for one tensor of a fixed size, in host memory or (made
// by gcomp::cuda::error_feedback, library gcomp_cuda) in device memory. Copies are deep.
class ErrorFeedback {
 public:
  // n zeros. Throws Error(invalid_argument) for n > kMaxElements; std::bad_alloc when memory
  // runs out.
  explicit ErrorFeedback(std::size_t n);
  // n zeros in device memory through `device` (what gcomp::cuda::error_feedback passes).
  ErrorFeedback(std::size_t n, const detail::DeviceBackend* device, void* stream = nullptr);
  ~ErrorFeedback();
  ErrorFeedback(const ErrorFeedback& o);
  ErrorFeedback& operator=(const ErrorFeedback& o);
  ErrorFeedback(ErrorFeedback&& o) noexcept;
  ErrorFeedback& operator=(ErrorFeedback&& o) noexcept;

  std::size_t size() const noexcept { return n_; }
  bool on_device() const noexcept { return device_ != nullptr; }
  // The current residual e (valid until the next encode_ef with this memory). Host memory only:
  // throws Error(invalid_argument) for device memory (use view()).
  std::span<const float> residual() const;
  std::span<float> residual();
  // The residual as a view in its memory (device views on the stream given at construction).
  TensorView<float> view() const;
  void reset();  // e = 0, and what the collectives keep beside it forgotten

  // For the codecs: the buffer a new residual is written into, committed by commit() only when
  // the whole encode succeeded, so a failed call leaves the residual untouched.
  std::span<float> scratch();
  TensorView<float> scratch_view();
  void commit() noexcept;

 private:
  void release() noexcept;
  std::size_t n_ = 0;
  std::vector<float> residual_;
  std::vector<float> scratch_;
  // What an algorithm keeps beside the residual, reached only from gcomp's own code
  // (detail::FeedbackSlot): it moves and is copied with the residual.
  friend struct detail::FeedbackSlot;
  std::vector<float> slot_;
  const detail::DeviceBackend* device_ = nullptr;  // device memory: the two buffers below
  void* stream_ = nullptr;
  float* d_residual_ = nullptr;
  float* d_scratch_ = nullptr;
};

// acc[i] += alpha * decode(payload)[i]. The payload is validated in full first (known codec and
// version, sizes that fit exactly, indices in range and strictly increasing, finite values);
// on any error acc is unchanged. acc.size() must equal the payload's element count
// (Error(mismatch) otherwise).
void decode_add(std::span<const std::byte> payload, std::span<float> acc, float alpha = 1.0f);
// The same for a payload and an accumulator both in host or both in device memory (a device
// payload is validated on the device as fully as a host one; acc is unchanged on any error).
void decode_add(TensorView<const std::byte> payload, TensorView<float> acc, float alpha = 1.0f);

// The entries of a sparse payload (topk, randomk, threshold), validated as decode_add validates
// them: indices strictly increasing and below `elements`, values as float32.
struct SparseEntries {
  std::uint64_t elements = 0;
  std::vector<std::uint64_t> indices;
  std::vector<float> values;
};
void sparse_entries(std::span<const std::byte> payload, SparseEntries& out);

// Throws Error(nonfinite) naming the first element where x (or x + residual, when a residual of
// the same size is given) is NaN or Inf, as encode would; returns quietly otherwise.
void check_finite(std::span<const float> x, std::span<const float> residual = {});

// out = x (+ residual, when given), checking as it goes: throws Error(nonfinite) like
// check_finite (out is then partly written). One pass where a copy is needed anyway.
void copy_checked(std::span<const float> x, std::span<const float> residual, std::span<float> out);

// A payload's header, validated as decode_add would validate the whole payload.
struct PayloadInfo {
  CodecKind kind{};
  int version = 0;
  std::uint64_t elements = 0;
  std::string params;                   // "bits=4,bucket=512", "nnz=100,index=u32,values=fp32", ...
  std::vector<std::uint64_t> sections;  // byte length of each section, in order
  std::size_t header_bytes = 0;         // fixed header + parameters + section table
  std::size_t total_bytes = 0;
};
PayloadInfo inspect(std::span<const std::byte> payload);

// Threads the library may use inside one call (>= 1). The default comes from GCOMP_NUM_THREADS,
// else 1; a malformed GCOMP_NUM_THREADS makes Codec construction and decode_add throw
// Error(invalid_argument) naming it. Applies to calls that start after it.
void set_num_threads(int threads);
int num_threads() noexcept;

// Checks the environment variables gcomp reads (GCOMP_NUM_THREADS, GCOMP_SIMD): throws
// Error(invalid_argument) naming the variable and its value when one is malformed. Codec
// construction and decode_add check them too; a program can call this first, to report a bad
// setting as such rather than as a failure of whatever it was doing.
void check_environment();

// The SIMD kernels in use: "avx512", "avx2" or "baseline". The library runs on any x86-64 CPU and
// picks the widest level this CPU (and its OS) supports, at most GCOMP_SIMD when that is set (to
// one of those names; another value makes Codec construction and decode_add throw). Every level
// produces the same bytes.
std::string_view simd_level() noexcept;

// A seed for one (tensor, step, rank) from a user seed, so that every draw is keyed by all of them.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t tensor, std::uint64_t step,
                          std::uint64_t rank) noexcept;

// The seed of one call of a training loop, from the user's seed, the step and the call's index
// within the step (a bucket's): seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9 +
// index * 0x94D049BB133111EB, mod 2^64, so that the buckets of a step, and the steps, draw
// differently. The Python module's allreduce and allreduce_buckets take their seed through it
// when given a step (gcomp.torch passes its seed, step and bucket index so).
constexpr std::uint64_t step_seed(std::uint64_t seed, std::uint64_t step,
                                  std::uint64_t index) noexcept {
  return seed * 0x9E3779B97F4A7C15ull + (step + 1) * 0xBF58476D1CE4E5B9ull +
         index * 0x94D049BB133111EBull;
}

}  // namespace gcomp
