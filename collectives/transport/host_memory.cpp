// Memory the ranks of one host share (host_memory.hpp).
#include "host_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace gcomp::detail {

namespace {

// Before the data: one 64-byte line per rank of the host, where each writes a token the others
// check.
constexpr std::size_t kLine = 64;

std::uint64_t token_of(std::uint64_t base, int rank) {
  return base ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1));
}

}  // namespace

std::unique_ptr<HostMemory> HostMemory::make(Net& host, std::size_t bytes) {
  const int me = host.rank(), ranks = host.size();
  const std::size_t header = kLine * static_cast<std::size_t>(ranks);
  const std::size_t mapped = header + bytes;
  // Rank 0 makes the object and tells the others its name and a token base.
  std::string name;
  std::uint64_t base = 0;
  int fd = -1;
  if (me == 0) {
    std::random_device rd;
    base = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    name = "/gcomp-host-" + std::to_string(getpid()) + "-" + std::to_string(base);
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      close(fd);
      shm_unlink(name.c_str());
      fd = -1;
    }
    if (fd < 0) name.clear();  // nothing to attach to: the others fail too
  }
  std::vector<std::byte> said(8 + name.size());
  std::memcpy(said.data(), &base, 8);
  std::memcpy(said.data() + 8, name.data(), name.size());
  Gathered all;
  Traffic t;
  host.allgatherv_bytes(me == 0 ? std::span<const std::byte>(said) : std::span<const std::byte>(),
                        all, t);
  const auto from0 = all.of(0);
  bool ok = from0.size() > 8;
  if (ok) {
    std::memcpy(&base, from0.data(), 8);
    name.assign(reinterpret_cast<const char*>(from0.data()) + 8, from0.size() - 8);
    if (me != 0) fd = shm_open(name.c_str(), O_RDWR, 0600);
    ok = fd >= 0;
  }
  void* map = MAP_FAILED;
  if (ok) {
    map = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ok = map != MAP_FAILED;
  }
  if (fd >= 0) close(fd);
  // Each rank's token in its line; after a barrier every rank reads all of them.
  if (ok) {
    const std::uint64_t mine = token_of(base, me);
    std::memcpy(static_cast<std::byte*>(map) + kLine * static_cast<std::size_t>(me), &mine, 8);
  }
  host.barrier();
  if (ok) {
    for (int r = 0; r < ranks; ++r) {
      std::uint64_t got = 0;
      std::memcpy(&got, static_cast<std::byte*>(map) + kLine * static_cast<std::size_t>(r), 8);
      ok = ok && got == token_of(base, r);
    }
  }
  const std::int64_t failed = ok ? 0 : 1;
  std::int64_t any = 0;
  host.allreduce(&failed, &any, 1, Reduction::max_int64);
  if (me == 0 && !name.empty()) shm_unlink(name.c_str());  // every rank has mapped it, or failed
  if (any != 0) {
    if (map != MAP_FAILED) munmap(map, mapped);
    return nullptr;
  }
  return std::unique_ptr<HostMemory>(
      new HostMemory(map, mapped, static_cast<std::byte*>(map) + header, bytes));
}

HostMemory::~HostMemory() { munmap(map_, mapped_); }

}  // namespace gcomp::detail
