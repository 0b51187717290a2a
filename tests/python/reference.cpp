// The C++ side of the Python tests: redoes with the C++ API what a Python test did through the
// module and compares the bytes, so that the binding is shown to pass everything through.
//
//   gcomp_python_reference ef DIR
//       DIR/case.txt holds "spec seed steps"; DIR/x<t>.npy the inputs of steps t = 0..steps-1.
//       Encodes them with one ErrorFeedback (seed + t at step t) and compares each payload with
//       DIR/p<t>.gcmp and the final residual with DIR/residual.npy (what Python wrote).
//   mpiexec.mpich -n P gcomp_python_reference allreduce DIR
//       DIR/cases.txt: one case a line, "name spec algorithm average seed ef steps sizes"
//       (sizes: comma-separated; one size: Communicator::allreduce, more: allreduce_buckets with
//       bucket_bytes 4 * the first size and dense_below 1024). Inputs
//       DIR/<name>.r<rank>.s<step>.t<tensor>.in.npy, Python's results .out.npy, and with ef the
//       final residuals DIR/<name>.r<rank>.t<tensor>.ef.npy. Runs the same calls and compares.
// Prints each difference; exits 0 when everything is bit-identical, 1 otherwise (every rank).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "array_file.hpp"
#include "gcomp/codec.hpp"
#include "gcomp/communicator.hpp"

namespace {

using gcomp::tools::read_array;
using gcomp::tools::read_bytes;

int failures = 0;

void differ(const std::string& what) {
  std::fprintf(stderr, "gcomp_python_reference: %s differs\n", what.c_str());
  ++failures;
}

bool same(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

int run_ef(const std::string& dir) {
  std::ifstream in(dir + "/case.txt");
  std::string spec;
  std::uint64_t seed = 0, steps = 0;
  if (!(in >> spec >> seed >> steps)) throw std::runtime_error(dir + "/case.txt: unreadable");
  const gcomp::Codec codec(spec);
  std::vector<float> x0 = read_array(dir + "/x0.npy");
  gcomp::ErrorFeedback ef(x0.size());
  for (std::uint64_t t = 0; t < steps; ++t) {
    const std::string step = std::to_string(t);
    const std::vector<float> x = read_array(dir + "/x" + step + ".npy");
    const std::vector<std::byte> mine = codec.encode_ef(ef, x, seed + t);
    const std::vector<std::byte> theirs = read_bytes(dir + "/p" + step + ".gcmp");
    if (mine != theirs) differ(spec + " step " + step + " payload");
  }
  if (!same(ef.residual(), read_array(dir + "/residual.npy"))) differ(spec + " residual");
  return failures ? 1 : 0;
}

std::vector<std::size_t> sizes_of(const std::string& text) {
  std::vector<std::size_t> out;
  std::stringstream s(text);
  std::string part;
  while (std::getline(s, part, ',')) out.push_back(std::stoull(part));
  return out;
}

int run_allreduce(const std::string& dir) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  gcomp::Communicator comm(MPI_COMM_WORLD);
  std::ifstream cases(dir + "/cases.txt");
  std::string line;
  int count = 0;
  while (std::getline(cases, line)) {
    std::stringstream f(line);
    std::string name, spec, algorithm, sizes_text;
    int average = 0, with_ef = 0;
    std::uint64_t seed = 0, steps = 0;
    if (!(f >> name >> spec >> algorithm >> average >> seed >> with_ef >> steps >> sizes_text)) {
      throw std::runtime_error(dir + "/cases.txt: bad line '" + line + "'");
    }
    ++count;
    const gcomp::Codec codec(spec);
    const std::vector<std::size_t> sizes = sizes_of(sizes_text);
    std::vector<gcomp::ErrorFeedback> efs;
    std::vector<gcomp::ErrorFeedback*> ef_ptrs;
    for (std::size_t n : sizes) efs.emplace_back(n);
    if (with_ef) {
      for (auto& e : efs) ef_ptrs.push_back(&e);
    }
    const std::string base = dir + "/" + name + ".r" + std::to_string(rank);
    for (std::uint64_t s = 0; s < steps; ++s) {
      std::vector<std::vector<float>> x;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        x.push_back(read_array(base + ".s" + std::to_string(s) + ".t" + std::to_string(t) +
                               ".in.npy"));
      }
      if (sizes.size() == 1) {
        gcomp::AllreduceOptions o;
        o.algorithm = gcomp::parse_algorithm(algorithm);
        o.average = average != 0;
        o.seed = seed;
        comm.allreduce(x[0], codec, with_ef ? &efs[0] : nullptr, o);
      } else {
        gcomp::BucketOptions o;
        o.allreduce.algorithm = gcomp::parse_algorithm(algorithm);
        o.allreduce.average = average != 0;
        o.allreduce.seed = seed;
        o.bucket_bytes = 4 * sizes[0];
        std::vector<std::span<float>> spans(x.begin(), x.end());
        comm.allreduce_buckets(spans, codec, ef_ptrs, o);
      }
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        const std::string out =
            base + ".s" + std::to_string(s) + ".t" + std::to_string(t) + ".out.npy";
        if (!same(x[t], read_array(out))) differ(out);
      }
    }
    for (std::size_t t = 0; t < sizes.size() && with_ef; ++t) {
      const std::string path = base + ".t" + std::to_string(t) + ".ef.npy";
      if (!same(efs[t].residual(), read_array(path))) differ(path);
    }
  }
  if (count == 0) {
    std::fprintf(stderr, "gcomp_python_reference: %s/cases.txt holds no case\n", dir.c_str());
    ++failures;
  }
  int local = failures ? 1 : 0, worst = 0;
  MPI_Allreduce(&local, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("gcomp_python_reference: %d cases on every rank, %s\n", count,
                worst ? "DIFFERENT" : "bit-identical");
  }
  std::fflush(stdout);
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: gcomp_python_reference ef|allreduce DIR\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  try {
    if (mode == "ef") return run_ef(dir);
    if (mode != "allreduce") throw std::runtime_error("unknown mode " + mode);
    MPI_Init(&argc, &argv);
    const int rc = run_allreduce(dir);
    MPI_Finalize();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gcomp_python_reference: %s\n", e.what());
    return 2;
  }
}
