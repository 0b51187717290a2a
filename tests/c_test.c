/* gcomp.h from C99: create a codec, encode with error feedback, decode, read an error. */
#include <gcomp/gcomp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
              gcomp_last_error());                                                 \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

int main(void) {
  enum { N = 4096 };
  static float x[N], acc[N];
  gcomp_codec codec = NULL;
  gcomp_ef ef = NULL;
  size_t written = 0, cap, i;
  unsigned char* out;
  for (i = 0; i < N; ++i) x[i] = (float)sin((double)i * 0.01);
  CHECK(gcomp_codec_create("qsgd:bits=8,bucket=512", &codec) == GCOMP_OK);
  cap = gcomp_codec_max_bytes(codec, N);
  out = (unsigned char*)malloc(cap);
  CHECK(out != NULL);
  CHECK(gcomp_ef_create(N, &ef) == GCOMP_OK);
  CHECK(gcomp_encode_ef(codec, ef, x, N, 42, out, cap, &written) == GCOMP_OK);
  CHECK(written == cap);
  memset(acc, 0, sizeof acc);
  CHECK(gcomp_decode_add(out, written, acc, N, 1.0f) == GCOMP_OK);
  for (i = 0; i < N; ++i) CHECK(fabs(acc[i] - x[i]) < 0.5);
  CHECK(gcomp_decode_add(out, written, acc, N - 1, 1.0f) == GCOMP_ERR_MISMATCH);
  CHECK(strstr(gcomp_last_error(), "elements") != NULL);
  gcomp_codec_destroy(codec);
  CHECK(gcomp_codec_create("nope", &codec) == GCOMP_ERR_INVALID_ARGUMENT);
  CHECK(codec == NULL);
  CHECK(strstr(gcomp_last_error(), "nope") != NULL);
  printf("gcomp %s from C99: ok (%lu bytes for %d floats)\n", gcomp_version(),
         (unsigned long)written, N);
  gcomp_ef_destroy(ef);
  free(out);
  return 0;
}
