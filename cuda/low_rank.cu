// PowerSGD's arithmetic on device memory (compressors/low_rank.hpp has the CPU's), for the
// collectives' low_rank algorithm on device tensors (collectives/algorithms/low_rank.cpp):
//
//   * the products P = M Q and Q = M^T P are cuBLAS SGEMMs (pedantic math: float32 operations,
//     no TF32), summed in cuBLAS's order rather than the CPU's float64 one. They are what a rank
//     contributes to an allreduce, not what the ranks must agree on, so they need only be close:
//     with k the length of each sum (cols for M Q, rows for M^T P), u = 2^-24 and S = sum |m q|
//     of the output's terms,
//         |gpu - exact| <= gamma_k S,   gamma_k = k u / (1 - k u)       (float32, any order)
//         |cpu - exact| <= u |exact| + (k - 1) 2^-53 S (1 + O(2^-53))     (float64, then rounded)
//     so |gpu - cpu| <= (gamma_k + u + k 2^-53) S, which the CUDA tests hold them to;
//   * the reconstruction a b^T (from the allreduced factors, which every rank holds the same
//     bits of) is this file's kernel and the CPU's arithmetic exactly: per element one float64
//     sum over j from 0 of float products (exact in float64, so no contraction could change
//     them; the library builds with --fmad=false anyway), then the CPU's two roundings to
//     float32. A rank on a GPU and a rank on a CPU thus write the same out;
//   * the orthonormalization runs on the host (the CPU's kernel), where the allreduced P is:
//     MPI here is not CUDA-aware, so P crosses to the host for its allreduce in any case.
#include <cublas_v2.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "codecs.cuh"

namespace gcomp::cuda::detail {

namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(Status::cuda, std::string(what) + ": " + cublasGetStatusString(s));
  }
}

// One cuBLAS handle per stream (made on first use, on the device current then, and kept: a
// handle's creation costs milliseconds).
cublasHandle_t handle_for(cudaStream_t stream) {
  static std::mutex mu;
  static auto* handles = new std::unordered_map<cudaStream_t, cublasHandle_t>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles->find(stream);
  if (it != handles->end()) return it->second;
  cublasHandle_t h = nullptr;
  check_blas(cublasCreate(&h), "cublasCreate");
  check_blas(cublasSetStream(h, stream), "cublasSetStream");
  check_blas(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  handles->emplace(stream, h);
  return h;
}

__global__ void add_kernel(const float* a, const float* b, float* out, std::size_t n) {
  GCOMP_GRID_LOOP(i, n) out[i] = a[i] + b[i];
}

// Element (i, k) of a b^T: s = sum_j a[i][j] b[k][j] in j order from 0 in float64; out =
// float(s out_scale), e = m - float(s share_scale): compressors/low_rank.cpp's rec_rows.
__global__ void reconstruct_kernel(const float* a, const float* b, std::size_t rows,
                                   std::size_t cols, std::size_t r, double out_scale, float* out,
                                   double share_scale, const float* m, float* e) {
  GCOMP_GRID_LOOP(idx, rows * cols) {
    const std::size_t i = idx / cols, k = idx % cols;
    double s = 0;
    for (std::size_t j = 0; j < r; ++j) {
      s = __dadd_rn(
          s, __dmul_rn(static_cast<double>(a[i * r + j]), static_cast<double>(b[k * r + j])));
    }
    if (e) e[idx] = __fsub_rn(m[idx], __double2float_rn(__dmul_rn(s, share_scale)));
    if (out) out[idx] = __double2float_rn(__dmul_rn(s, out_scale));
  }
}

}  // namespace

void lr_add(const float* a, const float* b, float* out, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, out, n);
  GCOMP_LAUNCHED("lr_add");
}

namespace {
// c = a op(b) in column-major terms (m x n, inner dimension k), float32, on the stream's handle.
void sgemm(cudaStream_t stream, cublasOperation_t op_b, std::size_t m, std::size_t n, std::size_t k,
           const float* a, const float* b, std::size_t ldb, float* c, const char* what) {
  const float one = 1.0f, zero = 0.0f;
  const auto M = static_cast<std::int64_t>(m), N = static_cast<std::int64_t>(n),
             K = static_cast<std::int64_t>(k), LDB = static_cast<std::int64_t>(ldb);
  check_blas(cublasSgemm_64(handle_for(stream), CUBLAS_OP_N, op_b, M, N, K, &one, a, M, b, LDB,
                            &zero, c, M),
             what);
}
}  // namespace

// Row-major X (a x b) is column-major X^T (b x a, leading dimension b): P^T = Q^T M^T is
// sgemm(N, N, r, rows, cols; Q, M), and Q^T = P^T M is sgemm(N, T, r, cols, rows; P, M).
void lr_multiply(const float* m, std::size_t rows, std::size_t cols, const float* q, std::size_t r,
                 float* p, cudaStream_t stream) {
  if (rows == 0 || r == 0) return;
  sgemm(stream, CUBLAS_OP_N, r, rows, cols, q, m, cols, p, "cublasSgemm (P = M Q)");
}

void lr_multiply_t(const float* m, std::size_t rows, std::size_t cols, const float* p,
                   std::size_t r, float* q, cudaStream_t stream) {
  if (cols == 0 || r == 0) return;
  sgemm(stream, CUBLAS_OP_T, r, cols, rows, p, m, cols, q, "cublasSgemm (Q = M^T P)");
}

void lr_reconstruct(const float* a, const float* b, std::size_t rows, std::size_t cols,
                    std::size_t r, double out_scale, float* out, double share_scale, const float* m,
                    float* e, cudaStream_t stream) {
  const std::size_t n = rows * cols;
  if (n == 0 || (!out && !e)) return;
  reconstruct_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, rows, cols, r, out_scale, out,
                                                           share_scale, m, e);
  GCOMP_LAUNCHED("lr_reconstruct");
}

}  // namespace gcomp::cuda::detail
