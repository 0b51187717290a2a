// The wire format rejects every malformed payload with Status::bad_payload (or mismatch for a
// caller whose n differs), and never touches the accumulator when it does.
#include "wire.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "bytes.hpp"
#include "index_pack.hpp"
#include "test_util.hpp"

namespace gcomp {
namespace {

using detail::load_le;
using detail::store_le;

// Re-signs a header after a deliberate edit, so the checks behind the checksum get exercised.
void reseal(std::vector<std::byte>& p) {
  detail::Layout l{};
  ASSERT_TRUE(detail::layout_of(static_cast<std::uint8_t>(p[5]), &l));
  const std::size_t at = detail::header_bytes(l) - 4;
  store_le<std::uint32_t>(p.data() + at, detail::crc32c(p.data(), at));
}

Status decode_status(const std::vector<std::byte>& p, std::size_t n) {
  std::vector<float> acc(n, 1.0f);
  try {
    decode_add(p, acc);
  } catch (const Error& e) {
    for (float v : acc) {
      if (v != 1.0f) return Status::internal;  // touched the accumulator
    }
    return e.code();
  }
  return Status::ok;
}

class Wire : public ::testing::TestWithParam<std::string> {};

TEST_P(Wire, EveryTruncationIsRejected) {
  const std::size_t n = 301;
  const auto p = Codec(GetParam()).encode(test::normal(n, 1), 1);
  ASSERT_EQ(decode_status(p, n), Status::ok);
  for (std::size_t len = 0; len < p.size(); ++len) {
    const std::vector<std::byte> cut(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(len));
    ASSERT_EQ(decode_status(cut, n), Status::bad_payload) << GetParam() << " length " << len;
  }
  auto longer = p;
  longer.push_back(std::byte{0});
  EXPECT_EQ(decode_status(longer, n), Status::bad_payload);
}

TEST_P(Wire, EveryHeaderBitFlipIsRejected) {
  const std::size_t n = 301;
  const auto p = Codec(GetParam()).encode(test::normal(n, 2), 1);
  const std::size_t header = inspect(p).header_bytes;
  for (std::size_t i = 0; i < header; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      auto q = p;
      q[i] ^= static_cast<std::byte>(1 << bit);
      ASSERT_EQ(decode_status(q, n), Status::bad_payload)
          << GetParam() << " byte " << i << " bit " << bit;
    }
  }
}

TEST_P(Wire, WrongElementCount) {
  const std::size_t n = 301;
  const auto p = Codec(GetParam()).encode(test::normal(n, 3), 1);
  EXPECT_EQ(decode_status(p, n - 1), Status::mismatch);
  EXPECT_EQ(decode_status(p, n + 1), Status::mismatch);
  EXPECT_EQ(decode_status(p, 0), Status::mismatch);
  // A resealed header that claims n = 1 no longer fits its sections (or, sparse, its entries).
  auto q = p;
  store_le<std::uint64_t>(q.data() + 8, 1);
  reseal(q);
  EXPECT_EQ(decode_status(q, 1), Status::bad_payload) << GetParam();
}

TEST_P(Wire, UnknownVersionAndCodec) {
  const auto p = Codec(GetParam()).encode(test::normal(10, 4), 1);
  auto q = p;
  for (int version : {0, 3}) {
    q[4] = static_cast<std::byte>(version);
    reseal(q);
    EXPECT_EQ(decode_status(q, 10), Status::bad_payload) << version;
  }
  // Version 1 differs from 2 only in the sparse codecs' indices: a dense payload relabelled 1
  // still reads, a sparse one (packed indices where u32s belong) does not.
  q = p;
  q[4] = std::byte{1};
  reseal(q);
  EXPECT_EQ(decode_status(q, 10),
            Codec(GetParam()).properties().sparse ? Status::bad_payload : Status::ok);
  q = p;
  q[5] = std::byte{0};
  EXPECT_EQ(decode_status(q, 10), Status::bad_payload);
  q[5] = std::byte{200};
  EXPECT_EQ(decode_status(q, 10), Status::bad_payload);
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, Wire, ::testing::ValuesIn(test::all_specs()),
                         [](const auto& info) { return test::name_of(info.param); });

// A version 1 sparse payload with chosen indices and values (fp32 values, u32 indices): version
// 1 is still read.
std::vector<std::byte> sparse_payload(std::uint64_t n, const std::vector<std::uint32_t>& idx,
                                      const std::vector<float>& val) {
  std::vector<std::byte> p(detail::header_bytes({16, 2}) + 8 * idx.size());
  std::byte params[16] = {};
  params[1] = std::byte{4};
  store_le<std::uint64_t>(params + 8, idx.size());
  std::byte* d =
      detail::write_header(p.data(), CodecKind::topk, n, params, {4 * idx.size(), 4 * val.size()});
  for (std::size_t j = 0; j < idx.size(); ++j) {
    store_le<std::uint32_t>(d + 4 * j, idx[j]);
    store_le<float>(d + 4 * idx.size() + 4 * j, val[j]);
  }
  p[4] = std::byte{1};
  reseal(p);
  return p;
}

// A version 2 sparse payload: the indices packed as gaps (index_pack.hpp), as given.
std::vector<std::byte> packed_payload(std::uint64_t n, const std::vector<std::byte>& packed,
                                      const std::vector<float>& val) {
  std::vector<std::byte> p(detail::header_bytes({16, 2}) + packed.size() + 4 * val.size());
  std::byte params[16] = {};
  store_le<std::uint64_t>(params + 8, val.size());
  std::byte* d = detail::write_header(p.data(), CodecKind::topk, n, params,
                                      {packed.size(), 4 * val.size()});
  std::copy(packed.begin(), packed.end(), d);
  for (std::size_t j = 0; j < val.size(); ++j) store_le<float>(d + packed.size() + 4 * j, val[j]);
  return p;
}

std::vector<std::byte> pack(const std::vector<std::uint64_t>& idx, std::uint64_t n) {
  std::vector<std::byte> out(detail::packed_indices_bound(idx.size(), n));
  out.resize(detail::pack_indices(idx.data(), idx.size(), out.data()));
  return out;
}

TEST(WireSparse, PackedIndicesAreChecked) {
  const std::vector<float> val = {1, 2, 3};
  // Gaps 1, 1, 26: one block of width 5, 15 bits in two bytes.
  const auto good = pack({1, 3, 30}, 100);
  ASSERT_EQ(good.size(), 3u);
  EXPECT_EQ(decode_status(packed_payload(100, good, val), 100), Status::ok);
  std::vector<float> acc(100, 0.0f);
  decode_add(packed_payload(100, good, val), acc);
  EXPECT_EQ(acc[1], 1.0f);
  EXPECT_EQ(acc[3], 2.0f);
  EXPECT_EQ(acc[30], 3.0f);
  auto bad = good;
  bad[2] |= std::byte{0x80};  // a padding bit
  EXPECT_EQ(decode_status(packed_payload(100, bad, val), 100), Status::bad_payload);
  bad = good;
  bad[0] = std::byte{65};  // a width beyond 64
  EXPECT_EQ(decode_status(packed_payload(100, bad, val), 100), Status::bad_payload);
  // A non-finite value behind valid indices (validated and decoded in one pass: nothing added).
  EXPECT_EQ(decode_status(packed_payload(100, good, {1, std::numeric_limits<float>::quiet_NaN(), 3}),
                          100),
            Status::bad_payload);
  // The last index at n.
  EXPECT_EQ(decode_status(packed_payload(30, pack({1, 3, 30}, 31), val), 30),
            Status::bad_payload);
  // A section longer or shorter than its blocks.
  bad = good;
  bad.push_back(std::byte{0});
  EXPECT_EQ(decode_status(packed_payload(100, bad, val), 100), Status::bad_payload);
  bad = good;
  bad.pop_back();
  EXPECT_EQ(decode_status(packed_payload(100, bad, val), 100), Status::bad_payload);
  // Version 2 takes index format 0 only.
  auto p = packed_payload(100, good, val);
  p[detail::kFixedHeader + 1] = std::byte{4};
  reseal(p);
  EXPECT_EQ(decode_status(p, 100), Status::bad_payload);
}

TEST(WireSparse, IndicesMustBeInRangeAndStrictlyIncreasing) {
  EXPECT_EQ(decode_status(sparse_payload(10, {1, 5, 9}, {1, 2, 3}), 10), Status::ok);
  EXPECT_EQ(decode_status(sparse_payload(10, {1, 5, 10}, {1, 2, 3}), 10), Status::bad_payload);
  EXPECT_EQ(decode_status(sparse_payload(10, {1, 0xffffffffu}, {1, 2}), 10), Status::bad_payload);
  EXPECT_EQ(decode_status(sparse_payload(10, {5, 1, 9}, {1, 2, 3}), 10), Status::bad_payload);
  EXPECT_EQ(decode_status(sparse_payload(10, {1, 5, 5}, {1, 2, 3}), 10), Status::bad_payload);
  EXPECT_EQ(decode_status(sparse_payload(10, {}, {}), 10), Status::ok);
  // More entries than elements.
  std::vector<std::uint32_t> many(11);
  for (std::uint32_t i = 0; i < 11; ++i) many[i] = i;
  EXPECT_EQ(decode_status(sparse_payload(10, many, std::vector<float>(11, 1.0f)), 10),
            Status::bad_payload);
  // Non-finite values.
  EXPECT_EQ(decode_status(sparse_payload(10, {1}, {std::numeric_limits<float>::infinity()}), 10),
            Status::bad_payload);
  EXPECT_EQ(decode_status(sparse_payload(10, {1}, {std::numeric_limits<float>::quiet_NaN()}), 10),
            Status::bad_payload);
  // An entry count whose byte lengths wrap around 2^64 to zero.
  {
    std::vector<std::byte> p(detail::header_bytes({16, 2}));
    std::byte params[16] = {};
    params[1] = std::byte{8};
    store_le<std::uint64_t>(params + 8, 1ull << 62);  // x 8 and x 4 bytes wrap to 0
    detail::write_header(p.data(), CodecKind::topk, 1ull << 62, params, {0, 0});
    EXPECT_THROW(inspect(p), Error);
  }
  // Wrong index width, value type, reserved bytes.
  auto p = sparse_payload(10, {1}, {1});
  p[detail::kFixedHeader + 1] = std::byte{8};
  reseal(p);
  EXPECT_EQ(decode_status(p, 10), Status::bad_payload);
  p = sparse_payload(10, {1}, {1});
  p[detail::kFixedHeader] = std::byte{7};
  reseal(p);
  EXPECT_EQ(decode_status(p, 10), Status::bad_payload);
  p = sparse_payload(10, {1}, {1});
  p[detail::kFixedHeader + 5] = std::byte{1};
  reseal(p);
  EXPECT_EQ(decode_status(p, 10), Status::bad_payload);
}

TEST(WireDense, NonFiniteValuesAndPaddingAreRejected) {
  const auto x = test::normal(21, 5);
  for (const char* spec : {"none", "fp16", "bf16"}) {
    auto p = Codec(spec).encode(x, 0);
    const std::size_t h = inspect(p).header_bytes;
    const std::size_t w = std::string(spec) == "none" ? 4 : 2;
    // Set all exponent bits of element 20.
    if (w == 4) {
      store_le<std::uint32_t>(p.data() + h + 80, 0x7f800000u);
    } else {
      store_le<std::uint16_t>(p.data() + h + 40, std::string(spec) == "fp16" ? 0x7c00 : 0x7f80);
    }
    EXPECT_EQ(decode_status(p, 21), Status::bad_payload) << spec;
  }
  // Sign: 21 elements use 3 bytes; the 3 spare bits must be zero. Also a negative scale.
  auto s = Codec("sign").encode(x, 0);
  s.back() |= std::byte{0x80};
  EXPECT_EQ(decode_status(s, 21), Status::bad_payload);
  s = Codec("sign").encode(x, 0);
  const std::size_t h = inspect(s).header_bytes;
  store_le<float>(s.data() + h, -1.0f);
  EXPECT_EQ(decode_status(s, 21), Status::bad_payload);
  // TernGrad: code 3 is invalid; padding bits must be zero.
  auto t = Codec("terngrad").encode(x, 0);
  const std::size_t th = inspect(t).header_bytes;
  t[th + 4] |= std::byte{0x03};
  EXPECT_EQ(decode_status(t, 21), Status::bad_payload);
  t = Codec("terngrad").encode(x, 0);
  t.back() |= std::byte{0x40};
  EXPECT_EQ(decode_status(t, 21), Status::bad_payload);
  // QSGD: a NaN norm, padding bits.
  auto q = Codec("qsgd:bits=3").encode(x, 0);
  const std::size_t qh = inspect(q).header_bytes;
  store_le<std::uint32_t>(q.data() + qh, 0x7fc00000u);
  EXPECT_EQ(decode_status(q, 21), Status::bad_payload);
  q = Codec("qsgd:bits=3").encode(x, 0);  // 63 bits in 8 bytes
  q.back() |= std::byte{0x80};
  EXPECT_EQ(decode_status(q, 21), Status::bad_payload);
}

TEST(WireInspect, ReportsTheHeader) {
  const auto p = Codec("qsgd:bits=8,bucket=128").encode(test::normal(1000, 6), 1);
  const PayloadInfo info = inspect(p);
  EXPECT_EQ(info.kind, CodecKind::qsgd);
  EXPECT_EQ(info.version, 2);
  EXPECT_EQ(info.elements, 1000u);
  EXPECT_EQ(info.params, "bits=8,bucket=128,norm=l2");
  ASSERT_EQ(info.sections.size(), 2u);
  EXPECT_EQ(info.sections[0], 4u * 8);
  EXPECT_EQ(info.sections[1], 1000u);
  EXPECT_EQ(info.total_bytes, p.size());
  EXPECT_EQ(std::memcmp(p.data(), "GCMP", 4), 0);
}

TEST(WireDecode, AlphaScalesAndAccumulates) {
  const auto x = test::normal(100, 7);
  const auto p = Codec("none").encode(x, 0);
  std::vector<float> acc(100, 1.0f);
  decode_add(p, acc, 2.0f);
  decode_add(p, acc, -0.5f);
  for (std::size_t i = 0; i < 100; ++i) EXPECT_EQ(acc[i], 1.0f + 2.0f * x[i] + -0.5f * x[i]);
  EXPECT_THROW(decode_add(p, acc, std::numeric_limits<float>::infinity()), Error);
}


// A topk_chunked payload as given: its parameters (values 0 f32 / 1 f16 / 2 codes, the index
// format 0 packed gaps / 1 chunk-relative, the code bits, the chunk and the two counts) and its
// three sections.
struct Chunked {
  std::uint8_t values = 2, format = 1, bits = 2;
  std::uint64_t n = 20, chunk = 8, per_chunk = 2, last = 1;
  std::vector<std::byte> index, scales, codes;
  std::vector<std::byte> payload() const {
    std::vector<std::byte> p(detail::header_bytes({32, 3}) + index.size() + scales.size() +
                             codes.size());
    std::byte params[32] = {};
    params[0] = std::byte{values};
    params[1] = std::byte{format};
    params[2] = std::byte{bits};
    store_le<std::uint64_t>(params + 8, chunk);
    store_le<std::uint64_t>(params + 16, per_chunk);
    store_le<std::uint64_t>(params + 24, last);
    std::byte* d = detail::write_header(p.data(), CodecKind::topk_chunked, n, params,
                                        {index.size(), scales.size(), codes.size()});
    for (const auto* sec : {&index, &scales, &codes}) {
      std::copy(sec->begin(), sec->end(), d);
      d += sec->size();
    }
    return p;
  }
};

std::vector<std::byte> floats(std::initializer_list<float> v) {
  std::vector<std::byte> out(4 * v.size());
  std::size_t j = 0;
  for (float f : v) store_le<float>(out.data() + 4 * j++, f);
  return out;
}

// 20 elements in chunks of 8, 8 and 4; two entries in each full chunk, one in the last: the
// relative indices 1, 6 | 0, 7 | 3 at 3 bits (15 bits: two bytes), scales 2, 4, 8, and 2-bit codes
// 1 (level 1, +), 2 (level 0, -) | 0, 3 | 1 (10 bits: two bytes).
Chunked good_chunked() {
  Chunked c;
  std::uint32_t rel = 1 | 6u << 3 | 0u << 6 | 7u << 9 | 3u << 12;
  c.index = {std::byte(rel & 0xff), std::byte(rel >> 8)};
  c.scales = floats({2, 4, 8});
  std::uint32_t codes = 1 | 2u << 2 | 0u << 4 | 3u << 6 | 1u << 8;
  c.codes = {std::byte(codes & 0xff), std::byte(codes >> 8)};
  return c;
}

TEST(WireChunked, ACraftedPayloadDecodesAsDefined) {
  const Chunked c = good_chunked();
  std::vector<float> acc(20, 0.0f);
  decode_add(c.payload(), acc);
  // Level l decodes to scale (2l + 1) / 4 at 2 bits, negated with the sign bit (2).
  std::vector<float> want(20, 0.0f);
  want[1] = 2 * 0.75f;
  want[6] = -2 * 0.25f;
  want[8] = 4 * 0.25f;
  want[15] = -4 * 0.75f;
  want[19] = 8 * 0.75f;
  EXPECT_EQ(acc, want);
  // The same entries with the indices packed as gaps: 1, 6, 8, 15, 19.
  Chunked g = c;
  g.format = 0;
  g.index = pack({1, 6, 8, 15, 19}, 20);
  std::vector<float> acc2(20, 0.0f);
  decode_add(g.payload(), acc2);
  EXPECT_EQ(acc2, want);
  EXPECT_EQ(inspect(g.payload()).params,
            "chunk=8,per_chunk=2,last=1,nnz=5,index=packed,values=bits2");
}

TEST(WireChunked, EveryRuleIsChecked) {
  const Chunked good = good_chunked();
  ASSERT_EQ(decode_status(good.payload(), 20), Status::ok);
  auto bad = [&](auto edit) {
    Chunked c = good;
    edit(c);
    return decode_status(c.payload(), c.n);
  };
  // Parameters.
  EXPECT_EQ(bad([](Chunked& c) { c.values = 3; }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.format = 2; }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.bits = 0; }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.bits = 9; }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.chunk = 0; }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.chunk = (std::uint64_t{1} << 31) + 1; }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.per_chunk = 9; }), Status::bad_payload);  // above the chunk
  EXPECT_EQ(bad([](Chunked& c) { c.last = 5; }), Status::bad_payload);  // above the last chunk's 4
  EXPECT_EQ(bad([](Chunked& c) { c.per_chunk = 3; }), Status::bad_payload);  // sections too short
  EXPECT_EQ(bad([](Chunked& c) { c.n = 0; }), Status::bad_payload);  // entries without elements
  auto reserved = good.payload();
  reserved[detail::kFixedHeader + 4] = std::byte{1};
  reseal(reserved);
  EXPECT_EQ(decode_status(reserved, 20), Status::bad_payload);
  // Float values with code bits, codes without scales, scales where there are no codes.
  EXPECT_EQ(bad([](Chunked& c) { c.values = 0; }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.scales.clear(); }), Status::bad_payload);
  // Relative indices: padding, one at the chunk's end, one not above the one before.
  EXPECT_EQ(bad([](Chunked& c) { c.index[1] |= std::byte{0x80}; }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) {  // the last chunk's index 4 (it holds 4 elements)
              std::uint32_t rel = 1 | 6u << 3 | 0u << 6 | 7u << 9 | 4u << 12;
              c.index = {std::byte(rel & 0xff), std::byte(rel >> 8)};
            }),
            Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) {  // 6 then 1 in the first chunk
              std::uint32_t rel = 6 | 1u << 3 | 0u << 6 | 7u << 9 | 3u << 12;
              c.index = {std::byte(rel & 0xff), std::byte(rel >> 8)};
            }),
            Status::bad_payload);
  // Packed gaps whose chunks do not hold their counts (three in the first chunk).
  EXPECT_EQ(bad([](Chunked& c) {
              c.format = 0;
              c.index = pack({1, 3, 6, 15, 19}, 20);
            }),
            Status::bad_payload);
  // Scales: negative (also -0), NaN, Inf; codes: padding.
  EXPECT_EQ(bad([](Chunked& c) { c.scales = floats({2, -4, 8}); }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.scales = floats({2, -0.0f, 8}); }), Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.scales = floats({2, 4, std::numeric_limits<float>::quiet_NaN()}); }),
            Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.scales = floats({std::numeric_limits<float>::infinity(), 4, 8}); }),
            Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) { c.codes[1] |= std::byte{0x10}; }), Status::bad_payload);
  // Float values: non-finite ones.
  EXPECT_EQ(bad([](Chunked& c) {
              c.values = 0;
              c.bits = 0;
              c.scales.clear();
              c.codes = floats({1, 2, 3, std::numeric_limits<float>::infinity(), 5});
            }),
            Status::bad_payload);
  EXPECT_EQ(bad([](Chunked& c) {
              c.values = 0;
              c.bits = 0;
              c.scales.clear();
              c.codes = floats({1, 2, 3, 4, 5});
            }),
            Status::ok);
  // Version 1 had no such codec.
  auto old = good.payload();
  old[4] = std::byte{1};
  reseal(old);
  EXPECT_EQ(decode_status(old, 20), Status::bad_payload);
}

}  // namespace
}  // namespace gcomp
