/* LD_PRELOAD probe (#15): give the CUDA streams that DALI creates a high priority.
 *   cc -shared -fPIC -O2 -o /tmp/libprio.so benchmarks/probes/cuda_priority.c -ldl
 *   LD_PRELOAD=/tmp/libprio.so python -m benchmarks.train ...
 * Measured: no effect on the training benchmark (benchmarks/results/h100-train-bound-probes.json).
 * Through interpose.h it wraps cuStreamCreate / cuStreamCreateWithPriority: a call whose caller lives
 * in a library whose path contains PRIO_MATCH (default "dali") gets priority PRIO_VALUE (default
 * -100, clamped by the driver to the greatest). PRIO_NONBLOCK=substring: a blocking stream (flags 0)
 * created from a matching library is made non-blocking. Everything else passes through. PRIO_LOG=1 logs. */
#include "interpose.h" /* first: it defines _GNU_SOURCE */

#include <stdio.h>
#include <stdlib.h>

typedef void *CUstream;

static CUresult (*real_create)(CUstream *, unsigned int);
static CUresult (*real_create_prio)(CUstream *, unsigned int, int);

static int logging(void) { const char *e = getenv("PRIO_LOG"); return e && *e == '1'; }
static int prio_value(void) { const char *e = getenv("PRIO_VALUE"); return e ? atoi(e) : -100; }

static int from_match(void *ret) {
  Dl_info info;
  const char *m = getenv("PRIO_MATCH");
  if (!m) m = "dali";
  if (!dladdr(ret, &info) || !info.dli_fname) return 0;
  return strstr(info.dli_fname, m) != NULL;
}

static const char *caller(void *ret) {
  Dl_info info;
  return dladdr(ret, &info) && info.dli_fname ? info.dli_fname : "?";
}

static void ensure_create_prio(void) {
  if (real_create_prio) return;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h) real_create_prio = real_dlsym(h, "cuStreamCreateWithPriority");
}

static int nonblock_match(void *ret) {
  Dl_info info;
  const char *m = getenv("PRIO_NONBLOCK");
  if (!m || !*m) return 0;
  if (!dladdr(ret, &info) || !info.dli_fname) return 0;
  return strstr(info.dli_fname, m) != NULL;
}

static CUresult my_create(CUstream *s, unsigned int flags) {
  void *ret = __builtin_return_address(0);
  if (flags == 0 && nonblock_match(ret)) {
    if (logging()) fprintf(stderr, "[prio] cuStreamCreate(flags=0) from %s -> non-blocking\n", caller(ret));
    flags = 1;
  }
  ensure_create_prio();
  if (real_create_prio && from_match(ret)) {
    CUresult r = real_create_prio(s, flags, prio_value());
    if (logging()) fprintf(stderr, "[prio] cuStreamCreate(flags=%u) from %s -> priority %d: %d\n", flags, caller(ret), prio_value(), r);
    return r;
  }
  if (logging()) fprintf(stderr, "[prio] cuStreamCreate(flags=%u) from %s passed\n", flags, caller(ret));
  return real_create(s, flags);
}

static CUresult my_create_prio(CUstream *s, unsigned int flags, int p) {
  void *ret = __builtin_return_address(0);
  if (flags == 0 && nonblock_match(ret)) flags = 1;
  int q = (p == 0 && from_match(ret)) ? prio_value() : p;
  if (logging()) fprintf(stderr, "[prio] cuStreamCreateWithPriority(flags=%u, %d) from %s -> %d\n", flags, p, caller(ret), q);
  return real_create_prio(s, flags, q);
}

static void *probe_substitute(const char *sym, void *fn) {
  if (strcmp(sym, "cuStreamCreate") == 0) { real_create = fn; return (void *)my_create; }
  if (strcmp(sym, "cuStreamCreateWithPriority") == 0) { real_create_prio = fn; return (void *)my_create_prio; }
  return fn;
}
