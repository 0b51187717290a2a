// Uses the installed C++ API: encode with top-k and error feedback, decode.
#include <cstdio>
#include <gcomp/codec.hpp>
#include <vector>

int main() {
  std::vector<float> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  const gcomp::Codec codec("topk:ratio=0.05");
  gcomp::ErrorFeedback ef(x.size());
  const auto payload = codec.encode_ef(ef, x, 1);
  std::vector<float> y(x.size(), 0.0f);
  gcomp::decode_add(payload, y);
  std::printf("consumer: %s, %zu bytes\n", codec.spec().c_str(), payload.size());
  return payload.size() <= codec.max_bytes(x.size()) && y[0] != 0.0f ? 0 : 1;
}
