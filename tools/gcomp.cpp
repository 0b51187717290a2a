// The gcomp command-line tool: lists the codecs, encodes float32 arrays into payload files,
// decodes and inspects payloads, and evaluates a codec on an array (ratio, error, throughput,
// error feedback). Reference and exit codes: docs/cli.md.
#include "gcomp/gcomp.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "array_file.hpp"
#include "gcomp/codec.hpp"

namespace gcomp::tools {
namespace {

constexpr int kExitFailure = 1;   // anything else: output not writable, out of memory, internal
constexpr int kExitBadInput = 2;  // usage errors and bad input: files, specs, payloads, values

// Runs f; a gcomp::Error it throws comes back with "path: " in front of its message.
template <class F>
auto naming(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
}

// The whole payload file, validated in full by inspect().
std::vector<std::byte> read_payload(const std::string& path, PayloadInfo* info) {
  std::vector<std::byte> bytes = read_bytes(path, payload_declared_size);
  *info = naming(path, [&] { return inspect(bytes); });
  return bytes;
}

// n zeros for a decode. A valid sparse payload may describe more elements than memory holds:
// refuse those up front rather than let the allocation fail or the zero-fill meet the OOM killer.
std::vector<float> zeros(const std::string& path, std::uint64_t n) {
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const std::string what = path + ": cannot allocate " + std::to_string(n) + " decoded floats";
  if (memory > 0 && 4.0 * static_cast<double>(n) > memory) {
    throw std::runtime_error(what + " (more than the machine's memory)");
  }
  try {
    return std::vector<float>(n);
  } catch (const std::exception&) {
    throw std::runtime_error(what);
  }
}

double norm(std::span<const float> x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

double distance(std::span<const float> x, std::span<const float> y) {
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - y[i];
    s += d * d;
  }
  return std::sqrt(s);
}

double relative(double err, double ref) { return ref > 0 ? err / ref : err == 0 ? 0 : INFINITY; }

// Median seconds of `reps` calls of f.
template <class F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
}

void cmd_list() {
  for (const CodecDescription& c : codec_catalog()) {
    std::printf("%s\n  %s\n", c.name.c_str(), c.summary.c_str());
    for (const SpecKey& k : c.keys) {
      const std::string def =
          k.default_value.empty() ? "(no default)" : "default " + k.default_value;
      std::printf("    %-8s %-14s %s\n", k.name.c_str(), def.c_str(), k.help.c_str());
    }
  }
}

void cmd_encode(const std::string& spec, std::uint64_t seed, const std::string& in,
                const std::string& out) {
  const Codec codec(spec);
  const std::vector<float> x = read_array(in);
  write_bytes(out, naming(in, [&] { return codec.encode(x, seed); }));
}

void cmd_decode(const std::string& in, const std::string& out) {
  PayloadInfo info;
  const std::vector<std::byte> payload = read_payload(in, &info);
  std::vector<float> x = zeros(in, info.elements);
  naming(in, [&] { decode_add(payload, x, 1.0f); });
  write_array(out, x);
}

void cmd_inspect(const std::string& in) {
  PayloadInfo info;
  read_payload(in, &info);
  std::string sections;
  for (std::uint64_t s : info.sections)
    sections += (sections.empty() ? "" : " ") + std::to_string(s);
  std::printf("codec:        %s\n", codec_name(info.kind));
  std::printf("version:      %d\n", info.version);
  std::printf("elements:     %llu\n", static_cast<unsigned long long>(info.elements));
  std::printf("params:       %s\n", info.params.c_str());
  std::printf("sections:     %s\n", sections.empty() ? "(none)" : sections.c_str());
  std::printf("header bytes: %zu\n", info.header_bytes);
  std::printf("total bytes:  %zu\n", info.total_bytes);
  std::printf("ratio:        %.3f\n",
              4.0 * static_cast<double>(info.elements) / static_cast<double>(info.total_bytes));
}

struct EvalOptions {
  std::string spec;
  std::uint64_t seed = 0;
  bool ef = false;
  std::uint64_t steps = 10;
  int threads = 0;  // 0: the library's default
  int reps = 7;
};

void cmd_eval(const EvalOptions& o, const std::string& in) {
  const Codec codec(o.spec);
  if (o.threads > 0) set_num_threads(o.threads);
  const std::vector<float> x = read_array(in);
  if (x.empty()) throw InputError(in + ": the array has no elements");
  const std::size_t n = x.size();
  const double x_norm = norm(x);
  const double gbytes = 4.0 * static_cast<double>(n) / 1e9;

  // One encode and decode for the numbers, then timed repetitions into the same buffers.
  std::vector<std::byte> out(codec.max_bytes(n));
  std::size_t bytes = naming(in, [&] { return codec.encode(x, o.seed, out); });
  std::vector<float> acc(n, 0.0f);
  decode_add({out.data(), bytes}, acc, 1.0f);
  const double err = relative(distance(x, acc), x_norm);
  const double t_enc = median_seconds(o.reps, [&] { bytes = codec.encode(x, o.seed, out); });
  const double t_dec = median_seconds(o.reps, [&] { decode_add({out.data(), bytes}, acc, 1.0f); });

  std::printf("codec:           %s\n", codec.spec().c_str());
  std::printf("elements:        %zu\n", n);
  std::printf("payload bytes:   %zu\n", bytes);
  std::printf("ratio:           %.3f\n", 4.0 * static_cast<double>(n) / static_cast<double>(bytes));
  std::printf("relative error:  %.6g\n", err);
  std::printf("encode:          %.3f GB/s\n", gbytes / t_enc);
  std::printf("decode_add:      %.3f GB/s\n", gbytes / t_dec);
  std::printf("threads:         %d\n", num_threads());
  std::printf("repetitions:     %d (median time reported)\n", o.reps);
  if (!o.ef) return;

  // T steps of error feedback on the same x: the mean of the decodes is x - e_T / T.
  ErrorFeedback ef(n);
  std::vector<double> sum(n, 0.0);
  double first = 0;
  for (std::uint64_t t = 0; t < o.steps; ++t) {
    bytes = naming(in, [&] { return codec.encode_ef(ef, x, o.seed + t, out); });
    std::fill(acc.begin(), acc.end(), 0.0f);
    decode_add({out.data(), bytes}, acc, 1.0f);
    if (t == 0) first = relative(distance(x, acc), x_norm);
    for (std::size_t i = 0; i < n; ++i) sum[i] += acc[i];
  }
  double mean_err = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = x[i] - sum[i] / static_cast<double>(o.steps);
    mean_err += d * d;
  }
  std::printf("ef steps:        %llu\n", static_cast<unsigned long long>(o.steps));
  std::printf("ef step 1 error: %.6g\n", first);
  std::printf("ef mean error:   %.6g\n", relative(std::sqrt(mean_err), x_norm));
  std::printf("ef residual:     %.6g\n", relative(norm(ef.residual()), x_norm));
}

void print_error(std::string message) {
  std::replace(message.begin(), message.end(), '\n', ' ');
  std::replace(message.begin(), message.end(), '\r', ' ');
  std::fprintf(stderr, "gcomp: %s\n", message.c_str());
}

int exit_code(Status s) {
  switch (s) {
    case Status::invalid_argument:
    case Status::bad_payload:
    case Status::nonfinite:
    case Status::mismatch:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

// CLI11 lets strtoull wrap "-1" and saturate "2^64"; seeds must be exact.
const CLI::Validator kUint64(
    [](std::string& s) -> std::string {
      std::uint64_t v = 0;
      const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec == std::errc() && ptr == s.data() + s.size()) return "";
      return "'" + s + "' is not an integer in 0..18446744073709551615";
    },
    "");

int run(int argc, char** argv) {
  CLI::App app{"gcomp: gradient compression (codec specs: `gcomp list`)", "gcomp"};
  app.set_version_flag("--version", std::string("gcomp ") + gcomp_version());
  app.require_subcommand(1);

  std::string in, out;
  EvalOptions eo;
  CLI::App* list = app.add_subcommand("list", "List the codecs, their keys and defaults");
  CLI::App* encode =
      app.add_subcommand("encode", "Encode a float32 array (raw or .npy) into a payload");
  encode->add_option("--spec", eo.spec, "Codec spec, e.g. topk:ratio=0.01")->required();
  encode->add_option("--seed", eo.seed, "Seed of the stochastic codecs")
      ->check(kUint64)
      ->default_val(0);
  encode->add_option("IN", in, "Input: raw little-endian float32 or .npy '<f4'")->required();
  encode->add_option("OUT", out, "Output payload file")->required();
  CLI::App* decode = app.add_subcommand("decode", "Decode a payload into float32 (raw or .npy)");
  decode->add_option("IN", in, "Input payload file")->required();
  decode->add_option("OUT", out, "Output: a 1-D .npy when the name ends in .npy, else raw")
      ->required();
  CLI::App* insp = app.add_subcommand("inspect", "Validate a payload and print its header");
  insp->add_option("IN", in, "Payload file")->required();
  CLI::App* eval = app.add_subcommand("eval", "Ratio, error and throughput of a codec on an array");
  eval->add_option("--spec", eo.spec, "Codec spec, e.g. qsgd:bits=4")->required();
  eval->add_option("--seed", eo.seed, "Seed (error feedback: seed + step)")
      ->check(kUint64)
      ->default_val(0);
  CLI::Option* ef = eval->add_flag("--ef", eo.ef, "Also run error feedback for --steps steps");
  eval->add_option("--steps", eo.steps, "Error-feedback steps")
      ->default_val(10)
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32))
      ->needs(ef);
  eval->add_option("--threads", eo.threads, "Library threads (default: GCOMP_NUM_THREADS or 1)")
      ->check(CLI::Range(1, 4096));
  eval->add_option("--reps", eo.reps, "Timed repetitions (the median is reported)")
      ->default_val(7)
      ->check(CLI::Range(1, 100000));
  eval->add_option("IN", in, "Input: raw little-endian float32 or .npy '<f4'")->required();

  const auto known = [&](const char* name) {
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(name)) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
    print_error(std::string("unknown subcommand '") + argv[1] +
                "' (expected list, encode, decode, inspect or eval)");
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    print_error(std::string(e.what()) + " (see gcomp --help)");
    return kExitBadInput;
  }

  try {
    check_environment();  // a bad GCOMP_* variable is reported as such, not as a file's fault
    if (list->parsed()) cmd_list();
    if (encode->parsed()) cmd_encode(eo.spec, eo.seed, in, out);
    if (decode->parsed()) cmd_decode(in, out);
    if (insp->parsed()) cmd_inspect(in);
    if (eval->parsed()) cmd_eval(eo, in);
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      print_error("cannot write to standard output");
      return kExitFailure;
    }
    return 0;
  } catch (const InputError& e) {
    print_error(e.what());
    return kExitBadInput;
  } catch (const Error& e) {
    print_error(e.what());
    return exit_code(e.code());
  } catch (const std::bad_alloc&) {
    print_error("out of memory");
    return kExitFailure;
  } catch (const std::exception& e) {
    print_error(e.what());
    return kExitFailure;
  }
}

}  // namespace
}  // namespace gcomp::tools

int main(int argc, char** argv) { return gcomp::tools::run(argc, argv); }
