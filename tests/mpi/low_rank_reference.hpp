// The float64 reference of one low_rank step (collectives/algorithms/low_rank.cpp) and its derived bound,
// shared by the low_rank tests on host tensors (low_rank_test.cpp) and on device tensors
// (device_test.cpp, whose GPU products sum in another order).
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "low_rank.hpp"
#include "mpi_util.hpp"

namespace gcomp::test {

inline constexpr double kU = 0x1p-24;  // float32's unit roundoff

// Every rank's copy of v, rank after rank.
inline std::vector<float> gather(const std::vector<float>& v) {
  std::vector<float> all(v.size() * static_cast<std::size_t>(size()));
  MPI_Allgather(v.data(), static_cast<int>(v.size()), MPI_FLOAT, all.data(),
                static_cast<int>(v.size()), MPI_FLOAT, MPI_COMM_WORLD);
  return all;
}

inline std::vector<double> sum_double(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  MPI_Allreduce(v.data(), out.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return out;
}

inline double frob(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// Modified Gram-Schmidt in float64 of a rows x r row-major matrix, as the library's, also
// returning R (r x r, upper triangular: the norms on the diagonal, the projections above).
inline std::vector<double> gram_schmidt(std::vector<double> p, std::size_t rows, std::size_t r,
                                        std::vector<double>& R) {
  R.assign(r * r, 0.0);
  for (std::size_t j = 0; j < r; ++j) {
    double ss = 0;
    for (std::size_t i = 0; i < rows; ++i) ss += p[i * r + j] * p[i * r + j];
    const double norm = std::sqrt(ss);
    R[j * r + j] = norm;
    for (std::size_t i = 0; i < rows; ++i) p[i * r + j] /= norm;
    for (std::size_t l = j + 1; l < r; ++l) {
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += p[i * r + j] * p[i * r + l];
      R[j * r + l] = dot;
      for (std::size_t i = 0; i < rows; ++i) p[i * r + l] -= dot * p[i * r + j];
    }
  }
  return p;
}

// ||R^-1||_F of an upper triangular r x r R (back substitution, column by column).
inline double inverse_norm(const std::vector<double>& R, std::size_t r) {
  double ss = 0;
  for (std::size_t c = 0; c < r; ++c) {
    std::vector<double> x(r, 0.0);
    for (std::size_t i = r; i-- > 0;) {
      double v = i == c ? 1.0 : 0.0;
      for (std::size_t k = i + 1; k < r; ++k) v -= R[i * r + k] * x[k];
      x[i] = v / R[i * r + i];
    }
    for (double v : x) ss += v * v;
  }
  return std::sqrt(ss);
}

// The Q the library draws for the first step of tensor t of bucket 0 (cold, or warm start's
// first): low_rank.cpp's derive_seed(shared seed, t, steps = 1, 0), the shared seed being
// derive_seed(seed, bucket tensor id, 2, 0) and bucket 0's tensor id options.tensor * 1000003.
inline std::vector<float> first_q(std::uint64_t seed, std::size_t t, std::size_t count) {
  std::vector<float> q(count);
  detail::lr_random(q.data(), count, derive_seed(derive_seed(seed, 0, 2, 0), t, 1, 0));
  return q;
}

// The two-allreduce scheme on one step, cold, in float64 from every rank's float32 input, with
// the bound on ||out - reference||_F derived from the library's roundings (first order, times
// 1.1 for the higher orders). u = 2^-24, W ranks; A = sum_r |M_r| |Q0| elementwise; a rank's
// products within p_error A (and q_error B, below) of the exact ones: u for the CPU's (float64
// sums rounded once), gamma_k = k u / (1 - k u) for a GPU's float32 SGEMM (cuda/low_rank.cu).
//   P_r = M_r Q0, summed by MPI in float32: |dP| <= (p_error + W u) A
//   P^ = the Q-factor of P: ||dP^||_F <= sqrt(2) ||R^-1||_2 ||dP||_F (QR's first-order
//        perturbation bound, R the R-factor; ||R^-1||_2 <= ||R^-1||_F), plus P^'s own rounding
//        to float32, u sqrt(r) (its columns are unit vectors)
//   Q = sum_r M_r^T P^: ||dQ||_F <= sum_r ||M_r||_F ||dP^||_F + (q_error + W u) ||B||_F,
//        B = sum_r |M_r|^T |P^|
//   out = P^ Q^T rounded: ||dout||_F <= ||dP^||_F ||Q||_F + ||P^||_F ||dQ||_F + u ||out||_F
// The float64 accumulations add (length) 2^-53 relative to the same sums: far below.
struct Reference {
  std::vector<double> out;
  double bound = 0;
};

inline Reference reference_step(const std::vector<float>& mine, std::size_t rows, std::size_t cols,
                                std::size_t r, const std::vector<float>& q0, double p_error = kU,
                                double q_error = kU) {
  const std::size_t n = rows * cols;
  const std::vector<float> all = gather(mine);
  const auto W = static_cast<std::size_t>(size());
  std::vector<double> S(n, 0.0);
  for (std::size_t w = 0; w < W; ++w) {
    for (std::size_t i = 0; i < n; ++i) S[i] += all[w * n + i];
  }
  std::vector<double> P(rows * r, 0.0), A(rows * r, 0.0);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < r; ++j) {
      for (std::size_t k = 0; k < cols; ++k) {
        P[i * r + j] += S[i * cols + k] * q0[k * r + j];
        for (std::size_t w = 0; w < W; ++w) {
          A[i * r + j] += std::fabs(all[w * n + i * cols + k] * double(q0[k * r + j]));
        }
      }
    }
  }
  std::vector<double> R;
  const std::vector<double> Ph = gram_schmidt(P, rows, r, R);
  std::vector<double> Q(cols * r, 0.0), B(cols * r, 0.0);
  for (std::size_t k = 0; k < cols; ++k) {
    for (std::size_t j = 0; j < r; ++j) {
      for (std::size_t i = 0; i < rows; ++i) {
        Q[k * r + j] += S[i * cols + k] * Ph[i * r + j];
        for (std::size_t w = 0; w < W; ++w) {
          B[k * r + j] += std::fabs(all[w * n + i * cols + k] * Ph[i * r + j]);
        }
      }
    }
  }
  Reference ref;
  ref.out.assign(n, 0.0);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < cols; ++k) {
      for (std::size_t j = 0; j < r; ++j) ref.out[i * cols + k] += Ph[i * r + j] * Q[k * r + j];
    }
  }
  double sum_m = 0;
  for (std::size_t w = 0; w < W; ++w) {
    double ss = 0;
    for (std::size_t i = 0; i < n; ++i) ss += double(all[w * n + i]) * all[w * n + i];
    sum_m += std::sqrt(ss);
  }
  const double dP = (p_error + W * kU) * frob(A);
  const double dPh = std::sqrt(2.0) * inverse_norm(R, r) * dP + kU * std::sqrt(double(r));
  const double dQ = sum_m * dPh + (q_error + W * kU) * frob(B);
  ref.bound = 1.1 * (dPh * frob(Q) + frob(Ph) * dQ + kU * frob(ref.out));
  return ref;
}

}  // namespace gcomp::test
