// The C API from C++: statuses, last-error messages, the written/capacity contract, NULLs.
#include <gcomp/gcomp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace {

TEST(CApi, RoundTripWithErrorFeedback) {
  gcomp_codec codec = nullptr;
  ASSERT_EQ(gcomp_codec_create("topk:ratio=0.1", &codec), GCOMP_OK);
  std::vector<float> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  std::vector<unsigned char> buf(gcomp_codec_max_bytes(codec, x.size()));
  size_t written = 0;
  ASSERT_EQ(gcomp_encode(codec, x.data(), x.size(), 1, buf.data(), buf.size(), &written), GCOMP_OK);
  EXPECT_LE(written, buf.size());  // the packed indices take what their gaps need
  EXPECT_GT(written, 100u * 4);   // 100 float32 values at least
  std::vector<float> acc(x.size(), 0.0f);
  ASSERT_EQ(gcomp_decode_add(buf.data(), written, acc.data(), acc.size(), 1.0f), GCOMP_OK);
  int nonzero = 0;
  for (float v : acc) nonzero += v != 0;
  EXPECT_EQ(nonzero, 100);

  gcomp_ef ef = nullptr;
  ASSERT_EQ(gcomp_ef_create(x.size(), &ef), GCOMP_OK);
  ASSERT_EQ(gcomp_encode_ef(codec, ef, x.data(), x.size(), 2, buf.data(), buf.size(), &written),
            GCOMP_OK);
  EXPECT_EQ(gcomp_encode_ef(codec, ef, x.data(), x.size() - 1, 2, buf.data(), buf.size(), &written),
            GCOMP_ERR_INVALID_ARGUMENT);
  gcomp_ef_destroy(ef);
  gcomp_codec_destroy(codec);
}

TEST(CApi, ErrorsCarryStatusAndMessage) {
  gcomp_codec codec = reinterpret_cast<gcomp_codec>(0x1);
  EXPECT_EQ(gcomp_codec_create("qsgd:bits=12", &codec), GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(codec, nullptr);
  EXPECT_NE(std::string(gcomp_last_error()).find("qsgd:bits=12"), std::string::npos);
  EXPECT_EQ(gcomp_codec_create(nullptr, &codec), GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gcomp_codec_create("none", nullptr), GCOMP_ERR_INVALID_ARGUMENT);

  ASSERT_EQ(gcomp_codec_create("sign", &codec), GCOMP_OK);
  float x[3] = {1.0f, NAN, 2.0f};
  unsigned char out[256];
  size_t written = 99;
  EXPECT_EQ(gcomp_encode(codec, x, 3, 0, out, sizeof out, &written), GCOMP_ERR_NONFINITE);
  EXPECT_NE(std::string(gcomp_last_error()).find("element 1"), std::string::npos);
  x[1] = 0.5f;
  EXPECT_EQ(gcomp_encode(codec, x, 3, 0, out, 4, &written), GCOMP_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(written, gcomp_codec_max_bytes(codec, 3));
  EXPECT_EQ(gcomp_encode(codec, nullptr, 3, 0, out, sizeof out, &written),
            GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gcomp_encode(codec, x, 3, 0, out, sizeof out, nullptr), GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gcomp_encode(nullptr, x, 3, 0, out, sizeof out, &written), GCOMP_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(gcomp_encode(codec, x, 3, 0, out, sizeof out, &written), GCOMP_OK);
  float acc[3] = {0, 0, 0};
  EXPECT_EQ(gcomp_decode_add(out, written - 1, acc, 3, 1.0f), GCOMP_ERR_BAD_PAYLOAD);
  EXPECT_EQ(gcomp_decode_add(out, written, acc, 2, 1.0f), GCOMP_ERR_MISMATCH);
  EXPECT_EQ(gcomp_decode_add(nullptr, written, acc, 3, 1.0f), GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gcomp_decode_add(out, written, acc, 3, 1.0f), GCOMP_OK);
  EXPECT_EQ(gcomp_codec_max_bytes(nullptr, 10), 0u);
  EXPECT_EQ(gcomp_set_num_threads(0), GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gcomp_set_num_threads(1), GCOMP_OK);
  gcomp_codec_destroy(codec);
  gcomp_codec_destroy(nullptr);
  gcomp_ef_destroy(nullptr);
}

// Sizes computed from an element count never wrap around: above 2^60 elements max_bytes fails
// (0 and a message naming the call) instead of returning a small number, and error-feedback
// memory that large is an invalid argument, not an internal error.
TEST(CApi, CountsBeyondTheLimitAreInvalidArguments) {
  gcomp_codec none = nullptr;
  ASSERT_EQ(gcomp_codec_create("none", &none), GCOMP_OK);
  EXPECT_EQ(gcomp_codec_max_bytes(none, std::size_t{1} << 62), 0u);
  EXPECT_NE(std::string(gcomp_last_error()).find("gcomp_codec_max_bytes"), std::string::npos)
      << gcomp_last_error();
  EXPECT_EQ(gcomp_codec_max_bytes(none, SIZE_MAX), 0u);
  gcomp_codec_destroy(none);
  // Up to the limit no codec's bound shrinks as n grows (no wrap-around inside it).
  constexpr std::size_t kMax = gcomp::kMaxElements;
  for (const auto& spec : gcomp::test::all_specs()) {
    gcomp_codec c = nullptr;
    ASSERT_EQ(gcomp_codec_create(spec.c_str(), &c), GCOMP_OK);
    const std::size_t top = gcomp_codec_max_bytes(c, kMax);
    EXPECT_GE(top, gcomp_codec_max_bytes(c, kMax / 2)) << spec;
    EXPECT_GE(gcomp_codec_max_bytes(c, kMax / 2), gcomp_codec_max_bytes(c, 1000)) << spec;
    EXPECT_EQ(gcomp_codec_max_bytes(c, kMax + 1), 0u) << spec;
    gcomp_codec_destroy(c);
  }
  gcomp_ef ef = reinterpret_cast<gcomp_ef>(&ef);  // not null: the call must clear it
  EXPECT_EQ(gcomp_ef_create(SIZE_MAX, &ef), GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ef, nullptr);
  EXPECT_NE(std::string(gcomp_last_error()).find("gcomp_ef_create"), std::string::npos)
      << gcomp_last_error();
  EXPECT_THROW(gcomp::ErrorFeedback(kMax + 1), gcomp::Error);
}

TEST(CApi, LastErrorIsPerThread) {
  gcomp_codec c = nullptr;
  EXPECT_NE(gcomp_codec_create("bogus", &c), GCOMP_OK);
  std::string other;
  std::thread t([&] { other = gcomp_last_error(); });
  t.join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(gcomp_last_error()).find("bogus"), std::string::npos);
}

}  // namespace
