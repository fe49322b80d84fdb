/* LD_PRELOAD probe (#15): which library blocks the host in which CUDA driver call, and for how long.
 *   cc -shared -fPIC -O2 -o /tmp/libsync.so benchmarks/probes/cuda_sync_trace.c -ldl -lpthread
 *   SYNC_OUT=sync.tsv SYNC_RESET_FILE=/tmp/warm LD_PRELOAD=/tmp/libsync.so \
 *       python -m benchmarks.train DATA --models resnet18 --feeds dali-handwritten --mark /tmp/warm
 * Through interpose.h it wraps the driver calls that can wait for the
 * GPU (synchronisations, frees, synchronous copies and memsets, allocations). Per (call, calling
 * library): calls, total and max wall time. Written at exit to $SYNC_OUT (default stderr);
 * SYNC_RESET_FILE: when that file exists, the counters are cleared once (to drop the warm-up).
 * Context calls (cuCtxCreate, cuDevicePrimaryCtxRetain, cuCtxPushCurrent, cuCtxSetCurrent,
 * cuGreenCtxCreate) go to stderr once per (call, library, context): which contexts the libraries use. */
#include "interpose.h" /* first: it defines _GNU_SOURCE */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NFN 24
#define NLIB 32
static const char *fn_names[NFN];
static char lib_names[NLIB][160];
static int nlib;
static u64 calls[NFN][NLIB], total_ns[NFN][NLIB], max_ns[NFN][NLIB];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static u64 now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }

static int lib_index(void *ret) {
  Dl_info info;
  const char *n = (dladdr(ret, &info) && info.dli_fname) ? info.dli_fname : "?";
  const char *b = strrchr(n, '/');
  b = b ? b + 1 : n;
  for (int i = 0; i < nlib; i++) if (strcmp(lib_names[i], b) == 0) return i;
  if (nlib == NLIB) return NLIB - 1;
  strncpy(lib_names[nlib], b, sizeof lib_names[0] - 1);
  return nlib++;
}

static void maybe_reset(void) {
  const char *f = getenv("SYNC_RESET_FILE");
  static int done;
  if (!f || done || access(f, F_OK) != 0) return;
  done = 1;
  memset(calls, 0, sizeof calls); memset(total_ns, 0, sizeof total_ns); memset(max_ns, 0, sizeof max_ns);
}

static void account(int fn, void *ret, u64 t0) {
  u64 d = now() - t0;
  pthread_mutex_lock(&mu);
  maybe_reset();
  int l = lib_index(ret);
  calls[fn][l]++; total_ns[fn][l] += d; if (d > max_ns[fn][l]) max_ns[fn][l] = d;
  pthread_mutex_unlock(&mu);
}

static void dump(void) {
  const char *p = getenv("SYNC_OUT");
  if (nlib == 0) return; /* a process that made no such call (e.g. timeout(1) before python) */
  FILE *f = p ? fopen(p, "w") : stderr;
  if (!f) return;
  fprintf(f, "call\tlibrary\tcalls\ttotal_ms\tmax_ms\n");
  for (int i = 0; i < NFN; i++)
    for (int l = 0; l < nlib; l++)
      if (calls[i][l]) fprintf(f, "%s\t%s\t%llu\t%.2f\t%.3f\n", fn_names[i], lib_names[l], calls[i][l], total_ns[i][l] / 1e6, max_ns[i][l] / 1e6);
  if (f != stderr) fclose(f);
}

__attribute__((constructor)) static void init(void) { atexit(dump); }

/* one timed pass-through wrapper per call, with six integer arguments: under the x86-64 SysV ABI
 * a callee with fewer (integer or pointer) arguments ignores the extra registers */
#define W(idx, name) \
  static CUresult (*r_##name)(u64, u64, u64, u64, u64, u64); \
  static CUresult w_##name(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f) { \
    u64 t = now(); CUresult r = r_##name(a, b, c, d, e, f); account(idx, __builtin_return_address(0), t); return r; }

W(0, cuCtxSynchronize)
W(1, cuStreamSynchronize)
W(2, cuEventSynchronize)
W(3, cuMemFree)
W(4, cuMemFreeHost)
W(5, cuMemAlloc)
W(6, cuMemHostAlloc)
W(7, cuMemAllocHost)
W(8, cuMemcpyHtoD)
W(9, cuMemcpyDtoH)
W(10, cuMemcpy)
W(11, cuMemsetD8)
W(12, cuMemHostRegister)
W(13, cuMemHostUnregister)
W(14, cuStreamQuery)
W(15, cuEventQuery)
W(16, cuMemcpyDtoD)
W(17, cuModuleUnload)
W(18, cuArrayDestroy)


/* context calls: pass-through with 6 integer arguments (SysV: harmless for fewer), logging each
 * distinct (call, library, context) once to stderr */
static char seen[256][200];
static int nseen;
static void note(const char *call, void *ret, u64 ctx) {
  char key[200];
  Dl_info info;
  const char *n = (dladdr(ret, &info) && info.dli_fname) ? info.dli_fname : "?";
  const char *b = strrchr(n, '/');
  snprintf(key, sizeof key, "%s %s ctx=%llx", call, b ? b + 1 : n, ctx);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nseen; i++) if (strcmp(seen[i], key) == 0) { pthread_mutex_unlock(&mu); return; }
  if (nseen < 256) strcpy(seen[nseen++], key);
  pthread_mutex_unlock(&mu);
  fprintf(stderr, "[ctx] %s\n", key);
}
#define G(name, created) \
  static CUresult (*r_##name)(u64, u64, u64, u64, u64, u64); \
  static CUresult w_##name(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f) { \
    CUresult r = r_##name(a, b, c, d, e, f); \
    note(#name, __builtin_return_address(0), created ? (a ? *(u64 *)a : 0) : a); return r; }
G(cuCtxCreate, 1)
G(cuDevicePrimaryCtxRetain, 1)
G(cuCtxPushCurrent, 0)
G(cuCtxSetCurrent, 0)
G(cuGreenCtxCreate, 1)

struct entry { const char *sym; int idx; void **real; void *wrap; };
#define E(i, n) { #n, i, (void **)&r_##n, (void *)w_##n }
static struct entry table[] = {
  E(0, cuCtxSynchronize), E(1, cuStreamSynchronize), E(2, cuEventSynchronize), E(3, cuMemFree),
  E(4, cuMemFreeHost), E(5, cuMemAlloc), E(6, cuMemHostAlloc), E(7, cuMemAllocHost), E(8, cuMemcpyHtoD),
  E(9, cuMemcpyDtoH), E(10, cuMemcpy), E(11, cuMemsetD8), E(12, cuMemHostRegister), E(13, cuMemHostUnregister),
  E(14, cuStreamQuery), E(15, cuEventQuery), E(16, cuMemcpyDtoD), E(17, cuModuleUnload), E(18, cuArrayDestroy),
  E(19, cuCtxCreate), E(20, cuDevicePrimaryCtxRetain), E(21, cuCtxPushCurrent), E(22, cuCtxSetCurrent), E(23, cuGreenCtxCreate),
};

static void *probe_substitute(const char *sym, void *fn) {
  /* names with a version suffix (cuMemFree_v2) or a per-thread one (_ptsz, _ptds) map to the base */
  char base[96];
  strncpy(base, sym, sizeof base - 1); base[sizeof base - 1] = 0;
  int per_thread = 0;
  char *u;
  while ((u = strrchr(base, '_')) && (strcmp(u, "_v2") == 0 || strcmp(u, "_v3") == 0 || strcmp(u, "_v4") == 0 || strcmp(u, "_ptsz") == 0 || strcmp(u, "_ptds") == 0)) {
    if (u[1] == 'p') per_thread = 1;
    *u = 0;
  }
  for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++) {
    if (strcmp(base, table[i].sym) == 0) {
      fn_names[table[i].idx] = table[i].sym;
      /* one real pointer per wrapper: the first version asked for; per-thread variants stay unwrapped */
      if (per_thread || (*table[i].real && *table[i].real != fn)) return fn;
      *table[i].real = fn;
      return table[i].wrap;
    }
  }
  return fn;
}
