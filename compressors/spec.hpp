// Spec strings: "name[:key=value[,key=value...]]". SpecReader splits one and hands out typed,
// range-checked values; every complaint names the whole spec and the bad part, and finish()
// rejects keys nobody asked for, so a typo is never a silent default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gcomp::detail {

class SpecReader {
 public:
  explicit SpecReader(std::string_view spec);

  const std::string& name() const noexcept { return name_; }
  bool has(std::string_view key) const noexcept;

  // A finite real in the range; lo/hi are inclusive unless the *_open flag says otherwise.
  std::optional<double> real(std::string_view key, double lo, bool lo_open, double hi,
                             bool hi_open);
  // An integer in [lo, hi].
  std::optional<std::uint64_t> integer(std::string_view key, std::uint64_t lo, std::uint64_t hi);
  // "true"/"false" (also 1/0).
  std::optional<bool> boolean(std::string_view key);
  // One of the given words.
  std::optional<std::string> choice(std::string_view key, const std::vector<std::string>& options);

  // Throws for any key that no accessor read.
  void finish() const;

  [[noreturn]] void fail(const std::string& what) const;

 private:
  const std::string* value(std::string_view key);

  std::string text_;
  std::string name_;
  std::vector<std::pair<std::string, std::string>> keys_;
  std::vector<bool> used_;
};

// Shortest decimal text that reads back to the same double ("0.01", "2.5").
std::string format_real(double v);

}  // namespace gcomp::detail
