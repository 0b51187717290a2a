// Files of the gcomp tool (see array_file.hpp): byte I/O with messages that name the file, and the
// .npy reader (a small parser of the header's Python dict literal) and writer.
#include "array_file.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

namespace gcomp::tools {

static_assert(std::endian::native == std::endian::little,
              "the gcomp tool needs a little-endian host");

namespace {

constexpr std::string_view kNpyMagic{"\x93NUMPY", 6};

[[noreturn]] void fail(const std::string& name, const std::string& why) {
  throw InputError(name + ": " + why);
}

// A value of the Python literal that is an .npy header: {'descr': '<f4', 'fortran_order': False,
// 'shape': (3, 4), }. Containers hold their items; a dict holds key, value, key, value, ...
struct Literal {
  enum class Kind { string, integer, boolean, none, tuple, list, dict } kind = Kind::none;
  std::string text;  // the source text, for messages
  std::string str;   // string: the contents
  std::uint64_t num = 0;
  bool negative = false;  // integer: the value is -num
  bool truth = false;     // boolean
  std::vector<Literal> items;
};

class LiteralParser {
 public:
  LiteralParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  Literal parse() {
    Literal v = value(0);
    skip_space();
    if (pos_ != s_.size()) err("unexpected text after the header dict");
    return v;
  }

 private:
  [[noreturn]] void err(const std::string& why) const {
    fail(name_, "bad .npy header: " + why + " at offset " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  char peek() {
    skip_space();
    if (pos_ == s_.size()) err("the header ends early");
    return s_[pos_];
  }

  Literal value(int depth) {
    if (depth > 16) err("nesting too deep");
    const char c = peek();
    const std::size_t start = pos_;
    Literal v;
    if (c == '\'' || c == '"') {
      v.kind = Literal::Kind::string;
      ++pos_;
      while (pos_ < s_.size() && s_[pos_] != c) {
        if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
        v.str += s_[pos_++];
      }
      if (pos_ == s_.size()) err("unterminated string");
      ++pos_;
    } else if (c == '(' || c == '[' || c == '{') {
      v = sequence(c, depth);
    } else if (c == '-' || c == '+' || (c >= '0' && c <= '9')) {
      v.kind = Literal::Kind::integer;
      v.negative = c == '-';
      if (c == '-' || c == '+') ++pos_;
      const char* first = s_.data() + pos_;
      const auto [ptr, ec] = std::from_chars(first, s_.data() + s_.size(), v.num);
      if (ec == std::errc::result_out_of_range) err("integer out of range");
      if (ec != std::errc()) err("bad integer");
      pos_ += static_cast<std::size_t>(ptr - first);
    } else {
      std::size_t end = pos_;
      while (end < s_.size() && ((s_[end] >= 'a' && s_[end] <= 'z') ||
                                 (s_[end] >= 'A' && s_[end] <= 'Z') || s_[end] == '_')) {
        ++end;
      }
      const std::string_view word = s_.substr(pos_, end - pos_);
      if (word == "True" || word == "False") {
        v.kind = Literal::Kind::boolean;
        v.truth = word == "True";
      } else if (word != "None") {
        err("unexpected '" + std::string(word.empty() ? s_.substr(pos_, 1) : word) + "'");
      }
      pos_ = end;
    }
    v.text = std::string(s_.substr(start, pos_ - start));
    return v;
  }

  Literal sequence(char open, int depth) {
    const char close = open == '(' ? ')' : open == '[' ? ']' : '}';
    Literal v;
    v.kind = open == '('   ? Literal::Kind::tuple
             : open == '[' ? Literal::Kind::list
                           : Literal::Kind::dict;
    ++pos_;
    bool comma = false;
    while (peek() != close) {
      v.items.push_back(value(depth + 1));
      if (v.kind == Literal::Kind::dict) {
        if (peek() != ':') err("expected ':'");
        ++pos_;
        v.items.push_back(value(depth + 1));
      }
      if (peek() == ',') {
        comma = true;
        ++pos_;
      } else if (peek() != close) {
        err(std::string("expected ',' or '") + close + "'");
      }
    }
    ++pos_;
    // "(x)" without a comma is x in parentheses, not a tuple.
    if (v.kind == Literal::Kind::tuple && v.items.size() == 1 && !comma) return v.items[0];
    return v;
  }

  std::string_view s_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

std::uint64_t load_le(const std::byte* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

std::vector<float> floats_of(const std::byte* data, std::size_t n) {
  std::vector<float> x(n);
  if (n != 0) std::memcpy(x.data(), data, n * sizeof(float));
  return x;
}

}  // namespace

std::uint64_t stream_read_limit() {
  double memory =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    memory = memory > 0 ? std::min(memory, static_cast<double>(as.rlim_cur))
                        : static_cast<double>(as.rlim_cur);
  }
  constexpr std::uint64_t kFloor = std::uint64_t{64} << 20;
  return memory > 4.0 * static_cast<double>(kFloor) ? static_cast<std::uint64_t>(memory / 4)
                                                    : kFloor;
}

std::optional<std::uint64_t> payload_declared_size(std::span<const std::byte> prefix) {
  constexpr std::size_t kFixed = 16;  // magic, version, codec, P, S, n (docs/wire-format.md)
  if (prefix.size() < kFixed) return std::nullopt;
  if (std::memcmp(prefix.data(), "GCMP", 4) != 0) return prefix.size();
  const auto params = std::to_integer<std::size_t>(prefix[6]);
  const auto sections = std::to_integer<std::size_t>(prefix[7]);
  const std::size_t header = kFixed + params + 8 * sections + 4;
  if (prefix.size() < header) return std::nullopt;
  std::uint64_t total = header;
  for (std::size_t s = 0; s < sections; ++s) {
    const std::uint64_t len = load_le(prefix.data() + kFixed + params + 8 * s, 8);
    total = len > UINT64_MAX - total ? UINT64_MAX : total + len;
  }
  return total;
}

std::vector<std::byte> read_bytes(const std::string& path, const DeclaredSize& declared) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  struct stat st {};
  const bool regular = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
  // Regular files: their size, plus one byte to see one that grew. Streams: the first MiB, then
  // what it declares, or the limit.
  std::uint64_t want =
      regular ? static_cast<std::uint64_t>(st.st_size) + 1 : std::uint64_t{1} << 20;
  const std::uint64_t limit = regular ? want : stream_read_limit();
  bool asked = regular;
  std::vector<std::byte> bytes;
  std::size_t got = 0;
  while (true) {
    const std::uint64_t target =
        std::min<std::uint64_t>(want, got + (std::uint64_t{64} << 20) + got / 2);
    try {
      bytes.resize(static_cast<std::size_t>(target));
    } catch (const std::exception&) {
      fail(path, "cannot hold " + std::to_string(target) + " bytes in memory");
    }
    const std::size_t r = std::fread(bytes.data() + got, 1, bytes.size() - got, f);
    got += r;
    if (got < bytes.size()) {
      if (std::ferror(f)) fail(path, std::string("cannot read: ") + std::strerror(errno));
      break;  // the end
    }
    if (got < want) continue;
    if (!asked) {
      asked = true;
      const std::optional<std::uint64_t> d =
          declared ? declared(std::span<const std::byte>(bytes.data(), got)) : std::nullopt;
      want = d ? std::min(*d == UINT64_MAX ? *d : *d + 1, limit + 1) : limit + 1;
      if (want > got) continue;
      break;
    }
    if (!regular && got > limit) {
      fail(path, "more than " + std::to_string(limit) +
                     " bytes without an end (the most gcomp reads from a stream of no declared "
                     "size: a quarter of the memory it may use)");
    }
    break;
  }
  bytes.resize(got);
  return bytes;
}

void write_bytes(const std::string& path, std::span<const std::byte> bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int error = errno;
  if (std::fclose(f) != 0 || !ok) {
    throw std::runtime_error(path + ": cannot write: " + std::strerror(ok ? errno : error));
  }
}

bool is_npy(std::string_view path, std::span<const std::byte> bytes) {
  if (path.ends_with(".npy")) return true;
  return bytes.size() >= kNpyMagic.size() &&
         std::memcmp(bytes.data(), kNpyMagic.data(), kNpyMagic.size()) == 0;
}

std::vector<float> parse_npy(std::span<const std::byte> bytes, const std::string& name) {
  const std::size_t size = bytes.size();
  if (size < kNpyMagic.size() || std::memcmp(bytes.data(), kNpyMagic.data(), kNpyMagic.size())) {
    fail(name, "not a .npy file (no \\x93NUMPY magic)");
  }
  if (size < 8) fail(name, "truncated .npy header");
  const int major = std::to_integer<int>(bytes[6]);
  const int minor = std::to_integer<int>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    fail(name, "unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor));
  }
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  const std::size_t start = 8 + len_bytes;
  if (size < start) fail(name, "truncated .npy header");
  const std::uint64_t header_len = load_le(bytes.data() + 8, static_cast<int>(len_bytes));
  if (header_len > size - start) {
    fail(name, "truncated .npy header: it claims " + std::to_string(header_len) + " bytes, " +
                   std::to_string(size - start) + " follow");
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + start), header_len);
  const Literal dict = LiteralParser(header, name).parse();
  if (dict.kind != Literal::Kind::dict) fail(name, "bad .npy header: not a dict");

  const Literal* descr = nullptr;
  const Literal* fortran = nullptr;
  const Literal* shape = nullptr;
  for (std::size_t i = 0; i < dict.items.size(); i += 2) {
    const Literal& key = dict.items[i];
    const Literal** slot = nullptr;
    if (key.kind == Literal::Kind::string) {
      slot = key.str == "descr"           ? &descr
             : key.str == "fortran_order" ? &fortran
             : key.str == "shape"         ? &shape
                                          : nullptr;
    }
    if (!slot) fail(name, "bad .npy header: unexpected key " + key.text);
    if (*slot) fail(name, "bad .npy header: key " + key.text + " given twice");
    *slot = &dict.items[i + 1];
  }
  if (!descr) fail(name, "bad .npy header: no 'descr'");
  if (!fortran) fail(name, "bad .npy header: no 'fortran_order'");
  if (!shape) fail(name, "bad .npy header: no 'shape'");

  if (descr->kind != Literal::Kind::string || descr->str != "<f4") {
    if (descr->kind == Literal::Kind::string && descr->str == ">f4") {
      fail(name, "dtype '>f4' is big-endian float32 (only '<f4' is accepted)");
    }
    fail(name, "dtype " + descr->text + " is not float32");
  }
  if (fortran->kind != Literal::Kind::boolean) {
    fail(name, "bad .npy header: fortran_order " + fortran->text + " is not True or False");
  }
  if (shape->kind != Literal::Kind::tuple) fail(name, "shape " + shape->text + " is not a tuple");
  std::uint64_t n = 1;
  for (const Literal& d : shape->items) {
    if (d.kind != Literal::Kind::integer || d.negative) {
      fail(name, "shape " + shape->text + " holds something other than a non-negative integer");
    }
    if (d.num != 0 && n > std::numeric_limits<std::uint64_t>::max() / 4 / d.num) {
      fail(name, "shape " + shape->text + " is too large");
    }
    n *= d.num;
  }
  if (fortran->truth && shape->items.size() > 1) {
    fail(name, "fortran_order arrays of more than one dimension are not supported (shape " +
                   shape->text + ")");
  }
  const std::size_t offset = start + header_len;
  const std::uint64_t need = 4 * n;
  const std::size_t have = size - offset;
  if (have < need) {
    fail(name, "truncated data: shape " + shape->text + " needs " + std::to_string(need) +
                   " bytes, " + std::to_string(have) + " follow the header");
  }
  if (have > need) {
    fail(name, std::to_string(have) + " data bytes follow the header but shape " + shape->text +
                   " needs " + std::to_string(need));
  }
  return floats_of(bytes.data() + offset, n);
}

std::vector<std::byte> format_npy(std::span<const float> x) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(x.size()) + ",), }";
  // As numpy does: pad with spaces so that magic, version, length and header end on a multiple
  // of 64 bytes, the last byte being '\n'.
  const std::size_t unpadded = kNpyMagic.size() + 4 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::vector<std::byte> out(kNpyMagic.size() + 4 + header.size() + x.size() * sizeof(float));
  std::byte* p = out.data();
  std::memcpy(p, kNpyMagic.data(), kNpyMagic.size());
  p += kNpyMagic.size();
  *p++ = std::byte{1};
  *p++ = std::byte{0};
  *p++ = static_cast<std::byte>(header.size() & 0xff);
  *p++ = static_cast<std::byte>(header.size() >> 8);
  std::memcpy(p, header.data(), header.size());
  p += header.size();
  if (!x.empty()) std::memcpy(p, x.data(), x.size() * sizeof(float));
  return out;
}

std::vector<float> read_array(const std::string& path) {
  // A stream that is not an .npy (by its name or its first bytes) stops at its first bytes: the
  // parser then says why. Raw float32 declares nothing.
  const std::vector<std::byte> bytes = read_bytes(path, [&](std::span<const std::byte> prefix) {
    return path.ends_with(".npy") && !is_npy("", prefix)
               ? std::optional<std::uint64_t>(prefix.size())
               : std::nullopt;
  });
  if (is_npy(path, bytes)) return parse_npy(bytes, path);
  if (bytes.size() % 4 != 0) {
    fail(path, "size " + std::to_string(bytes.size()) +
                   " bytes is not a multiple of 4 (raw float32 expected)");
  }
  return floats_of(bytes.data(), bytes.size() / 4);
}

void write_array(const std::string& path, std::span<const float> x) {
  if (path.ends_with(".npy")) {
    write_bytes(path, format_npy(x));
  } else {
    write_bytes(path, std::as_bytes(x));
  }
}

}  // namespace gcomp::tools
