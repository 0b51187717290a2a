// Spec string parsing (see spec.hpp).
#include "spec.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "gcomp/error.hpp"

namespace gcomp::detail {

namespace {
bool valid_word(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}
}  // namespace

SpecReader::SpecReader(std::string_view spec) : text_(spec) {
  const auto colon = spec.find(':');
  name_ = std::string(spec.substr(0, colon));
  if (name_.empty()) fail("the codec name is empty");
  if (!valid_word(name_))
    fail("'" + name_ + "' is not a codec name (lowercase letters and digits)");
  if (colon == std::string_view::npos) return;
  std::string_view rest = spec.substr(colon + 1);
  if (rest.empty()) fail("nothing follows ':' (expected key=value)");
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) fail("'" + std::string(item) + "' is not key=value");
    const std::string key(item.substr(0, eq));
    const std::string val(item.substr(eq + 1));
    if (!valid_word(key)) fail("'" + key + "' is not a key name");
    if (val.empty()) fail("key '" + key + "' has an empty value");
    for (const auto& kv : keys_) {
      if (kv.first == key) fail("key '" + key + "' is given twice");
    }
    keys_.emplace_back(key, val);
    used_.push_back(false);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
}

bool SpecReader::has(std::string_view key) const noexcept {
  for (const auto& kv : keys_) {
    if (kv.first == key) return true;
  }
  return false;
}

const std::string* SpecReader::value(std::string_view key) {
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i].first == key) {
      used_[i] = true;
      return &keys_[i].second;
    }
  }
  return nullptr;
}

void SpecReader::fail(const std::string& what) const {
  throw Error(Status::invalid_argument, "invalid codec spec '" + text_ + "': " + what);
}

std::optional<double> SpecReader::real(std::string_view key, double lo, bool lo_open, double hi,
                                       bool hi_open) {
  const std::string* v = value(key);
  if (!v) return std::nullopt;
  double d = 0;
  const char* first = v->data();
  const char* last = first + v->size();
  const auto [ptr, ec] = std::from_chars(first, last, d);
  const std::string range = std::string(lo_open ? "(" : "[") + format_real(lo) + ", " +
                            format_real(hi) + (hi_open ? ")" : "]");
  if (ec != std::errc() || ptr != last || !std::isfinite(d)) {
    fail(std::string(key) + " must be a number in " + range + ", got '" + *v + "'");
  }
  const bool below = lo_open ? !(d > lo) : !(d >= lo);
  const bool above = hi_open ? !(d < hi) : !(d <= hi);
  if (below || above) fail(std::string(key) + " must be in " + range + ", got " + *v);
  return d;
}

std::optional<std::uint64_t> SpecReader::integer(std::string_view key, std::uint64_t lo,
                                                 std::uint64_t hi) {
  const std::string* v = value(key);
  if (!v) return std::nullopt;
  std::uint64_t u = 0;
  const char* first = v->data();
  const char* last = first + v->size();
  const auto [ptr, ec] = std::from_chars(first, last, u);
  if (ec != std::errc() || ptr != last || u < lo || u > hi) {
    fail(std::string(key) + " must be an integer in " + std::to_string(lo) + ".." +
         std::to_string(hi) + ", got '" + *v + "'");
  }
  return u;
}

std::optional<bool> SpecReader::boolean(std::string_view key) {
  const std::string* v = value(key);
  if (!v) return std::nullopt;
  if (*v == "true" || *v == "1") return true;
  if (*v == "false" || *v == "0") return false;
  fail(std::string(key) + " must be true or false, got '" + *v + "'");
}

std::optional<std::string> SpecReader::choice(std::string_view key,
                                              const std::vector<std::string>& options) {
  const std::string* v = value(key);
  if (!v) return std::nullopt;
  for (const auto& o : options) {
    if (*v == o) return o;
  }
  std::string list;
  for (const auto& o : options) list += (list.empty() ? "" : "|") + o;
  fail(std::string(key) + " must be one of " + list + ", got '" + *v + "'");
}

void SpecReader::finish() const {
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    if (!used_[i]) fail("unknown key '" + keys_[i].first + "' for codec '" + name_ + "'");
  }
}

std::string format_real(double v) {
  char buf[64];
  const auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc()) {
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
  }
  return std::string(buf, ptr);
}

}  // namespace gcomp::detail
