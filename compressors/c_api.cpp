// The C API (include/gcomp/gcomp.h): a thin layer over the C++ API that turns exceptions into
// status codes and keeps the message per thread for gcomp_last_error().
#include <string>

#include "c_handles.hpp"

namespace {
thread_local std::string last_error;
}  // namespace

gcomp_status gcomp::detail::set_last_error(gcomp_status s, std::string message) {
  last_error = std::move(message);
  return s;
}

namespace {

gcomp_status fail(gcomp_status s, std::string message) {
  return gcomp::detail::set_last_error(s, std::move(message));
}

}  // namespace

using gcomp::detail::guarded;

extern "C" {

gcomp_status gcomp_codec_create(const char* spec, gcomp_codec* out) {
  if (!out) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_codec_create: out is NULL");
  *out = nullptr;
  if (!spec) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_codec_create: spec is NULL");
  return guarded([&] { *out = new gcomp_codec_s{gcomp::Codec(spec)}; });
}

void gcomp_codec_destroy(gcomp_codec codec) { delete codec; }

size_t gcomp_codec_max_bytes(gcomp_codec codec, size_t n) {
  if (!codec) {
    fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_codec_max_bytes: codec is NULL");
    return 0;
  }
  size_t r = 0;
  guarded([&] { r = codec->codec.max_bytes(n); }, "gcomp_codec_max_bytes");
  return r;
}

gcomp_status gcomp_encode(gcomp_codec codec, const float* x, size_t n, uint64_t seed, void* out,
                          size_t capacity, size_t* written) {
  if (!codec) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode: codec is NULL");
  if (!x && n > 0) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode: x is NULL");
  if (!out && capacity > 0) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode: out is NULL");
  if (!written) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode: written is NULL");
  *written = 0;
  const gcomp_status s = guarded([&] {
    *written = codec->codec.encode({x, n}, seed, {static_cast<std::byte*>(out), capacity});
  });
  if (s == GCOMP_ERR_BUFFER_TOO_SMALL) guarded([&] { *written = codec->codec.max_bytes(n); });
  return s;
}

gcomp_status gcomp_ef_create(size_t n, gcomp_ef* out) {
  if (!out) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_ef_create: out is NULL");
  *out = nullptr;
  return guarded([&] { *out = new gcomp_ef_s{gcomp::ErrorFeedback(n)}; }, "gcomp_ef_create");
}

void gcomp_ef_destroy(gcomp_ef ef) { delete ef; }

gcomp_status gcomp_encode_ef(gcomp_codec codec, gcomp_ef ef, const float* x, size_t n,
                             uint64_t seed, void* out, size_t capacity, size_t* written) {
  if (!codec) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode_ef: codec is NULL");
  if (!ef) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode_ef: ef is NULL");
  if (!x && n > 0) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode_ef: x is NULL");
  if (!out && capacity > 0) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode_ef: out is NULL");
  if (!written) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_encode_ef: written is NULL");
  *written = 0;
  const gcomp_status s = guarded([&] {
    *written =
        codec->codec.encode_ef(ef->ef, {x, n}, seed, {static_cast<std::byte*>(out), capacity});
  });
  if (s == GCOMP_ERR_BUFFER_TOO_SMALL) guarded([&] { *written = codec->codec.max_bytes(n); });
  return s;
}

gcomp_status gcomp_decode_add(const void* payload, size_t bytes, float* acc, size_t n,
                              float alpha) {
  if (!payload && bytes > 0)
    return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_decode_add: payload is NULL");
  if (!acc && n > 0) return fail(GCOMP_ERR_INVALID_ARGUMENT, "gcomp_decode_add: acc is NULL");
  return guarded([&] {
    gcomp::decode_add({static_cast<const std::byte*>(payload), bytes}, {acc, n}, alpha);
  });
}

const char* gcomp_last_error(void) { return last_error.c_str(); }

gcomp_status gcomp_set_num_threads(int threads) {
  return guarded([&] { gcomp::set_num_threads(threads); });
}

const char* gcomp_version(void) { return GCOMP_VERSION; }

}  // extern "C"
