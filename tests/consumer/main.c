/* Uses the installed C API. */
#include <gcomp/gcomp.h>
#include <stdio.h>

int main(void) {
  gcomp_codec c = NULL;
  if (gcomp_codec_create("sign", &c) != GCOMP_OK) return 1;
  printf("consumer_c: gcomp %s, %lu bytes max for 64 floats\n", gcomp_version(),
         (unsigned long)gcomp_codec_max_bytes(c, 64));
  gcomp_codec_destroy(c);
  return 0;
}
