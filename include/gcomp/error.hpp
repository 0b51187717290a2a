// gcomp::Error: the one exception type of the C++ API. It carries a Status (the same numbers as
// the C API's gcomp_status) and a message that names the offending value.
#pragma once

#include <stdexcept>
#include <string>

namespace gcomp {

enum class Status : int {
  ok = 0,
  invalid_argument,
  bad_payload,
  buffer_too_small,
  nonfinite,
  mpi,
  cuda,
  mismatch,
  internal,
  timeout,    // a collective waited longer than the Communicator's timeout_seconds
  transport,  // the Gloo transport failed: a connection closed (a process gone or given up)
};

// A short lowercase name of a status ("bad_payload"), for messages and logs.
const char* status_name(Status s) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Status code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Status code() const noexcept { return code_; }

 private:
  Status code_;
};

}  // namespace gcomp
