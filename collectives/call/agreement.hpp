// The agreement: the one small allreduce before every collective (communicator.cpp, step 2).
// Every rank contributes an Agreement; MAX over int64 gives every rank the same combined one,
// from which each learns whether all agree on the call (a hash), whether any rank failed (and
// the first that did), the largest payload, and the slowest codec speeds.
//
// Every field is combined with MPI_MAX on int64 (a built-in operation MPICH runs on its fast
// path) and kept in [0, 2^63): Debian's MPICH 4.0.2 compares MPI_UINT64_T as signed in MPI_MAX.
// The fields: a 63-bit hash and its 63-bit complement (their maxima are each other's complements
// iff all ranks hold the same hash), the complement of the first failure (status << 32 | rank,
// so the MAX of the complement is the MIN of the failure; zero when the rank is fine), and the
// maxima of the payload sizes and of the codec speeds (non-negative doubles order like their
// bits, whose top bit is zero), and the largest magnitude any rank sends when the call is not
// compressed (float bits, ordered like |value|), which tells every rank alike that the sum
// cannot overflow and needs no check after the collective.
#pragma once

#include <bit>
#include <cstdint>
#include <string>

#include "bytes.hpp"
#include "gcomp/error.hpp"

namespace gcomp::detail {

struct Agreement {
  std::uint64_t sig;
  std::uint64_t not_sig;
  std::uint64_t not_fail;
  std::uint64_t sent;             // entries a sparse payload holds
  std::uint64_t bytes;            // whole-tensor payload bytes
  std::uint64_t encode;           // the codec's encode seconds per element (double bits)
  std::uint64_t decode;           // decode seconds per element or entry (double bits)
  std::uint64_t learned_key;      // the previous call's (codec, size, algorithm) key
  std::uint64_t learned_seconds;  // and its seconds on this rank (double bits)
  std::uint64_t state;            // a hash of the algorithms' states of the tensor
  std::uint64_t not_state;
  std::uint64_t magnitude;  // max |value| sent uncompressed (float bits); kNotMeasured

  // This rank's hash of what must agree.
  void seal(std::uint64_t signature);
  // This rank cannot take part: it failed with `status`.
  void fail(Status status, int rank);
  bool same_signature() const;
  // The algorithms' states of the tensor this rank holds (StateStore::States::signature).
  void seal_state(std::uint64_t signature);
  bool same_state() const;
  bool any_failed() const { return not_fail != 0; }
  // The first failure: the lowest status, then the lowest rank.
  Status failed_status() const;
  int failed_rank() const;
};
static_assert(sizeof(Agreement) % 8 == 0);

// Agreement::magnitude of a rank that did not measure it (the bits of +Inf: the largest).
inline constexpr std::uint64_t kNotMeasured = kInfBits;

// Whether a float32 sum over `ranks` contributions, each at most the agreed `magnitude` in
// absolute value, is finite in any order of addition: ranks * magnitude <= FLT_MAX / 2. (The
// exact sum is at most ranks * magnitude; the roundings of ranks - 1 additions grow it by at most
// (1 + 2^-24)^(ranks - 1), under 1.07 for a million ranks, well inside the factor 2.)
bool sum_cannot_overflow(int ranks, std::uint64_t magnitude);

// Checks the combined agreement of a call on n elements among `ranks` ranks before anything
// reads it (it is the MAX of bytes that came from other ranks): a failure names a known status
// and a rank below `ranks`; the speeds are non-negative (or +Inf, "measure"), the learned seconds
// finite and non-negative; no rank holds more sparse entries than n, nor a payload larger than
// the codec can make of n elements (max_bytes). Every rank holds the same bits, so every rank
// passes or throws alike: Error(bad_payload) naming the field.
void check_agreed(const Agreement& all, int ranks, std::uint64_t n, std::uint64_t max_bytes);
// Its first part: a failure, where one is reported, of a known status and a rank below `ranks`.
void check_failure(const Agreement& all, int ranks);

// Non-negative doubles as fields (their bits order as they do), and back.
inline std::uint64_t dbits(double v) { return std::bit_cast<std::uint64_t>(v > 0 ? v : 0.0); }
inline double bitsd(std::uint64_t v) { return std::bit_cast<double>(v); }

}  // namespace gcomp::detail
