/* A plain MPI training program that knows nothing of gcomp: an MLP 784-128-10 on Fashion-MNIST,
 * data parallel, momentum SGD, each step's gradients summed with one MPI_Allreduce of a flat
 * float buffer (as hand-written MPI training codes do). Run it as it is, or under the interposer:
 *
 *   mpiexec.mpich -n 4 ./gcomp_plain_train [DATA_DIR [STEPS [velocity|gradient]]]
 *   LD_PRELOAD=libgcomp_preload.so GCOMP_CODEC=topk:ratio=0.01 GCOMP_STATS=1 \
 *       mpiexec.mpich -n 4 ./gcomp_plain_train
 *
 * What it sums (both are momentum SGD on the summed gradient; they differ only in rounding):
 *   velocity (the default): each rank keeps the momentum of its own gradient, v_r = m v_r + g_r,
 *     and the ranks sum their velocities (a sum is linear: the momentum of the sum).
 *   gradient: the ranks sum their gradients and one momentum is applied to the sum.
 * Under a sparsifying codec with error feedback they differ: summing the velocity is DGC's
 * momentum correction (what the codec delays is momentum already applied), while momentum
 * applied after a delayed, sparse sum costs accuracy (docs/interposer.md has both measured).
 *
 * Rank 0 prints the test accuracy, the training seconds and a checksum of the weights (their
 * bits, so that two runs that summed the same gradients print the same line). docs/interposer.md.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

enum { IN = 784, HID = 128, OUT = 10, BATCH = 32 };
enum { NW1 = IN * HID, NB1 = HID, NW2 = HID * OUT, NB2 = OUT };
enum { NPARAM = NW1 + NB1 + NW2 + NB2 };

/* The bytes of a gzipped IDX file after its header of `skip` bytes; exits on any failure. */
static unsigned char* read_idx(const char* dir, const char* name, size_t skip, size_t want) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    fprintf(stderr, "plain_train: cannot open %s\n", path);
    exit(77);
  }
  unsigned char* buf = malloc(skip + want);
  if (!buf || gzread(f, buf, (unsigned)(skip + want)) != (int)(skip + want)) {
    fprintf(stderr, "plain_train: %s is short\n", path);
    exit(1);
  }
  gzclose(f);
  memmove(buf, buf + skip, want);
  return buf;
}

/* A deterministic generator (SplitMix64), the same on every rank. */
static uint64_t mix(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static float uniform(uint64_t* s) { return (float)((mix(s) >> 40) * (1.0 / 16777216.0)); }

/* Logits of one example; h holds the hidden activations. */
static void forward(const float* p, const unsigned char* img, float* h, float* logits) {
  const float* w1 = p;
  const float* b1 = p + NW1;
  const float* w2 = b1 + NB1;
  const float* b2 = w2 + NW2;
  for (int j = 0; j < HID; ++j) h[j] = b1[j];
  for (int i = 0; i < IN; ++i) {
    const float x = img[i] * (1.0f / 255.0f);
    if (x == 0.0f) continue;
    const float* row = w1 + (size_t)i * HID;
    for (int j = 0; j < HID; ++j) h[j] += x * row[j];
  }
  for (int j = 0; j < HID; ++j) h[j] = h[j] > 0 ? h[j] : 0;
  for (int k = 0; k < OUT; ++k) logits[k] = b2[k];
  for (int j = 0; j < HID; ++j) {
    const float* row = w2 + (size_t)j * OUT;
    for (int k = 0; k < OUT; ++k) logits[k] += h[j] * row[k];
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  const long steps = argc > 2 ? atol(argv[2]) : 2 * 60000 / (BATCH * size);
  const char* mode = argc > 3 ? argv[3] : "velocity";
  const int sum_velocity = strcmp(mode, "velocity") == 0;
  if (!sum_velocity && strcmp(mode, "gradient") != 0) {
    if (rank == 0) fprintf(stderr, "plain_train: the third argument is velocity or gradient\n");
    MPI_Finalize();
    return 2;
  }
  const int ntrain = 60000, ntest = 10000;
  unsigned char* train_x = read_idx(dir, "train-images-idx3-ubyte.gz", 16, (size_t)ntrain * IN);
  unsigned char* train_y = read_idx(dir, "train-labels-idx1-ubyte.gz", 8, ntrain);
  unsigned char* test_x = read_idx(dir, "t10k-images-idx3-ubyte.gz", 16, (size_t)ntest * IN);
  unsigned char* test_y = read_idx(dir, "t10k-labels-idx1-ubyte.gz", 8, ntest);

  float* p = malloc(sizeof(float) * NPARAM);
  float* g = malloc(sizeof(float) * NPARAM);
  float* v = calloc(NPARAM, sizeof(float));
  float* u = malloc(sizeof(float) * NPARAM); /* the summed velocities */
  uint64_t seed = 1;
  const float s1 = sqrtf(6.0f / (IN + HID)), s2 = sqrtf(6.0f / (HID + OUT));
  for (int i = 0; i < NW1; ++i) p[i] = (2 * uniform(&seed) - 1) * s1;
  for (int i = 0; i < NB1; ++i) p[NW1 + i] = 0;
  for (int i = 0; i < NW2; ++i) p[NW1 + NB1 + i] = (2 * uniform(&seed) - 1) * s2;
  for (int i = 0; i < NB2; ++i) p[NW1 + NB1 + NW2 + i] = 0;

  const float lr = 0.05f, momentum = 0.9f;
  float h[HID], logits[OUT], dl[OUT], dh[HID];
  uint64_t order = 7;
  const double t0 = MPI_Wtime();
  for (long step = 0; step < steps; ++step) {
    memset(g, 0, sizeof(float) * NPARAM);
    float* gw1 = g;
    float* gb1 = g + NW1;
    float* gw2 = gb1 + NB1;
    float* gb2 = gw2 + NW2;
    for (int b = 0; b < BATCH * size; ++b) {
      const int ex = (int)(mix(&order) % ntrain);  /* the same draws on every rank */
      if (b % size != rank) continue;              /* this rank's share of the global batch */
      const unsigned char* img = train_x + (size_t)ex * IN;
      forward(p, img, h, logits);
      float mx = logits[0], sum = 0;
      for (int k = 1; k < OUT; ++k) mx = logits[k] > mx ? logits[k] : mx;
      for (int k = 0; k < OUT; ++k) sum += expf(logits[k] - mx);
      for (int k = 0; k < OUT; ++k) dl[k] = expf(logits[k] - mx) / sum - (k == train_y[ex]);
      const float* w2 = p + NW1 + NB1;
      for (int j = 0; j < HID; ++j) {
        float d = 0;
        for (int k = 0; k < OUT; ++k) {
          gw2[(size_t)j * OUT + k] += h[j] * dl[k];
          d += w2[(size_t)j * OUT + k] * dl[k];
        }
        dh[j] = h[j] > 0 ? d : 0;
      }
      for (int k = 0; k < OUT; ++k) gb2[k] += dl[k];
      for (int j = 0; j < HID; ++j) gb1[j] += dh[j];
      for (int i = 0; i < IN; ++i) {
        const float x = img[i] * (1.0f / 255.0f);
        if (x == 0.0f) continue;
        float* row = gw1 + (size_t)i * HID;
        for (int j = 0; j < HID; ++j) row[j] += x * dh[j];
      }
    }
    /* The one line gcomp replaces: the velocities (or gradients) summed over the ranks. */
    const float scale = 1.0f / (float)(BATCH * size);
    if (sum_velocity) {
      for (int i = 0; i < NPARAM; ++i) {
        v[i] = momentum * v[i] + g[i] * scale;
        u[i] = v[i];
      }
      MPI_Allreduce(MPI_IN_PLACE, u, NPARAM, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      for (int i = 0; i < NPARAM; ++i) p[i] -= lr * u[i];
    } else {
      MPI_Allreduce(MPI_IN_PLACE, g, NPARAM, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      for (int i = 0; i < NPARAM; ++i) {
        v[i] = momentum * v[i] + g[i] * scale;
        p[i] -= lr * v[i];
      }
    }
  }
  const double seconds = MPI_Wtime() - t0;

  int correct = 0;
  for (int t = rank; t < ntest; t += size) {
    forward(p, test_x + (size_t)t * IN, h, logits);
    int best = 0;
    for (int k = 1; k < OUT; ++k) best = logits[k] > logits[best] ? k : best;
    correct += best == test_y[t];
  }
  int total = 0;
  MPI_Allreduce(&correct, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  uint64_t check = 1469598103934665603ull;
  for (int i = 0; i < NPARAM; ++i) {
    uint32_t bits;
    memcpy(&bits, &p[i], 4);
    check = (check ^ bits) * 1099511628211ull;
  }
  if (rank == 0) {
    printf("plain_train: ranks=%d steps=%ld sum=%s accuracy=%.4f seconds=%.2f weights=%016llx\n",
           size, steps, mode, total / (double)ntest, seconds, (unsigned long long)check);
    fflush(stdout);
  }
  free(p);
  free(g);
  free(v);
  free(u);
  free(train_x);
  free(train_y);
  free(test_x);
  free(test_y);
  MPI_Finalize();
  return 0;
}
