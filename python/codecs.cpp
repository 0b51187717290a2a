// The codecs' binding: gcomp.Codec (spec, properties, encode), decode_add, inspect, codecs()
// (the catalog) and DGC's momentum helpers, on host arrays or CUDA ones (arrays.hpp).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "binding.hpp"
#include "gcomp/momentum.hpp"
#include "wire.hpp"

namespace gcomp::python {

namespace {

// The written prefix of out: a view of the same memory (numpy arrays and torch tensors through
// their slicing, gcomp.DeviceArray and other device arrays as a DeviceArray that keeps out);
// for bytearray and other buffers a numpy view that holds an export of out, so that it cannot
// move.
py::object prefix_of(py::handle out, const Held& o, std::size_t bytes) {
  const auto prefix = py::slice(0, static_cast<py::ssize_t>(bytes), 1);
  if (is_torch_tensor(out) || py::isinstance<py::array>(out)) return out[prefix];
  if (o.on_device()) {
    return gcomp::python::device_array_view(o.byte_view().data(), bytes, Elem::byte, o.device(),
                                            py::reinterpret_borrow<py::object>(out));
  }
  return py::module_::import("numpy").attr("frombuffer")(out, "uint8", bytes);
}

std::size_t encode_into(const gcomp::Codec& codec, const Held& in, std::uint64_t seed,
                        PyErrorFeedback* e, gcomp::TensorView<std::byte> out) {
  const Using using_ef(e);
  const DeviceScope scope(in.device());
  py::gil_scoped_release nogil;
  return e ? codec.encode_ef(e->ef, in.float_view(), seed, out)
           : codec.encode(in.float_view(), seed, out);
}

py::object encode(const gcomp::Codec& codec, py::handle x, py::handle seed, py::handle ef,
                  py::handle out, py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held in(x, "x", Elem::float32, false, &st);
  const std::uint64_t s = to_seed(seed);
  PyErrorFeedback* e = to_ef(ef, in, "ef");
  if (!out.is_none()) {
    const Held o(out, "out", Elem::byte, true, &st);
    same_memory({&in, &o}, st);
    const std::size_t bytes = encode_into(codec, in, s, e, o.byte_view());
    return prefix_of(out, o, bytes);
  }
  const int device = same_memory({&in}, st);
  const std::size_t max = codec.max_bytes(in.size());
  if (device >= 0) {
    // The payload in device memory of its own, handed out as a gcomp.DeviceArray.
    const DeviceScope scope(device);
    py::object payload = gcomp::python::new_device_array(max, Elem::byte, device);
    auto& a = gcomp::python::device_array_of(payload);
    const auto view = gcomp::TensorView<std::byte>::device(static_cast<std::byte*>(a.data), max,
                                                           st.handle, devices().backend());
    a.size = encode_into(codec, in, s, e, view);
    return payload;
  }
  // The payload in numpy's memory (numpy asks for huge pages from 4 MiB, as for its arrays).
  py::array_t<std::uint8_t> payload(static_cast<py::ssize_t>(max));
  const std::span<std::byte> buf(reinterpret_cast<std::byte*>(payload.mutable_data()), max);
  const std::size_t bytes = encode_into(codec, in, s, e, buf);
  if (bytes == max) return payload;
  if (bytes >= max / 2) return payload[py::slice(0, static_cast<py::ssize_t>(bytes), 1)];
  // A bound far above the payload (threshold's): keep only what was written.
  py::array_t<std::uint8_t> exact(static_cast<py::ssize_t>(bytes));
  std::memcpy(exact.mutable_data(), buf.data(), bytes);
  return exact;
}

py::object decode_add(py::handle payload, py::handle acc, double alpha, py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held p(payload, "payload", Elem::byte, false, &st);
  const Held a(acc, "acc", Elem::float32, true, &st);
  const int device = same_memory({&p, &a}, st);
  if (device < 0) {
    // The element count from the header alone (decode_add validates the whole payload; on the
    // device it checks the count too, as gcomp.Error "mismatch").
    const gcomp::detail::Payload head = gcomp::detail::parse_payload(p.bytes());
    if (head.n != a.size()) {
      throw py::value_error("acc has " + std::to_string(a.size()) +
                            " elements; the payload holds " + std::to_string(head.n));
    }
  }
  {
    const DeviceScope scope(device);
    py::gil_scoped_release nogil;
    gcomp::decode_add(gcomp::TensorView<const std::byte>(p.byte_view()), a.float_view(),
                      static_cast<float>(alpha));
  }
  return py::reinterpret_borrow<py::object>(acc);
}

void momentum_correct(py::handle velocity, py::handle grad, double momentum) {
  const Held u(velocity, "velocity", Elem::float32, true);
  const Held g(grad, "grad", Elem::float32, true);
  if (u.size() != g.size()) {
    throw py::value_error("velocity has " + std::to_string(u.size()) + " elements, grad " +
                          std::to_string(g.size()));
  }
  py::gil_scoped_release nogil;
  gcomp::momentum_correct(u.floats(), g.floats(), static_cast<float>(momentum));
}

bool mask_momentum(py::handle velocity, py::handle residual) {
  const Held u(velocity, "velocity", Elem::float32, true);
  const Held r(residual, "residual", Elem::float32, false);
  if (u.size() != r.size()) {
    throw py::value_error("velocity has " + std::to_string(u.size()) + " elements, residual " +
                          std::to_string(r.size()));
  }
  py::gil_scoped_release nogil;
  return gcomp::mask_momentum(u.floats(), r.floats());
}

py::dict inspect(py::handle payload) {
  const Held p(payload, "payload", Elem::byte, false);
  gcomp::PayloadInfo info;
  {
    py::gil_scoped_release nogil;
    info = gcomp::inspect(p.bytes());
  }
  const std::string codec = gcomp::codec_name(info.kind);
  py::dict d;
  d["codec"] = codec;
  d["spec"] = info.params.empty() ? codec : codec + ":" + info.params;
  d["version"] = info.version;
  d["n"] = info.elements;
  d["bytes"] = info.total_bytes;
  d["header_bytes"] = info.header_bytes;
  d["ratio"] = info.total_bytes ? 4.0 * static_cast<double>(info.elements) /
                                      static_cast<double>(info.total_bytes)
                                : 0.0;
  d["sections"] = info.sections;
  return d;
}

py::list codecs() {
  py::list out;
  for (const gcomp::CodecDescription& c : gcomp::codec_catalog()) {
    py::list keys;
    py::dict defaults, help;
    for (const gcomp::SpecKey& k : c.keys) {
      keys.append(k.name);
      defaults[py::str(k.name)] =
          k.default_value.empty() ? py::object(py::none()) : py::object(py::str(k.default_value));
      help[py::str(k.name)] = k.help;
    }
    py::dict d;
    d["name"] = c.name;
    d["summary"] = c.summary;
    d["keys"] = keys;
    d["defaults"] = defaults;
    d["help"] = help;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_codecs(py::module_& m) {
  m.def("codecs", &codecs,
        "codecs() -> list of dict\n\n"
        "Every codec: its name, summary, spec keys, each key's default (None: required or one of\n"
        "a required pair) and help, as `gcomp list` prints them.");

  py::class_<gcomp::Codec>(
      m, "Codec",
      "A codec, made from a spec \"name[:key=value,...]\" (see gcomp.codecs()).\n\n"
      "Immutable; one Codec may be used by many threads at once. A bad spec\n"
      "raises gcomp.Error (status \"invalid_argument\") naming the spec and\n"
      "the bad part.")
      .def(py::init<std::string_view>(), py::arg("spec"), "Codec(spec)")
      .def_property_readonly("spec", &gcomp::Codec::spec,
                             "The canonical spec, every key spelled out.")
      .def_property_readonly(
          "properties",
          [](const gcomp::Codec& c) {
            const gcomp::CodecProperties p = c.properties();
            py::dict d;
            d["sparse"] = p.sparse;
            d["unbiased"] = p.unbiased;
            d["stochastic"] = p.stochastic;
            d["shared_support"] = p.shared_support;
            d["contraction"] = p.contraction;
            d["low_rank"] = p.low_rank;
            d["needs_shapes"] = p.needs_shapes;
            d["bits_per_element"] = p.bits_per_element;
            d["value_bytes"] = p.value_bytes;
            d["elementwise"] = p.elementwise;
            d["split_per_tensor"] = p.split_per_tensor;
            d["sends_late"] = p.sends_late;
            d["variance_bound"] = p.variance_bound;
            d["start_steps"] = p.start_steps;
            return d;
          },
          "What the codec promises: sparse, unbiased, stochastic, shared_support (every rank\n"
          "selects the same indices: random-k), contraction (its error |x - C(x)|^2 <=\n"
          "(1 - delta) |x|^2, so error feedback applies by default; not QSGD, TernGrad, scaled\n"
          "random-k, none), low_rank (powersgd: runs only on the low_rank algorithm),\n"
          "needs_shapes (allreduce_buckets must be given shapes=), bits_per_element (dense\n"
          "codecs), value_bytes (sparse codecs: 4, or 2 with values=fp16), elementwise (each\n"
          "value sent depends on its element alone: none, fp16, bf16, threshold),\n"
          "split_per_tensor (one scale per call: sign, terngrad), sends_late (with error\n"
          "feedback much of each gradient is sent late: the sparsifiers, sign),\n"
          "variance_bound (omega of E|C(x) - x|^2 <= omega |x|^2 for every size; nan where\n"
          "none is known), start_steps (steps sent uncompressed first: powersgd's start=).")
      .def("max_bytes", &gcomp::Codec::max_bytes, py::arg("n"),
           "max_bytes(n) -> int\n\nAn upper bound of the bytes encode writes for n floats.")
      .def("selected", &gcomp::Codec::selected, py::arg("n"),
           "selected(n) -> int\n\nElements a sparse codec keeps out of n (0 for dense codecs).")
      .def("encode", &encode, py::arg("x"), py::arg("seed") = 0, py::arg("ef") = py::none(),
           py::arg("out") = py::none(), py::arg("stream") = py::none(),
           "encode(x, seed=0, ef=None, out=None, stream=None) -> numpy.ndarray (uint8) or\n"
           "    gcomp.DeviceArray\n\n"
           "Encodes x (a 1-D float32 numpy array or torch tensor, CPU or CUDA, used in place,\n"
           "never modified) into a payload. With ef (a gcomp.ErrorFeedback of x's size, in x's\n"
           "memory), encodes x + residual and keeps what was not sent as the new residual. With\n"
           "out (a writable 1-D uint8 array of at least max_bytes(len(x)) bytes, in x's memory),\n"
           "writes there and returns the written prefix as a view of out, allocating nothing.\n"
           "A CUDA x runs gcomp's CUDA kernels on stream (a cudaStream_t as an int, or a\n"
           "torch.cuda.Stream; None: the legacy default stream), ordered after the work already\n"
           "queued there, and returns when the payload is complete: without out, a\n"
           "gcomp.DeviceArray (torch.from_dlpack takes it); its bytes are those the CPU writes\n"
           "for the same values. The GIL is released while it runs. NaN/Inf in x (or x +\n"
           "residual) raises gcomp.Error(\"nonfinite\"), leaving ef as it was.")
      .def("__repr__", [](const gcomp::Codec& c) { return "gcomp.Codec('" + c.spec() + "')"; });

  m.def("decode_add", &decode_add, py::arg("payload"), py::arg("acc"), py::arg("alpha") = 1.0,
        py::arg("stream") = py::none(),
        "decode_add(payload, acc, alpha=1.0, stream=None) -> acc\n\n"
        "acc += alpha * decode(payload), in place. acc is a 1-D float32 numpy array or torch\n"
        "tensor of the payload's element count, in the payload's memory (both host, or both on\n"
        "one CUDA device: then on stream, as encode). The payload is validated in full first;\n"
        "on any error (gcomp.Error \"bad_payload\" for a corrupt or truncated one) acc is\n"
        "unchanged. The GIL is released while it runs.");
  m.def("momentum_correct", &momentum_correct, py::arg("velocity"), py::arg("grad"),
        py::arg("momentum"),
        "momentum_correct(velocity, grad, momentum) -> None\n\n"
        "DGC's momentum correction before compression, in place: velocity = momentum * velocity\n"
        "+ grad, then grad = velocity (1-D float32 arrays or torch CPU tensors of one size;\n"
        "momentum in [0, 1)). Compress grad with error feedback, then call mask_momentum.");
  m.def("mask_momentum", &mask_momentum, py::arg("velocity"), py::arg("residual"),
        "mask_momentum(velocity, residual) -> bool\n\n"
        "Momentum factor masking after the allreduce, in place: velocity = 0 wherever the\n"
        "error-feedback residual is 0 (its value was sent), unless the whole residual is 0 (the\n"
        "tensor went whole: plain momentum). Returns whether it masked.");
  m.def("inspect", &inspect, py::arg("payload"),
        "inspect(payload) -> dict\n\n"
        "Validates a payload as decode_add would and describes it: codec, spec (the codec and\n"
        "the parameters the payload records), version, n (elements), bytes, header_bytes,\n"
        "ratio (4 n / bytes) and sections (the byte length of each).");
}

}  // namespace gcomp::python
