// What measuring a codec's speeds takes, for the cost model's measure_compute (cost_model.cpp)
// and the rows whose model counts other work than the codec's encode and decode_add
// (AlgorithmRow::measure): the input, its size, the timing and device memory.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

#include "device_backend.hpp"
#include "gcomp/collective_types.hpp"

namespace gcomp::detail {

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The mean of run()'s seconds (run times what it measures and returns it) over runs that add
// up to at least `window` seconds, and at least `min_runs`, after one untimed run (first-use
// allocations). The mean, not the best run: ranks sharing a node measure at the same time, and
// where they outnumber its cores a run shorter than a time slice often has a core to itself,
// which the calls it predicts will not.
template <class Run>
double mean_seconds(Run&& run, double window, int min_runs) {
  run();
  double total = 0;
  int runs = 0;
  while (runs < min_runs || total < window) {
    total += run();
    ++runs;
  }
  return total / runs;
}

// n roughly normal values, the same on every rank and every run (a prefix of a longer input is
// the shorter input).
std::vector<float> calibration_input(std::size_t n);

// The size a measurement for calls of n elements runs at: n within [64K, 16M].
std::size_t calibration_size(std::size_t n);

// Seconds per unit of encode (its mean over runs of a 20 ms window) and of decode (10 ms), each
// returning when its work is done.
ComputeModel time_per_unit(double units, const std::function<void()>& encode,
                           const std::function<void()>& decode);

// Device memory from `dev`, freed on every way out.
struct DeviceMemory {
  const DeviceBackend* dev;
  void* p;
  DeviceMemory(const DeviceBackend* d, std::size_t bytes) : dev(d), p(d->alloc(bytes)) {}
  ~DeviceMemory() { dev->free(p); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

}  // namespace gcomp::detail
