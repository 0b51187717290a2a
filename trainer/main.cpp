// gcomp-train: data-parallel SGD on Fashion-MNIST through gcomp's collectives, under
// mpiexec.mpich -n P. Prints a line per epoch (a progress bar while an epoch runs on a terminal)
// and writes a JSON record: the configuration, per-epoch loss, test accuracy, bytes sent per rank
// against the dense equivalent, and the time split. Errors reach every rank: each prints one line
// and the run exits non-zero (2 for bad flags or data, 1 otherwise), never hanging.
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "gcomp/communicator.hpp"
#include "idx.hpp"
#include "model.hpp"
#include "optimizer.hpp"
#include "train.hpp"

namespace {

using gcomp::train::Config;
using gcomp::train::EpochRecord;

int rank_of_world() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Every rank learns whether any rank failed at this point (loading data, say).
bool all_ok(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// --algorithm's help, the algorithms' names from the table.
std::string algorithm_help() {
  std::string s =
      "allreduce algorithm: bytes or fewest_bytes (each call the one that sends the fewest bytes "
      "for the codec, by the byte models), auto (gcomp chooses by time)";
  for (int a = 1; a < gcomp::kAlgorithmCount; ++a) {
    s += std::string(", ") + gcomp::algorithm_name(static_cast<gcomp::Algorithm>(a));
  }
  return s + " (docs/algorithms.md)";
}

// A check for an unsigned option, which CLI11 would otherwise read "-1" into as 2^64 - 1.
CLI::Validator a_count() {
  return CLI::Validator(
      [](std::string& s) {
        return s.find('-') == std::string::npos ? std::string() : "a count >= 0, not " + s;
      },
      "");
}

// Whether error feedback keeps anything: not where the codec loses nothing (variance bound 0).
bool feedback_kept(const Config& c) {
  return c.error_feedback && (gcomp::train::parse_dgc(c.codec).on ||
                              gcomp::Codec(c.codec).properties().variance_bound != 0);
}

nlohmann::json config_json(const Config& c, int ranks, const std::string& data) {
  return {{"model", c.model},
          {"codec", c.codec},
          {"error_feedback", c.error_feedback},
          {"epochs", c.epochs},
          {"batch_per_rank", c.batch},
          {"global_batch", c.batch * static_cast<std::size_t>(ranks)},
          {"ranks", ranks},
          {"lr", c.lr},
          {"schedule", c.schedule},
          {"momentum", c.momentum},
          {"weight_decay", c.weight_decay},
          {"optimizer", c.optimizer},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"eps", c.eps},
          {"warmup_steps", c.warmup_steps},
          {"zero_one", c.zero_one},
          {"warmup_epochs", c.warmup_epochs},
          {"ef_on", !c.ef_on_velocity   ? "gradient"
                    : c.ef_scaled_by_lr ? "update"
                                        : "velocity"},
          {"dense_below", c.dense_below},
          {"bucket_bytes", c.bucket_bytes},
          {"subset", c.subset},
          {"test_subset", c.test_subset},
          {"seed", c.seed},
          {"algorithm", gcomp::algorithm_name(c.algorithm.value_or(gcomp::Algorithm::fewest_bytes))},
          {"period", c.period},
          {"period_from", c.period_from},
          {"outer_lr", c.outer_lr},
          {"outer_momentum", c.outer_momentum},
          {"momentum_at_average", c.momentum_at_average},
          {"fragments", c.fragments},
          {"overlap_steps", c.overlap_steps},
          {"data", data}};
}

nlohmann::json epoch_json(const EpochRecord& r) {
  return {{"epoch", r.epoch},
          {"train_loss", r.train_loss},
          {"test_accuracy", r.test_accuracy},
          {"bytes_sent_per_rank", r.bytes_sent_per_rank},
          {"dense_bytes_per_rank", r.dense_bytes_per_rank},
          {"reduction_vs_dense",
           r.bytes_sent_per_rank > 0 ? r.dense_bytes_per_rank / r.bytes_sent_per_rank : 0.0},
          {"sparsity", r.sparsity},
          {"averages", r.averages},
          {"seconds",
           {{"wall", r.wall_seconds},
            {"compute", r.compute_seconds},
            {"encode", r.encode_seconds},
            {"communicate", r.comm_seconds},
            {"decode", r.decode_seconds}}}};
}

std::string megabytes(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  return buf;
}

int run(int argc, char** argv) {
  const int rank = rank_of_world();
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  CLI::App app{"gcomp-train: data-parallel SGD on Fashion-MNIST through gcomp's compressed "
               "allreduce (run under mpiexec.mpich -n P)"};
  Config c;
  std::string data = gcomp::train::kDefaultDataDir;
  std::string out;
  std::string algorithm = "bytes";
  bool quiet = false;
  std::string ef_on = "velocity";
  app.add_option("--model", c.model, "mlp (784-512-256-10) or cnn")->capture_default_str();
  app.add_option("--codec", c.codec, "a gcomp codec spec (gcomp list), or dgc:ratio=R[,clip=C]")
      ->capture_default_str();
  app.add_flag("--ef,!--no-ef", c.error_feedback, "error feedback (default on)");
  app.add_option("--ef-on", ef_on,
                 "with error feedback, what each rank compresses: velocity (its momentum, the "
                 "step being the average sent times lr), update (lr times its momentum, the step "
                 "being the average sent) or gradient (momentum applied to the average)")
      ->capture_default_str();
  app.add_option("--epochs", c.epochs, "epochs")->capture_default_str();
  app.add_option("--batch", c.batch, "samples per rank per step")->capture_default_str();
  app.add_option("--lr", c.lr, "learning rate")->capture_default_str();
  app.add_option("--schedule", c.schedule,
                 "learning-rate schedule: cosine (decays to 0 over the run) or constant")
      ->capture_default_str();
  app.add_option("--momentum", c.momentum, "momentum (SGD)")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay,
                 "weight decay: L2 (SGD, Adam) or decoupled (AdamW)")
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer,
                 "sgd (with --momentum), adam or adamw: 1-bit Adam, --warmup-steps exact steps "
                 "then the variance frozen and each rank's momentum sent through the codec")
      ->capture_default_str();
  app.add_option("--beta1", c.beta1, "Adam's beta1")->capture_default_str();
  app.add_option("--beta2", c.beta2, "Adam's beta2")->capture_default_str();
  app.add_option("--eps", c.eps, "Adam's eps")->capture_default_str();
  app.add_option("--warmup-steps", c.warmup_steps,
                 "adam, adamw: exact steps on gradients averaged uncompressed before the "
                 "variance is frozen (at least 1)")
      ->capture_default_str();
  app.add_option("--zero-one", c.zero_one,
                 "adam, adamw: 0/1 Adam's schedule in place of --warmup-steps, "
                 "FREEZE[,KAPPA[,H[,DOUBLE]]]: KAPPA exact steps, then KAPPA refreshes of the "
                 "variance at each doubling interval until step FREEZE, then local steps "
                 "synchronized every 1, 2, ... at most H steps, doubling every DOUBLE steps "
                 "(defaults 16, 16, 32)");
  app.add_option("--warmup-epochs", c.warmup_epochs, "epochs without compression first")
      ->capture_default_str();
  app.add_option("--dense-below", c.dense_below,
                 "tensors with fewer elements are sent uncompressed")->capture_default_str();
  app.add_option("--bucket-bytes", c.bucket_bytes,
                 "tensors are fused into buckets of up to this many bytes, each compressed as one "
                 "vector (0: one bucket per tensor)")->capture_default_str();
  app.add_option("--subset", c.subset, "train on the first N samples (0: all)")
      ->capture_default_str();
  app.add_option("--test-subset", c.test_subset, "evaluate on the first N test samples (0: all)")
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the initialisation and the sample order")
      ->capture_default_str();
  app.add_option("--algorithm", algorithm, algorithm_help())->capture_default_str();
  app.add_option("--period", c.period,
                 "periodic model averaging (local SGD): from step --period-from on, each rank "
                 "steps on its own gradients, sending nothing, and every H steps the ranks "
                 "average their models through the codec (1: every step synchronized)")
      ->check(a_count())
      ->capture_default_str();
  app.add_option("--period-from", c.period_from,
                 "with --period: the steps synchronized first (post-local SGD), counted from 0")
      ->check(a_count())
      ->capture_default_str();
  app.add_option("--outer-lr", c.outer_lr,
                 "with --period: an average moves the models by X times the ranks' mean change "
                 "(1: plain averaging; DiLoCo's outer learning rate)")
      ->capture_default_str();
  app.add_option("--outer-momentum", c.outer_momentum,
                 "with --period: Nesterov momentum over the averages' changes (DiLoCo: 0.9)")
      ->capture_default_str();
  app.add_option("--momentum-at-average", c.momentum_at_average,
                 "with --period: each rank's momentum at an average: local (kept), reset "
                 "(zeroed) or average (averaged over the ranks through the codec)")
      ->capture_default_str();
  app.add_option("--fragments", c.fragments,
                 "with --period: streaming, the parameters in F fragments of about equal elements, "
                 "each averaged at its own step of the period")
      ->check(a_count())
      ->capture_default_str();
  app.add_option("--overlap-steps", c.overlap_steps,
                 "with --period: each average merged T steps after it starts, its collective on "
                 "a thread of its own meanwhile; T >= 2 paces it, sent in T parts, one a step")
      ->check(a_count())
      ->capture_default_str();
  app.add_option("--data", data, "directory of the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--out", out, "write the JSON record here");
  app.add_flag("--quiet", quiet, "no per-epoch lines");
  try {
    app.parse(argc, argv);
    if (ef_on != "velocity" && ef_on != "gradient" && ef_on != "update") {
      throw gcomp::Error(gcomp::Status::invalid_argument,
                         "--ef-on: " + ef_on + " is not velocity, update or gradient");
    }
    c.ef_on_velocity = ef_on != "gradient";
    c.ef_scaled_by_lr = ef_on == "update";
    if (algorithm != "bytes") c.algorithm = gcomp::parse_algorithm(algorithm);  // bytes: the default
    gcomp::train::validate(c);
  } catch (const CLI::CallForHelp& e) {
    if (rank == 0) app.exit(e);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "gcomp-train: %s\n", e.what());
    return 2;
  } catch (const gcomp::Error& e) {
    std::fprintf(stderr, "gcomp-train: %s\n", e.what());
    return 2;
  }

  gcomp::train::FashionMnist fm;
  std::string load_error;
  try {
    fm = gcomp::train::load_fashion_mnist(data);
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  if (!all_ok(load_error.empty())) {
    std::fprintf(stderr, "gcomp-train (rank %d): %s\n", rank,
                 load_error.empty() ? "another rank could not load the data set" : load_error.c_str());
    return 2;
  }

  // The record is written at the end: find out now, not after the training, if it cannot be.
  bool out_ok = true;
  if (rank == 0 && !out.empty()) out_ok = static_cast<bool>(std::ofstream(out));
  if (!all_ok(out_ok)) {
    if (rank == 0) std::fprintf(stderr, "gcomp-train: %s: cannot write\n", out.c_str());
    return 1;
  }

  gcomp::Communicator comm(MPI_COMM_WORLD);
  gcomp::train::Model model(c.model, fm.train.rows, fm.train.cols, c.seed);
  const bool bar = rank == 0 && !quiet && isatty(STDOUT_FILENO);
  nlohmann::json record = {{"config", config_json(c, ranks, data)},
                           {"parameters", model.parameter_count()},
                           {"epochs", nlohmann::json::array()}};
  if (rank == 0 && !quiet) {
    std::string periodic;
    if (c.period > 1) {
      periodic = ", averaged every " + std::to_string(c.period) + " steps from step " +
                 std::to_string(c.period_from);
      if (c.fragments > 1 || c.overlap_steps > 0) {
        periodic += " in " + std::to_string(c.fragments) + " fragments, merged " +
                    std::to_string(c.overlap_steps) + " steps after they start";
      }
    }
    std::printf(
        "gcomp-train: %s, %zu parameters, codec %s%s, %d ranks x %zu samples, %d epochs%s\n",
        c.model.c_str(), model.parameter_count(), c.codec.c_str(), feedback_kept(c) ? " + EF" : "",
        ranks, c.batch, c.epochs, periodic.c_str());
    std::fflush(stdout);
  }
  if (const std::string w = gcomp::train::feedback_warning(c); rank == 0 && !w.empty()) {
    std::fprintf(stderr, "gcomp-train: warning: %s\n", w.c_str());
  }
  int epoch_now = 1;
  const auto on_step = [&](std::size_t step, std::size_t steps) {
    if (!bar || (step % 10 != 0 && step != steps)) return;
    const int width = 30;
    const int done = static_cast<int>(static_cast<double>(step) / steps * width);
    std::printf("\repoch %d/%d [%.*s%*s] %zu/%zu", epoch_now, c.epochs, done,
                "##############################", width - done, "", step, steps);
    std::fflush(stdout);
  };
  const auto on_epoch = [&](const EpochRecord& r) {
    record["epochs"].push_back(epoch_json(r));
    if (rank == 0 && !quiet) {
      if (bar) std::printf("\r%*s\r", 80, "");
      const double ratio = r.bytes_sent_per_rank > 0 ? r.dense_bytes_per_rank / r.bytes_sent_per_rank : 0;
      const std::string averages =
          c.period > 1 ? "  " + std::to_string(r.averages) + " averages" : "";
      std::printf(
          "epoch %d/%d  loss %.4f  test %.2f%%  sent %s/rank (%.1fx less than dense)%s  %.1f s\n",
          r.epoch, c.epochs, r.train_loss, 100 * r.test_accuracy,
          megabytes(r.bytes_sent_per_rank).c_str(), ratio, averages.c_str(), r.wall_seconds);
      std::fflush(stdout);
    }
    ++epoch_now;
  };
  gcomp::train::run(c, fm.train, fm.test, comm, model, on_epoch, on_step);
  if (rank == 0 && !out.empty()) {
    std::ofstream f(out);
    f << record.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "gcomp-train: %s: cannot write\n", out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Serialized at least: --overlap-steps runs an average's collective on a thread of its own
  // while this one computes (never two threads in MPI at once).
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr, "gcomp-train: MPI gives thread level %d, not MPI_THREAD_SERIALIZED\n",
                 provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int code = 1;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gcomp-train (rank %d): %s\n", rank_of_world(), e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
