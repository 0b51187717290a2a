// Files of the gcomp tool: whole-file byte I/O and float32 arrays stored raw (little-endian) or as
// .npy (versions 1.0, 2.0 and 3.0 read, '<f4' only; 1-D version 1.0 written).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gcomp::tools {

// A file that cannot be read or does not hold what it should. The message names the file:
// "data.npy: dtype '<f8' is not float32".
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a file's first bytes say of its whole size: nullopt when they say nothing.
using DeclaredSize = std::function<std::optional<std::uint64_t>(std::span<const std::byte> prefix)>;

// The whole file. A regular file is read to the size it has. A stream (a pipe, a device such as
// /dev/zero) does not say its size: it is read to the size its first bytes declare (`declared`,
// asked once the first MiB or the whole stream is in) and one byte beyond, so that a parser
// sees what does not fit, else to at most stream_read_limit() bytes. Throws InputError naming the
// file when it cannot be opened or read, when a stream holds more than the limit, and when its
// bytes do not fit in memory.
std::vector<std::byte> read_bytes(const std::string& path, const DeclaredSize& declared = {});

// A quarter of the memory this process may use (the smaller of the machine's physical memory and
// its address-space limit), at least 64 MiB: the most read_bytes takes from a stream of no
// declared size.
std::uint64_t stream_read_limit();

// The size a gcomp payload's header declares (kept, header and sections), from its first bytes;
// for bytes that are not a payload's start, their own size (reading stops; the parser says why).
std::optional<std::uint64_t> payload_declared_size(std::span<const std::byte> prefix);

// Writes (replaces) the file. Throws std::runtime_error naming the file on failure.
void write_bytes(const std::string& path, std::span<const std::byte> bytes);

// True when the name ends in ".npy" or the bytes start with the .npy magic "\x93NUMPY".
bool is_npy(std::string_view path, std::span<const std::byte> bytes);

// The float32 elements of an .npy file's bytes (C order; any shape, flattened). `name` prefixes
// the messages of the InputError thrown for anything but a complete little-endian float32 array.
std::vector<float> parse_npy(std::span<const std::byte> bytes, const std::string& name);

// A version 1.0 .npy file holding x as a 1-D '<f4' array.
std::vector<std::byte> format_npy(std::span<const float> x);

// Reads raw float32 or .npy (see is_npy); throws InputError.
std::vector<float> read_array(const std::string& path);

// Writes x as a 1-D .npy when the path ends in ".npy", else as raw little-endian float32.
void write_array(const std::string& path, std::span<const float> x);

}  // namespace gcomp::tools
