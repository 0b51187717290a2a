// The Gloo transport's device and rendezvous (gloo_device.hpp).
#include "gloo_device.hpp"

#include <arpa/inet.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace gcomp::detail::gloo_parts {

namespace {

std::string first_of_list(const char* text) {
  std::string s = text ? text : "";
  const auto comma = s.find(',');
  return comma == std::string::npos ? s : s.substr(0, comma);
}

std::string ipv4_of(const gloo::transport::tcp::attr& a) {
  const gloo::transport::tcp::attr resolved = gloo::transport::tcp::CreateDeviceAttr(a);
  if (resolved.ai_family != AF_INET) return "";
  const auto* in = reinterpret_cast<const sockaddr_in*>(&resolved.ai_addr);
  char text[INET_ADDRSTRLEN] = {};
  return inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) ? std::string(text) : "";
}

Device with_address(const gloo::transport::tcp::attr& a) {
  Device d;
  d.device = gloo::transport::tcp::CreateDevice(a);
  d.ipv4 = ipv4_of(a);
  return d;
}

}  // namespace

Device make_device(const GlooOptions& o) {
  gloo::transport::tcp::attr a;
  std::string iface =
      o.interface.empty() ? first_of_list(std::getenv("GLOO_SOCKET_IFNAME")) : o.interface;
  if (!iface.empty()) {
    if (if_nametoindex(iface.c_str()) == 0) {
      throw Error(Status::invalid_argument,
                  "no network interface '" + iface + "' here (" +
                      (o.interface.empty() ? "GLOO_SOCKET_IFNAME" : "GlooOptions::interface") +
                      ")");
    }
    a.iface = iface;
    return guarded("device", [&] { return with_address(a); });
  }
  if (!o.hostname.empty()) {
    a.hostname = o.hostname;
    return guarded("device", [&] { return with_address(a); });
  }
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') {
    try {
      a.hostname = name;
      return with_address(a);
    } catch (...) {
      // The host's name does not resolve to an address of this host: one host only.
    }
  }
  a.hostname = "127.0.0.1";
  return guarded("device", [&] { return with_address(a); });
}

std::string host_key(const GlooOptions& o) {
  if (!o.host.empty()) return o.host;
  if (const char* h = std::getenv("GCOMP_HOST"); h && *h) return h;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  struct stat st {};
  const std::string ns =
      stat("/proc/self/ns/net", &st) == 0 ? std::to_string(st.st_ino) : std::string("?");
  return std::string(name) + "/netns:" + ns;
}

char sockets_setting() {
  const char* v = std::getenv("GCOMP_GLOO_SOCKETS");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return 1;
  return std::strcmp(v, "0") == 0 ? 0 : 2;
}

std::shared_ptr<Context> connect(gloo::rendezvous::Store& store, const std::string& prefix,
                                 int rank, int size,
                                 const std::shared_ptr<gloo::transport::Device>& device,
                                 Ms connect_timeout) {
  auto ctx = std::make_shared<Context>(rank, size);
  ctx->set_all_timeouts(connect_timeout);
  gloo::rendezvous::PrefixStore prefixed(prefix, store);
  auto dev = device;
  guarded("rendezvous", [&] { ctx->connectFullMesh(prefixed, dev); });
  ctx->set_all_timeouts(kForever);
  return ctx;
}

}  // namespace gcomp::detail::gloo_parts
