// The timeline (gcomp/timeline.hpp): one buffer a process, behind a mutex, written to the rank's
// file when it holds kBufferBytes and at exit. The array's closing bracket comes at close();
// a file cut short (a killed process) still loads, as the trace format allows.
#include "gcomp/timeline.hpp"

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "gcomp/error.hpp"

namespace gcomp::timeline {

namespace {

std::atomic<bool> g_on{false};      // a file is open
std::atomic<bool> g_paused{false};  // pause() without resume()
std::atomic<bool> g_recording{false};  // g_on and not g_paused: what on() reads

void update() noexcept {
  g_recording.store(g_on.load() && !g_paused.load(), std::memory_order_relaxed);
}

struct Recorder {
  std::mutex mu;
  std::FILE* file = nullptr;
  std::string path;
  std::string buffer;
  int rank = 0;
  double wall_offset = 0;  // wall-clock seconds minus now()'s at open
  std::uint64_t events = 0;
  bool first = true;
  int next_thread = 0;

  void write_out() {
    if (!file || buffer.empty()) return;
    std::fwrite(buffer.data(), 1, buffer.size(), file);
    std::fflush(file);
    buffer.clear();
  }
  // Appends one event (the JSON object) under mu.
  void add(const std::string& event) {
    if (!file) return;
    buffer += first ? "[\n" : ",\n";
    first = false;
    buffer += event;
    ++events;
    if (buffer.size() >= kBufferBytes) write_out();
  }
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

thread_local int t_thread = -1;

// The calling thread's track: 1, 2, ... in the order threads first record.
int thread_of(Recorder& r) {
  if (t_thread < 0) t_thread = ++r.next_thread;
  return t_thread;
}

void append_microseconds(std::string& s, double seconds) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", seconds * 1e6);
  s += buf;
}

std::string head(Recorder& r, std::string_view name, std::string_view category, char phase,
                 double t) {
  std::string e = "{\"name\":" + quoted(name) + ",\"cat\":" + quoted(category) + ",\"ph\":\"";
  e += phase;
  e += "\",\"ts\":";
  append_microseconds(e, t + r.wall_offset);
  e += ",\"pid\":" + std::to_string(r.rank) + ",\"tid\":" + std::to_string(thread_of(r));
  return e;
}

// Ends event e (head()'s and its own fields) with its args, if any, and adds it.
void finish(Recorder& r, std::string& e, std::string_view args) {
  if (!args.empty()) {
    e += ",\"args\":{";
    e += args;
    e += "}";
  }
  e += "}";
  r.add(e);
}

void close_at_exit() { close(); }

}  // namespace

bool on() noexcept { return g_recording.load(std::memory_order_relaxed); }

void pause() noexcept {
  g_paused.store(true);
  update();
}

void resume() noexcept {
  g_paused.store(false);
  update();
}

double now() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string path_for(std::string_view file, int rank) {
  std::string base(file);
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0) base.resize(base.size() - 5);
  return base + "." + std::to_string(rank) + ".json";
}

void open(std::string_view file, int rank) {
  if (file.empty()) throw Error(Status::invalid_argument, "timeline: the file name is empty");
  Recorder& r = recorder();
  const std::string p = path_for(file, rank);
  std::lock_guard lock(r.mu);
  if (r.file) {
    if (r.path == p) return;
    throw Error(Status::invalid_argument,
                "timeline: already writing " + r.path + ", cannot also write " + p);
  }
  std::FILE* f = std::fopen(p.c_str(), "w");
  if (!f) throw Error(Status::invalid_argument, "timeline: cannot write " + p);
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(close_at_exit); });
  r.file = f;
  r.path = p;
  r.rank = rank;
  r.first = true;
  r.events = 0;
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  r.wall_offset = wall - now();
  r.add("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
        ",\"tid\":0,\"args\":{\"name\":\"rank " + std::to_string(rank) + "\"}}");
  r.add("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
        ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(rank) + "}}");
  g_on.store(true);
  update();
}

void open_from_environment(int rank) {
  const char* file = std::getenv("GCOMP_TIMELINE");
  if (!file || !*file || g_on.load()) return;
  open(file, rank);
}

void close() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  g_on.store(false);
  update();
  if (!r.file) return;
  if (r.first) r.buffer += "[";
  r.buffer += "\n]\n";
  r.write_out();
  std::fclose(r.file);
  r.file = nullptr;
}

std::string path() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  return r.file ? r.path : std::string();
}

void span(std::string_view name, std::string_view category, double start, double end,
          std::string_view args) {
  if (!on()) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  std::string e = head(r, name, category, 'X', start);
  e += ",\"dur\":";
  append_microseconds(e, end > start ? end - start : 0.0);
  finish(r, e, args);
}

void async(char phase, std::string_view name, std::string_view category, std::uint64_t id,
           double t, std::string_view args) {
  if (!on()) return;
  if (phase != 'b' && phase != 'e') {
    throw Error(Status::invalid_argument, "timeline: an async event's phase is 'b' or 'e'");
  }
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  std::string e = head(r, name, category, phase, t);
  e += ",\"id\":" + std::to_string(id);
  finish(r, e, args);
}

void thread_name(std::string_view name) {
  if (!on()) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  r.add("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(r.rank) +
        ",\"tid\":" + std::to_string(thread_of(r)) + ",\"args\":{\"name\":" + quoted(name) +
        "}}");
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::uint64_t events() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  return r.events;
}

}  // namespace gcomp::timeline
