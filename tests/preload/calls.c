/* The interposer's test program (tests/preload/preload_test.sh): allreduces it must pass through
 * and allreduces it takes. Rank 0 prints one line per case, "name hash", the hash being FNV-1a
 * of the result's bits (of every rank: each rank's hash is summed in). Run without the
 * interposer and under it: the pass_* lines must be the same. Under it, the taken_* lines say
 * whether a taken call equals gcomp_allreduce with the same codec, seed and error feedback.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomp/gcomp_mpi.h"

enum { BIG = 100000, SMALL = 1000 };

static uint64_t fnv(const void* p, size_t bytes) {
  const unsigned char* b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* The sum over ranks of each rank's hash of its result (wraps; only compared for equality). */
static void report(const char* name, const void* p, size_t bytes) {
  uint64_t mine = fnv(p, bytes), all = 0;
  PMPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) printf("%s %016llx\n", name, (unsigned long long)all);
}

/* Stops every rank where a gcomp call failed. */
static void must(gcomp_status status) {
  if (status != GCOMP_OK) {
    fprintf(stderr, "calls: gcomp: %s\n", gcomp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

/* Rank 0 prints "name yes" when a and b hold the same bits on every rank, else "name no". */
static void say_same(const char* name, const float* a, const float* b, size_t n) {
  int same = memcmp(a, b, sizeof(float) * n) == 0, all_same = 0, rank;
  PMPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) printf("%s %s\n", name, all_same ? "yes" : "no");
}

static void fill(float* x, int n, int rank, int salt) {
  uint64_t s = (uint64_t)(rank + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)salt;
  for (int i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((int64_t)(s >> 33) - (1ll << 30)) / (float)(1 << 30);
  }
}

/* "calls threads": under MPI_THREAD_MULTIPLE, an allreduce from the thread that initialized MPI
   (taken) and one from another thread (passed through), each of the same input on its own
   communicator: rank 0 prints "provided LEVEL", "threads_main HASH" and "threads_other HASH". */
struct other_call {
  const float* x;
  float* y;
  MPI_Comm comm;
};

static void* other_thread(void* arg) {
  struct other_call* c = arg;
  MPI_Allreduce(c->x, c->y, BIG, MPI_FLOAT, MPI_SUM, c->comm);
  return NULL;
}

static int threads_case(int* argc, char*** argv) {
  int provided, rank;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) printf("provided %d\n", provided == MPI_THREAD_MULTIPLE ? 3 : provided);
  float* x = malloc(sizeof(float) * BIG);
  float* y = malloc(sizeof(float) * BIG);
  fill(x, BIG, rank, 9);
  struct other_call c = {x, y, MPI_COMM_NULL};
  MPI_Comm_dup(MPI_COMM_WORLD, &c.comm);
  pthread_t t;
  if (pthread_create(&t, NULL, other_thread, &c) != 0 || pthread_join(t, NULL) != 0) {
    fprintf(stderr, "calls: no thread\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  report("threads_other", y, sizeof(float) * BIG);
  MPI_Allreduce(x, y, BIG, MPI_FLOAT, MPI_SUM, c.comm);
  report("threads_main", y, sizeof(float) * BIG);
  fflush(stdout);
  MPI_Comm_free(&c.comm);
  free(x);
  free(y);
  MPI_Finalize();
  return 0;
}

/* "calls late SECONDS [return]": the last rank spins SECONDS before the second of two taken
   allreduces, which the others are already in (GCOMP_STALL_SECONDS / GCOMP_TIMEOUT_SECONDS set by
   the test). With "return", MPI_COMM_WORLD's errors return: every rank prints "late_status RANK ok"
   or "late_status RANK error", and the rest of the program runs on. */
static int late_case(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const double seconds = *argc > 2 ? atof((*argv)[2]) : 0;
  if (*argc > 3 && strcmp((*argv)[3], "return") == 0) {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  float* x = malloc(sizeof(float) * BIG);
  float* y = malloc(sizeof(float) * BIG);
  fill(x, BIG, rank, 10);
  /* A first taken call, in time: it makes the communicator's gcomp state (collective). */
  MPI_Allreduce(x, y, BIG, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == size - 1) {
    const double until = MPI_Wtime() + seconds;
    while (MPI_Wtime() < until) {
    }
  }
  const int rc = MPI_Allreduce(x, y, BIG, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  printf("late_status %d %s\n", rank, rc == MPI_SUCCESS ? "ok" : "error");
  fflush(stdout);
  free(x);
  free(y);
  MPI_Finalize();
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "threads") == 0) return threads_case(&argc, &argv);
  if (argc > 1 && strcmp(argv[1], "late") == 0) return late_case(&argc, &argv);
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  float* x = malloc(sizeof(float) * BIG);
  float* y = malloc(sizeof(float) * BIG);
  float* z = malloc(sizeof(float) * BIG);
  double* d = malloc(sizeof(double) * BIG);
  double* dy = malloc(sizeof(double) * BIG);

  /* Pass through: another type, another op, a small count, in place or not. */
  for (int i = 0; i < BIG; ++i) d[i] = 1.0 / (i + rank + 1);
  MPI_Allreduce(d, dy, BIG, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  report("pass_double", dy, sizeof(double) * BIG);
  fill(x, BIG, rank, 1);
  MPI_Allreduce(x, y, BIG, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  report("pass_max", y, sizeof(float) * BIG);
  fill(x, SMALL, rank, 2);
  MPI_Allreduce(x, y, SMALL, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  report("pass_small", y, sizeof(float) * SMALL);
  fill(y, SMALL, rank, 3);
  MPI_Allreduce(MPI_IN_PLACE, y, SMALL, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  report("pass_small_in_place", y, sizeof(float) * SMALL);
  for (int i = 0; i < BIG; ++i) dy[i] = 1.0 / (i + 2 * rank + 1);
  MPI_Allreduce(MPI_IN_PLACE, dy, BIG, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  report("pass_double_in_place", dy, sizeof(double) * BIG);
  if (size >= 2) {
    /* An intercommunicator between the even and the odd ranks. */
    MPI_Comm half, inter;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 ? 0 : 1, 99, &inter);
    fill(x, BIG, rank, 4);
    MPI_Allreduce(x, y, BIG, MPI_FLOAT, MPI_SUM, inter);
    report("pass_intercomm", y, sizeof(float) * BIG);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
  }
  MPI_Request req;
  fill(x, BIG, rank, 5);
  MPI_Iallreduce(x, y, BIG, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  report("pass_iallreduce", y, sizeof(float) * BIG);

  /* Taken (when GCOMP_CODEC is set): on a fresh communicator, whose first taken call has seed 0
     and error feedback from zero, against gcomp_allreduce of the same input. */
  const char* spec = getenv("GCOMP_CODEC");
  if (spec && *spec) {
    MPI_Comm fresh;
    MPI_Comm_dup(MPI_COMM_WORLD, &fresh);
    fill(x, BIG, rank, 6);
    MPI_Allreduce(x, y, BIG, MPI_FLOAT, MPI_SUM, fresh);
    report("taken", y, sizeof(float) * BIG);
    gcomp_codec codec;
    gcomp_ef ef = NULL;
    const char* efs = getenv("GCOMP_EF");
    int with_ef = strstr(spec, "topk") == spec && !(efs && strcmp(efs, "0") == 0);
    must(gcomp_codec_create(spec, &codec));
    if (with_ef) must(gcomp_ef_create(BIG, &ef));
    must(gcomp_allreduce(x, z, BIG, codec, ef, 0, fresh));
    say_same("taken_equals_gcomp_allreduce", y, z, BIG);
    /* In place: the same input, the same result (top-k does not draw from the seed; this
       buffer is a new call site, so its residual starts from zero too). */
    memcpy(z, x, sizeof(float) * BIG);
    MPI_Allreduce(MPI_IN_PLACE, z, BIG, MPI_FLOAT, MPI_SUM, fresh);
    say_same("taken_in_place_equals", y, z, BIG);
    if (ef) gcomp_ef_destroy(ef);
    /* "calls sites": error feedback per call site. Three call sites (receive buffers) on a new
       communicator, then the first one again: its result equals gcomp_allreduce with error
       feedback from zero where its residual was freed (GCOMP_EF_MEMORY_MB=1 holds two residuals
       of BIG floats), and with the residual its first call left where it was kept. */
    if (argc > 1 && strcmp(argv[1], "sites") == 0 && with_ef) {
      MPI_Comm sites;
      MPI_Comm_dup(MPI_COMM_WORLD, &sites);
      float* x2 = malloc(sizeof(float) * BIG);
      float* yb = malloc(sizeof(float) * BIG);
      float* yc = malloc(sizeof(float) * BIG);
      fill(x, BIG, rank, 7);
      fill(x2, BIG, rank, 8);
      MPI_Allreduce(x, y, BIG, MPI_FLOAT, MPI_SUM, sites);
      MPI_Allreduce(x, yb, BIG, MPI_FLOAT, MPI_SUM, sites);
      MPI_Allreduce(x, yc, BIG, MPI_FLOAT, MPI_SUM, sites);
      MPI_Allreduce(x2, y, BIG, MPI_FLOAT, MPI_SUM, sites);
      gcomp_ef from_zero, kept;
      must(gcomp_ef_create(BIG, &from_zero));
      must(gcomp_ef_create(BIG, &kept));
      must(gcomp_allreduce(x2, z, BIG, codec, from_zero, 0, sites));
      say_same("site_from_zero", y, z, BIG);
      must(gcomp_allreduce(x, z, BIG, codec, kept, 0, sites));
      must(gcomp_allreduce(x2, z, BIG, codec, kept, 0, sites));
      say_same("site_kept", y, z, BIG);
      gcomp_ef_destroy(from_zero);
      gcomp_ef_destroy(kept);
      free(x2);
      free(yb);
      free(yc);
      MPI_Comm_free(&sites);
    }
    gcomp_codec_destroy(codec);
    MPI_Comm_free(&fresh);
  }
  fflush(stdout);
  free(x);
  free(y);
  free(z);
  free(d);
  free(dy);
  MPI_Finalize();
  return 0;
}
