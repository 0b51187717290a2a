// A setting read from the environment (GCOMP_ALGORITHM, GCOMP_WAIT): unset or empty gives
// nothing; a bad value throws Error(invalid_argument) whose message starts NAME=value, then
// the parser's own (which names the text and what is known).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "gcomp/collective_types.hpp"
#include "gcomp/error.hpp"

namespace gcomp::detail {

template <class Parse>
auto env_setting(const char* name, Parse&& parse)
    -> std::optional<decltype(parse(std::string_view{}))> {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  try {
    return parse(std::string_view(value));
  } catch (const Error& e) {
    throw Error(Status::invalid_argument,
                std::string(name) + "=" + value + ": " + e.what());
  }
}

// GCOMP_ALGORITHM, read in one place for the Communicator's auto calls and the interposer.
inline std::optional<Algorithm> algorithm_setting() {
  return env_setting("GCOMP_ALGORITHM", parse_algorithm);
}

}  // namespace gcomp::detail
