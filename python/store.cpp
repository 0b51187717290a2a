// The stores of store.hpp.
#include "store.hpp"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "gcomp/error.hpp"

namespace py = pybind11;

namespace gcomp::python {

namespace {

// An object with torch.distributed.Store's methods, called with the GIL taken.
class PythonStore final : public gloo::rendezvous::Store {
 public:
  explicit PythonStore(py::handle store) : store_(py::reinterpret_borrow<py::object>(store)) {}
  ~PythonStore() override {
    py::gil_scoped_acquire gil;
    store_ = py::object();
  }

  void set(const std::string& key, const std::vector<char>& data) override {
    call("set", key, [&] { store_.attr("set")(key, py::bytes(data.data(), data.size())); });
  }

  std::vector<char> get(const std::string& key) override {
    std::vector<char> out;
    call("get", key, [&] {
      const py::object got = store_.attr("get")(key);
      std::string_view bytes;
      if (py::isinstance<py::bytes>(got)) {
        bytes = got.cast<std::string_view>();
      } else {
        const std::string type = py::str(py::type::handle_of(got).attr("__name__"));
        throw Error(Status::transport,
                    "the store's get('" + key + "') returned " + type + ", not bytes");
      }
      out.assign(bytes.begin(), bytes.end());
    });
    return out;
  }

  void wait(const std::vector<std::string>& keys) override {
    call("wait", keys.empty() ? std::string() : keys.front(), [&] { store_.attr("wait")(keys); });
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    call("wait", keys.empty() ? std::string() : keys.front(), [&] {
      const py::object timedelta = py::module_::import("datetime").attr("timedelta");
      store_.attr("wait")(keys, timedelta(py::arg("milliseconds") = timeout.count()));
    });
  }

 private:
  template <class F>
  void call(const char* method, const std::string& key, F&& f) {
    py::gil_scoped_acquire gil;
    try {
      f();
    } catch (py::error_already_set& e) {
      const std::string what = e.what();
      throw Error(Status::transport, "the rendezvous store's " + std::string(method) + "('" + key +
                                         "') raised: " + what);
    }
  }

  py::object store_;
};

}  // namespace

std::unique_ptr<gloo::rendezvous::Store> make_store(py::handle store) {
  const py::object fspath = py::module_::import("os").attr("fspath");
  if (py::isinstance<py::str>(store) || py::hasattr(store, "__fspath__")) {
    const std::string dir = fspath(store).cast<std::string>();
    if (dir.empty()) throw py::value_error("store: an empty path");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      throw Error(Status::invalid_argument,
                  "store: cannot make the directory '" + dir + "': " + ec.message());
    }
    return std::make_unique<gloo::rendezvous::FileStore>(dir);
  }
  for (const char* m : {"set", "get", "wait"}) {
    if (!py::hasattr(store, m)) {
      throw py::type_error(
          "store must be a directory (str or path) or an object with set, get and wait, such "
          "as a torch.distributed.Store; " +
          std::string(py::str(py::type::handle_of(store).attr("__name__"))) + " has no " + m);
    }
  }
  return std::make_unique<PythonStore>(store);
}

}  // namespace gcomp::python
