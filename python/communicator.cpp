// The Communicator's binding: gcomp.Communicator on MPI_COMM_WORLD or on Gloo through a store,
// its allreduce and allreduce_buckets on host arrays or CUDA ones (arrays.hpp), choose, the
// statistics and the waits; and gcomp.TotalStats.
#include "gcomp/communicator.hpp"

#include <mpi.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "binding.hpp"
#ifdef GCOMP_PY_HAVE_GLOO
#include <gloo/rendezvous/store.h>

#include "store.hpp"
#endif

namespace gcomp::python {

namespace {

struct PyCommunicator final : ClosedAtExit {
  std::unique_ptr<gcomp::Communicator> comm;
  bool on_mpi = true;  // MPI's rules (initialization, thread level, finalization) apply
  std::mutex busy;     // one call at a time, as the C++ Communicator requires

  // MPI_COMM_WORLD.
  PyCommunicator() {
    ensure_mpi();
    {
      py::gil_scoped_release nogil;
      const Serial serial;
      comm = std::make_unique<gcomp::Communicator>(MPI_COMM_WORLD);
    }
    close_at_exit(this);
  }
  // Gloo, met through store (store.hpp); no MPI.
  PyCommunicator(py::handle store, int rank, int size, const gcomp::GlooOptions& options)
      : on_mpi(false) {
#ifdef GCOMP_PY_HAVE_GLOO
    const std::unique_ptr<gloo::rendezvous::Store> s = make_store(store);
    py::gil_scoped_release nogil;
    comm = std::make_unique<gcomp::Communicator>(*s, rank, size, options);
#else
    (void)store, (void)rank, (void)size, (void)options;
    throw gcomp::Error(Status::invalid_argument,
                       "this build of gcomp has no Gloo transport (gcomp.have_gloo() is False)");
#endif
    close_at_exit(this);
  }
  ~PyCommunicator() {
    forget_at_exit(this);
    close();
  }
  PyCommunicator(const PyCommunicator&) = delete;
  PyCommunicator& operator=(const PyCommunicator&) = delete;

  // Frees the communicator (a collective over its ranks, as MPI_Comm_free is); after MPI was
  // finalized by someone else, forgets it instead.
  void close() override {
    if (!comm) return;
    if (!on_mpi) {
      py::gil_scoped_release nogil;
      const std::lock_guard<std::mutex> own(busy);
      comm.reset();
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      (void)comm.release();  // its MPI objects went with MPI
      return;
    }
    py::gil_scoped_release nogil;
    const std::lock_guard<std::mutex> own(busy);
    const Serial serial;
    comm.reset();
  }

  gcomp::Communicator& get() const {
    if (!comm) {
      throw gcomp::Error(on_mpi ? Status::mpi : Status::invalid_argument,
                         on_mpi ? "this Communicator was closed when MPI was finalized"
                                : "this Communicator was closed");
    }
    return *comm;
  }
};

// The locks of one call, taken with the GIL released (MPI's only on MPI).
class Call {
 public:
  explicit Call(PyCommunicator& c) : own_(c.busy) {
    if (c.on_mpi) serial_.emplace();
  }

 private:
  std::lock_guard<std::mutex> own_;
  std::optional<Serial> serial_;
};

// Communicator(store=None, rank=None, size=None, ...): MPI_COMM_WORLD without a store, else Gloo.
std::unique_ptr<PyCommunicator> make_communicator(py::handle store, py::handle rank,
                                                  py::handle size, py::handle prefix,
                                                  py::handle interface, py::handle hostname,
                                                  py::handle host, double connect_seconds) {
  if (store.is_none()) {
    for (const auto& [name, v] : {std::pair{"rank", rank},
                                  {"size", size},
                                  {"prefix", prefix},
                                  {"interface", interface},
                                  {"hostname", hostname},
                                  {"host", host}}) {
      if (!v.is_none()) {
        throw py::value_error(std::string(name) +
                              "= is for a Communicator on Gloo (store=...); without a store the "
                              "Communicator is MPI_COMM_WORLD's");
      }
    }
    return std::make_unique<PyCommunicator>();
  }
  if (rank.is_none() || size.is_none()) {
    throw py::value_error("a Communicator on Gloo (store=...) needs rank= and size=");
  }
  gcomp::GlooOptions o;
  const auto text = [](py::handle v, const char* name, std::string& into) {
    if (v.is_none()) return;
    if (!py::isinstance<py::str>(v)) {
      throw py::type_error(std::string(name) + " must be a str or None, not " + type_name(v));
    }
    into = v.cast<std::string>();
  };
  text(prefix, "prefix", o.prefix);
  text(interface, "interface", o.interface);
  text(hostname, "hostname", o.hostname);
  text(host, "host", o.host);
  o.connect_seconds = connect_seconds;
  const auto to_int = [](py::handle v, const char* name) {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
      throw py::type_error(std::string(name) + " must be an int, not " + type_name(v));
    }
    return v.cast<int>();
  };
  return std::make_unique<PyCommunicator>(store, to_int(rank, "rank"), to_int(size, "size"), o);
}

// Runs the conversion of a collective's arguments; when it fails, this rank still takes its part
// (Communicator::abandon), so that the other ranks raise too instead of waiting, and the
// conversion's own error is raised here.
template <class F>
auto prepared(PyCommunicator& self, F&& f) -> decltype(f()) {
  gcomp::Communicator& comm = self.get();
  try {
    return f();
  } catch (...) {
    const std::exception_ptr failure = std::current_exception();
    Status status = Status::invalid_argument;
    std::string why = "a bad argument";
    try {
      std::rethrow_exception(failure);
    } catch (const gcomp::Error& e) {
      status = e.code();
      why = e.what();
    } catch (const py::error_already_set& e) {
      why = e.what();
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
    }
    try {
      py::gil_scoped_release nogil;
      const Call call(self);
      comm.abandon(status, why);
    } catch (...) {
      // The caller learns of its own failure; MPI's trouble telling the others is secondary.
    }
    std::rethrow_exception(failure);
  }
}

// The call's options. Its seed is seed as given, or with a step, gcomp::step_seed(seed, step,
// index): a training loop's call index within the step mixed in here, not by each caller.
gcomp::AllreduceOptions options_of(py::handle algorithm, py::handle average, py::handle seed,
                                   py::handle allow_uncompressed, py::handle step,
                                   py::handle index) {
  gcomp::AllreduceOptions o;
  if (!py::isinstance<py::str>(algorithm)) {
    throw py::type_error("algorithm must be a str, not " + type_name(algorithm));
  }
  o.algorithm = gcomp::parse_algorithm(algorithm.cast<std::string>());
  o.average = average.cast<bool>();
  o.seed = to_seed(seed);
  const std::uint64_t i = to_seed(index, "index");
  if (!step.is_none()) {
    o.seed = gcomp::step_seed(o.seed, to_seed(step, "step"), i);
  } else if (i != 0) {
    throw py::value_error("index " + std::to_string(i) + " without a step: pass step too");
  }
  o.allow_uncompressed = allow_uncompressed.cast<bool>();
  return o;
}

// The call's name in a stall report or a timeout (AllreduceOptions::label): label as given,
// else "step S, index I" where a step is given, else none.
std::string label_of(py::handle label, py::handle step, py::handle index) {
  if (!label.is_none()) {
    if (!py::isinstance<py::str>(label)) {
      throw py::type_error("label must be a str or None, not " + type_name(label));
    }
    return label.cast<std::string>();
  }
  if (step.is_none()) return {};
  return "step " + std::to_string(to_seed(step, "step")) + ", index " +
         std::to_string(to_seed(index, "index"));
}

const gcomp::Codec& codec_of(py::handle codec, std::optional<gcomp::Codec>& made) {
  if (py::isinstance<gcomp::Codec>(codec)) return codec.cast<const gcomp::Codec&>();
  if (py::isinstance<py::str>(codec)) return made.emplace(codec.cast<std::string>());
  throw py::type_error("codec must be a gcomp.Codec or a spec str, not " + type_name(codec));
}

py::object allreduce(PyCommunicator& self, py::handle x, py::handle codec, py::handle ef,
                     py::handle algorithm, py::handle average, py::handle seed,
                     py::handle allow_uncompressed, py::handle step, py::handle index,
                     py::handle label, py::handle stream) {
  std::optional<Held> buf;
  CallStream st;
  int device = -1;
  std::string label_text;
  std::optional<gcomp::Codec> made;
  const gcomp::Codec* c = nullptr;
  PyErrorFeedback* e = nullptr;
  std::optional<Using> using_ef;
  gcomp::AllreduceOptions options;
  prepared(self, [&] {
    st = to_stream(stream);
    buf.emplace(x, "x", Elem::float32, true, &st);
    device = same_memory({&*buf}, st);
    c = &codec_of(codec, made);
    e = to_ef(ef, *buf, "ef");
    using_ef.emplace(e);
    options = options_of(algorithm, average, seed, allow_uncompressed, step, index);
    label_text = label_of(label, step, index);
    if (!label_text.empty()) options.label = label_text.c_str();
  });
  {
    const DeviceScope scope(device);
    py::gil_scoped_release nogil;
    const Call call(self);
    self.get().allreduce(buf->float_view(), *c, e ? &e->ef : nullptr, options);
  }
  return py::reinterpret_borrow<py::object>(x);
}

// What the next auto call for this codec and size would do (Communicator::choose).
py::dict choose(PyCommunicator& self, py::handle codec, std::size_t n, bool allow_uncompressed) {
  std::optional<gcomp::Codec> made;
  const gcomp::Codec& c = codec_of(codec, made);
  gcomp::Choice choice;
  {
    py::gil_scoped_release nogil;
    const Call call(self);
    choice = self.get().choose(c, n, 0, allow_uncompressed);
  }
  py::dict d;
  d["algorithm"] = gcomp::algorithm_name(choice.algorithm);
  d["compressed"] = choice.compressed;
  return d;
}

// A tensor's shape as a matrix: rows = its first dimension, cols = the product of the others (a
// tuple, list or torch.Size of non-negative ints; () is 1 x 1).
gcomp::MatrixShape matrix_shape(py::handle s, const std::string& what) {
  if (!py::isinstance<py::sequence>(s) || py::isinstance<py::str>(s)) {
    throw py::type_error(what + " must be a shape (a tuple of ints), not " + type_name(s));
  }
  const py::sequence dims = py::reinterpret_borrow<py::sequence>(s);
  gcomp::MatrixShape m{1, 1};
  for (std::size_t d = 0; d < dims.size(); ++d) {
    const std::size_t v = to_count(dims[d], what + "[" + std::to_string(d) + "]");
    if (d == 0) {
      m.rows = v;
    } else if (v != 0 && m.cols > std::numeric_limits<std::size_t>::max() / v) {
      throw py::value_error(what + " is too large");
    } else {
      m.cols *= v;
    }
  }
  return m;
}

py::object allreduce_buckets(PyCommunicator& self, py::handle tensors, py::handle codec,
                             py::handle efs, py::handle bucket_bytes, py::handle dense_below,
                             py::handle average, py::handle seed, py::handle algorithm,
                             py::handle allow_uncompressed, py::handle step, py::handle index,
                             py::handle shapes, py::handle label, py::handle stream) {
  std::deque<Held> bufs;
  CallStream st;
  int device = -1;
  std::string label_text;
  std::vector<gcomp::MatrixShape> matrices;
  std::vector<gcomp::TensorView<float>> spans;
  std::vector<gcomp::ErrorFeedback*> memories;
  std::deque<Using> using_efs;
  std::optional<gcomp::Codec> made;
  const gcomp::Codec* c = nullptr;
  gcomp::BucketOptions options;
  prepared(self, [&] {
    if (!py::isinstance<py::sequence>(tensors) || py::isinstance<py::str>(tensors)) {
      throw py::type_error("tensors must be a list of " + std::string(needed(Elem::float32)) +
                           "s, not " + type_name(tensors));
    }
    const py::sequence ts = py::reinterpret_borrow<py::sequence>(tensors);
    st = to_stream(stream);
    std::vector<const Held*> held;
    for (std::size_t t = 0; t < ts.size(); ++t) {
      bufs.emplace_back(ts[t], "tensors[" + std::to_string(t) + "]", Elem::float32, true, &st);
      spans.push_back(bufs.back().float_view());
      held.push_back(&bufs.back());
    }
    device = same_memory(held, st);
    c = &codec_of(codec, made);
    if (!efs.is_none()) {
      if (!py::isinstance<py::sequence>(efs)) {
        throw py::type_error("efs must be None or a list of gcomp.ErrorFeedback (or None), not " +
                             type_name(efs));
      }
      const py::sequence es = py::reinterpret_borrow<py::sequence>(efs);
      if (es.size() != ts.size()) {
        throw py::value_error(std::to_string(es.size()) + " error-feedback memories for " +
                              std::to_string(ts.size()) + " tensors");
      }
      for (std::size_t t = 0; t < es.size(); ++t) {
        PyErrorFeedback* e = to_ef(es[t], bufs[t], "efs[" + std::to_string(t) + "]");
        memories.push_back(e ? &e->ef : nullptr);
        if (e) using_efs.emplace_back(e);
      }
    }
    if (!shapes.is_none()) {
      if (!py::isinstance<py::sequence>(shapes) || py::isinstance<py::str>(shapes)) {
        throw py::type_error("shapes must be None or a list of shapes (tuples of ints), not " +
                             type_name(shapes));
      }
      const py::sequence ss = py::reinterpret_borrow<py::sequence>(shapes);
      if (ss.size() != ts.size()) {
        throw py::value_error(std::to_string(ss.size()) + " shapes for " +
                              std::to_string(ts.size()) + " tensors");
      }
      for (std::size_t t = 0; t < ss.size(); ++t) {
        matrices.push_back(matrix_shape(ss[t], "shapes[" + std::to_string(t) + "]"));
        if (matrices.back().rows * matrices.back().cols != spans[t].size()) {
          throw py::value_error("shapes[" + std::to_string(t) + "] holds " +
                                std::to_string(matrices.back().rows * matrices.back().cols) +
                                " elements, tensors[" + std::to_string(t) + "] " +
                                std::to_string(spans[t].size()));
        }
      }
    }
    options.bucket_bytes = to_count(bucket_bytes, "bucket_bytes");
    options.dense_below = to_count(dense_below, "dense_below");
    options.allreduce = options_of(algorithm, average, seed, allow_uncompressed, step, index);
    label_text = label_of(label, step, index);
    if (!label_text.empty()) options.allreduce.label = label_text.c_str();
  });
  {
    const DeviceScope scope(device);
    py::gil_scoped_release nogil;
    const Call call(self);
    if (shapes.is_none()) {
      self.get().allreduce_buckets(spans, *c, memories, options);
    } else {
      self.get().allreduce_buckets(spans, matrices, *c, memories, options);
    }
  }
  return py::reinterpret_borrow<py::object>(tensors);
}

// The keys both stats dicts have.
template <class Stats>
py::dict stats_dict(const Stats& s) {
  py::dict d;
  d["calls"] = s.calls;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["encode_seconds"] = s.encode_seconds;
  d["comm_seconds"] = s.comm_seconds;
  d["decode_seconds"] = s.decode_seconds;
  d["agree_seconds"] = s.agree_seconds;
  return d;
}

// Calls per algorithm, the algorithms used only.
// A NetworkModel as the module gives it (with the allreduce's fits, or without: a host's).
py::dict network_dict(const gcomp::NetworkModel& n, bool allreduce) {
  py::dict d;
  d["alpha"] = n.alpha;
  d["beta"] = n.beta;
  d["beta_all"] = n.beta_all;
  d["beta_one"] = n.beta_one;
  if (allreduce) {
    d["beta_allreduce"] = n.beta_allreduce;
    d["beta_allreduce_large"] = n.beta_allreduce_large;
  }
  return d;
}

py::dict by_algorithm(const std::array<std::uint64_t, gcomp::kAlgorithmCount>& counts) {
  py::dict by;
  for (int a = 0; a < gcomp::kAlgorithmCount; ++a) {
    if (counts[a]) by[gcomp::algorithm_name(static_cast<gcomp::Algorithm>(a))] = counts[a];
  }
  return by;
}

py::dict last_stats(const PyCommunicator& self) {
  const gcomp::CallStats& s = self.get().last_stats();
  py::dict d = stats_dict(s);
  d["algorithm"] =
      s.calls ? py::object(py::str(gcomp::algorithm_name(s.algorithm))) : py::object(py::none());
  d["compressed"] = s.compressed;
  d["algorithms"] = by_algorithm(s.by_algorithm);
  d["compressed_calls"] = s.compressed_calls;
  return d;
}

py::dict totals_dict(const gcomp::TotalStats& s) {
  py::dict d = stats_dict(s);
  d["algorithm"] = by_algorithm(s.by_algorithm);
  d["compressed"] = s.compressed;
  return d;
}

py::dict total_stats(const PyCommunicator& self) { return totals_dict(self.get().total_stats()); }

// Counts comm's last call into t with the library's own sum (TotalStats::add). Without
// codec_applied (gcomp.torch's warm-up steps and small buckets, sent with codec none on purpose)
// it adds no compressed calls, as allreduce_buckets' dense bucket adds none to last_stats.
void add_last_call(gcomp::TotalStats& t, const PyCommunicator& comm, bool codec_applied) {
  gcomp::CallStats s = comm.get().last_stats();
  if (!codec_applied) s.compressed_calls = 0;
  t.add(s);
}

// The setter of one of the Communicator's waits (stall_seconds, timeout_seconds): never while a
// call runs (it waits for the call, the GIL released).
auto wait_setter(void (gcomp::Communicator::*set)(double)) {
  return [set](PyCommunicator& c, double seconds) {
    py::gil_scoped_release nogil;
    const std::lock_guard<std::mutex> own(c.busy);
    (c.get().*set)(seconds);
  };
}

// The algorithms' names from the table, quoted and comma-separated, in lines of at most 80
// characters, the first of at most `first` (the rest of its line is taken).
std::string algorithm_list(std::size_t first) {
  std::string out, line;
  std::size_t room = first;
  for (int a = 1; a < gcomp::kAlgorithmCount; ++a) {
    const bool last = a + 1 == gcomp::kAlgorithmCount;
    const std::string word = std::string("\"") +
                             gcomp::algorithm_name(static_cast<gcomp::Algorithm>(a)) +
                             (last ? "\"." : "\",");
    if (!line.empty() && line.size() + 1 + word.size() > room) {
      out += line + "\n";
      line.clear();
      room = 80;
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

// Communicator.allreduce's docstring (its list of algorithms from the table).
const std::string& allreduce_doc() {
  static const std::string lead = "Algorithms (docs/algorithms.md): ";
  static const std::string doc =
      "allreduce(x, codec, ef=None, algorithm=\"auto\", average=False, seed=0,\n"
      "          allow_uncompressed=True, step=None, index=0, label=None, stream=None) -> x\n\n"
      "x (a 1-D float32 numpy array or torch tensor, CPU or CUDA) becomes, in place, the sum "
      "over\n"
      "ranks (the mean with average=True) of what each rank's codec sent. codec: a\n"
      "gcomp.Codec or a spec. ef: this rank's gcomp.ErrorFeedback for x, or None.\n"
      "algorithm: \"auto\" (the cost model's choice; it may send x uncompressed when no\n"
      "compression pays; allow_uncompressed=False keeps it to the algorithms that apply\n"
      "the codec, dense among them, which sends each rank's decode as float32),\n"
      "\"fewest_bytes\" (the codec's bytes, on the algorithm whose byte model sends the\n"
      "fewest: for metered links) or one of the algorithms listed below. step, index: a training\n"
      "loop's step and the call's place in it (a bucket's index); with a step, the seed\n"
      "used is gcomp.step_seed(seed, step, index), so that the calls of a step, and the\n"
      "steps, draw differently; step=None uses seed as given (index must then be 0).\n"
      "label: the call's name in a stall report or a timeout (stall_seconds; default\n"
      "\"step S, index I\" where a step is given). A CUDA x (with ef on its device) is\n"
      "encoded and decoded on the GPU on stream (as Codec.encode's; returns when x holds\n"
      "the result) and only payloads cross to host memory for MPI. The GIL is released\n"
      "while it runs.\n\n" +
      lead + algorithm_list(80 - lead.size());
  return doc;
}

// Communicator: its ways in and its collectives.
void bind_communicator_class(py::module_& m) {
  py::class_<PyCommunicator>(
      m, "Communicator",
      "Communicator(store=None, rank=None, size=None, prefix=None, interface=None,\n"
      "             hostname=None, host=None, connect_seconds=300.0)\n\n"
      "gcomp's collectives over a transport (docs/python.md, \"Transports\"):\n\n"
      "* store=None: MPI_COMM_WORLD (collective over it). Initializes MPI on first use\n"
      "  (MPI_Init_thread asking for MPI_THREAD_MULTIPLE) and, when it did, finalizes it at\n"
      "  interpreter exit. Launch with ``mpiexec.mpich -n 4 /usr/bin/python3 script.py``.\n"
      "* store given: Gloo over TCP, without MPI, among the size processes that make it with\n"
      "  the same store and prefix, each with its rank. store: a directory every process sees\n"
      "  (Gloo's file store; made if missing) or an object with set/get/wait, such as a\n"
      "  torch.distributed.Store (gcomp.torch passes torch's own). prefix (default \"gcomp\"):\n"
      "  the rendezvous' keys, one per Communicator on a store. interface: the network\n"
      "  interface (default GLOO_SOCKET_IFNAME, else the address of hostname, else of the\n"
      "  host's name). host: this process's host for the cost model (default GCOMP_HOST, else\n"
      "  the host's name and network namespace). connect_seconds: how long the rendezvous may\n"
      "  take before it raises gcomp.Error (\"transport\").\n\n"
      "Measures the network when made. Every call is collective: all ranks pass the same\n"
      "codec, sizes, options and seed; a rank that disagrees or fails (a bad argument, NaN in\n"
      "its input) makes every rank raise instead of hang. One call at a time per Communicator\n"
      "(calls from other threads wait).")
      .def(py::init(&make_communicator), py::arg("store") = py::none(),
           py::arg("rank") = py::none(), py::arg("size") = py::none(),
           py::arg("prefix") = py::none(), py::arg("interface") = py::none(),
           py::arg("hostname") = py::none(), py::arg("host") = py::none(),
           py::arg("connect_seconds") = 300.0,
           "Communicator(store=None, rank=None, size=None, prefix=None, interface=None, "
           "hostname=None, host=None, connect_seconds=300.0)")
      .def_property_readonly(
          "transport",
          [](const PyCommunicator& c) { return gcomp::transport_name(c.get().transport()); },
          "The transport under this Communicator: \"mpi\" or \"gloo\".")
      .def_property_readonly(
          "hosts", [](const PyCommunicator& c) { return c.get().hosts(); },
          "Every rank's host as the transport tells them apart: hosts[r] is the lowest rank on\n"
          "rank r's host.")
      .def_property_readonly(
          "rank", [](const PyCommunicator& c) { return c.get().rank(); }, "This process's rank.")
      .def_property_readonly(
          "size", [](const PyCommunicator& c) { return c.get().size(); }, "The number of ranks.")
      .def_property_readonly(
          "network", [](const PyCommunicator& c) { return network_dict(c.get().network(), true); },
          "The network the cost model measured (seconds, seconds per byte; docs/algorithms.md).")
      .def_property_readonly(
          "host_network",
          [](const PyCommunicator& c) { return network_dict(c.get().host_network(), false); },
          "The network inside a host (alpha, beta, beta_all, beta_one), measured where the ranks\n"
          "span several hosts and some host has several; zeros otherwise (docs/algorithms.md,\n"
          "two_level).")
      .def("allreduce", &allreduce, py::arg("x"), py::arg("codec"), py::arg("ef") = py::none(),
           py::arg("algorithm") = "auto", py::arg("average") = false, py::arg("seed") = 0,
           py::arg("allow_uncompressed") = true, py::arg("step") = py::none(), py::arg("index") = 0,
           py::arg("label") = py::none(), py::arg("stream") = py::none(), allreduce_doc().c_str())
      .def_property(
          "stall_seconds", [](const PyCommunicator& c) { return c.get().stall_seconds(); },
          wait_setter(&gcomp::Communicator::set_stall_seconds),
          "Seconds a rank waits at the start of a call for a rank that has not come before it\n"
          "prints once, to stderr, the call (its number, size, codec, label) and the ranks not\n"
          "there with where each is (default GCOMP_STALL_SECONDS, else 60; 0: never).")
      .def_property(
          "timeout_seconds", [](const PyCommunicator& c) { return c.get().timeout_seconds(); },
          wait_setter(&gcomp::Communicator::set_timeout_seconds),
          "Seconds after which that wait raises gcomp.Error (status \"timeout\") naming them\n"
          "instead of waiting on (default GCOMP_TIMEOUT_SECONDS, else 0: never). The\n"
          "Communicator can make no more calls then (each raises \"timeout\"): end the job.")
      .def_property_readonly(
          "calls", [](const PyCommunicator& c) { return c.get().calls(); },
          "The calls made so far, as the stall report numbers them.")
      .def("allreduce_buckets", &allreduce_buckets, py::arg("tensors"), py::arg("codec"),
           py::arg("efs") = py::none(), py::arg("bucket_bytes") = 25u << 20,
           py::arg("dense_below") = 1024, py::arg("average") = false, py::arg("seed") = 0,
           py::arg("algorithm") = "auto", py::arg("allow_uncompressed") = true,
           py::arg("step") = py::none(), py::arg("index") = 0, py::arg("shapes") = py::none(),
           py::arg("label") = py::none(), py::arg("stream") = py::none(),
           "allreduce_buckets(tensors, codec, efs=None, bucket_bytes=25 << 20, dense_below=1024,\n"
           "                  average=False, seed=0, algorithm=\"auto\",\n"
           "                  allow_uncompressed=True, step=None, index=0, shapes=None,\n"
           "                  label=None, stream=None)\n"
           "                  -> tensors\n\n"
           "Allreduces a list of tensors in place, fused into buckets of at most bucket_bytes\n"
           "of float32, one collective each; tensors of fewer than dense_below elements are\n"
           "summed uncompressed. efs: None or one gcomp.ErrorFeedback (or None) per tensor.\n"
           "A tensor larger than bucket_bytes is a bucket of its own (bucket_bytes=1: one\n"
           "collective per tensor, each compressed on its own). step, index: as allreduce's.\n"
           "shapes: None, or each tensor's shape (a tuple of ints, torch.Size), viewed as a\n"
           "matrix of rows = shape[0] and cols = the product of the rest, which a low-rank\n"
           "codec needs (powersgd: each matrix sends its rank-r factors, with efs holding the\n"
           "residual and warm-start Q per tensor; 1-D and small matrices go dense) and the\n"
           "other codecs ignore. The tensors themselves may be flat. label: as allreduce's.\n"
           "The tensors are all in host memory or all on one CUDA device (then on stream, as\n"
           "allreduce's).")
      .def("choose", &choose, py::arg("codec"), py::arg("n"), py::arg("allow_uncompressed") = true,
           "choose(codec, n, allow_uncompressed=True) -> {\"algorithm\": str, \"compressed\": "
           "bool}\n\n"
           "What the next allreduce with algorithm=\"auto\" of n float32 elements with this codec\n"
           "(no error feedback, not averaged) would do: the cost model's choice first, then what\n"
           "it learns from its own calls (docs/algorithms.md). compressed=False: it would send x\n"
           "uncompressed. Collective the first time for a codec and size (the ranks measure and\n"
           "agree on the codec's speed): every rank calls it with the same arguments.")
      .def_property_readonly("last_stats", &last_stats,
                             "What the last call did: calls (collectives made), bytes_sent,\n"
                             "bytes_received, encode_seconds, comm_seconds (agree_seconds: its\n"
                             "agreement), decode_seconds,\n"
                             "algorithm (of its last collective), compressed (whether the\n"
                             "codec was applied), algorithms (calls per algorithm) and\n"
                             "compressed_calls (the calls that applied the codec).")
      .def_property_readonly("total_stats", &total_stats,
                             "Totals over this Communicator's collectives: calls, bytes_sent,\n"
                             "bytes_received, the four seconds, algorithm (calls per algorithm)\n"
                             "and compressed (calls that applied the codec).");
}

// TotalStats: running totals of calls' statistics.
void bind_total_stats(py::module_& m) {
  py::class_<gcomp::TotalStats>(
      m, "TotalStats",
      "TotalStats(): running totals of calls' statistics, zero at first, summed as the\n"
      "Communicator sums its total_stats (by the library, one sum for both). For totals of a\n"
      "part of a program's calls, such as gcomp.torch's per model.")
      .def(py::init<>(), "TotalStats()")
      .def("add", &add_last_call, py::arg("comm"), py::arg("codec_applied") = true,
           "add(comm, codec_applied=True)\n\n"
           "Counts comm's last call (comm.last_stats: one allreduce, or every bucket of an\n"
           "allreduce_buckets) in. codec_applied=False counts none of its collectives as\n"
           "compressed (a call that sent codec none on purpose, such as a warm-up step).")
      .def("as_dict", &totals_dict,
           "as_dict() -> dict\n\n"
           "The totals, with the keys of Communicator.total_stats: calls, bytes_sent,\n"
           "bytes_received, the four seconds, algorithm (calls per algorithm) and compressed.")
      .def("__repr__", [](const gcomp::TotalStats& t) {
        return "gcomp.TotalStats(calls=" + std::to_string(t.calls) + ")";
      });
}

}  // namespace

void bind_communicator(py::module_& m) {
  bind_communicator_class(m);
  bind_total_stats(m);
}

}  // namespace gcomp::python
