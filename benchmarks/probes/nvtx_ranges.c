/* NVTX injection probe (#35): every NVTX range a process pushes (DALI's "[DALI][GPU op] name",
 * "[DALI][CPU op] name", its executor's steps), with its thread, start and end, written at exit. What a
 * pipeline's operators cost on the host, operator by operator, without Nsight Systems.
 *   cc -shared -fPIC -O2 -I/usr/local/cuda/include -o /tmp/libnvtxr.so benchmarks/probes/nvtx_ranges.c -lpthread
 *   NVTX_INJECTION64_PATH=/tmp/libnvtxr.so NVTX_OUT=ranges.tsv python -m benchmarks.probes.kernels ...
 * NVTX_OUT (default stderr; NVTX_PER_PID=1: NVTX_OUT.<pid>, for processes that fork): one line per range, "tid<TAB>start_ns<TAB>end_ns<TAB>name" (CLOCK_MONOTONIC, the
 * clock of Python's time.monotonic_ns). At most NVTX_MAX ranges (default 400,000) are kept; the rest are counted. */
#define NVTX_NO_IMPL /* the types only: this library is what NVTX loads */
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NAME 72
#define DEPTH 64
typedef struct { uint64_t start, end; int tid; char name[NAME]; } range_t;
static range_t *ranges;
static size_t cap;
static atomic_size_t used, dropped;

typedef struct { uint64_t start; char name[NAME]; } open_t;
static __thread open_t stack[DEPTH];
static __thread int depth;
static __thread int my_tid;

static uint64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }

static const char *message(const nvtxEventAttributes_t *a) {
  if (!a) return "?";
  if (a->messageType == NVTX_MESSAGE_TYPE_ASCII) return a->message.ascii ? a->message.ascii : "?";
  if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) return (const char *)a->message.registered;  /* our handles: strings */
  return "?";
}

static int push(const char *name) {
  if (!my_tid) my_tid = (int)syscall(SYS_gettid);
  if (depth < DEPTH) {
    stack[depth].start = now();
    strncpy(stack[depth].name, name, NAME - 1);
    stack[depth].name[NAME - 1] = 0;
  }
  return depth++;
}

static int pop(void) {
  if (depth <= 0) return -1;
  depth--;
  if (depth >= DEPTH) return depth;
  size_t i = atomic_fetch_add(&used, 1);
  if (i >= cap) { atomic_fetch_add(&dropped, 1); return depth; }
  ranges[i].start = stack[depth].start;
  ranges[i].end = now();
  ranges[i].tid = my_tid;
  memcpy(ranges[i].name, stack[depth].name, NAME);
  return depth;
}

static int NVTX_API range_push_ex(const nvtxEventAttributes_t *a) { return push(message(a)); }
static int NVTX_API range_push_a(const char *m) { return push(m ? m : "?"); }
static int NVTX_API range_pop(void) { return pop(); }
static int NVTX_API domain_push_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { (void)d; return push(message(a)); }
static int NVTX_API domain_pop(nvtxDomainHandle_t d) { (void)d; return pop(); }
static nvtxStringHandle_t NVTX_API register_string(nvtxDomainHandle_t d, const char *s) {
  (void)d;
  return (nvtxStringHandle_t)strdup(s ? s : "?");
}

static void dump(void) {
  const char *path = getenv("NVTX_OUT");
  char with_pid[4096];
  if (path && getenv("NVTX_PER_PID")) {  /* forked children (a loader's workers) write files of their own */
    snprintf(with_pid, sizeof with_pid, "%s.%d", path, (int)getpid());
    path = with_pid;
  }
  FILE *f = path ? fopen(path, "w") : stderr;
  if (!f) return;
  size_t n = atomic_load(&used);
  if (n > cap) n = cap;
  for (size_t i = 0; i < n; i++)
    fprintf(f, "%d\t%llu\t%llu\t%s\n", ranges[i].tid, (unsigned long long)ranges[i].start,
            (unsigned long long)ranges[i].end, ranges[i].name);
  fprintf(f, "# kept %zu dropped %zu\n", n, atomic_load(&dropped));
  if (f != stderr) fclose(f);
}

static void set(const NvtxExportTableCallbacks *cb, NvtxCallbackModule module, int id, NvtxFunctionPointer fn) {
  NvtxFunctionTable table = 0;
  unsigned int size = 0;
  if (!cb->GetModuleFunctionTable(module, &table, &size) || !table || (unsigned)id >= size) return;
  *table[id] = fn;
}

int NVTX_API InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  if (!cb) return 0;
  const char *max = getenv("NVTX_MAX");
  cap = max ? strtoull(max, 0, 10) : 400000;
  ranges = calloc(cap, sizeof(range_t));
  if (!ranges) return 0;
  set(cb, NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePushEx, (NvtxFunctionPointer)range_push_ex);
  set(cb, NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePushA, (NvtxFunctionPointer)range_push_a);
  set(cb, NVTX_CB_MODULE_CORE, NVTX_CBID_CORE_RangePop, (NvtxFunctionPointer)range_pop);
  set(cb, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRangePushEx, (NvtxFunctionPointer)domain_push_ex);
  set(cb, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRangePop, (NvtxFunctionPointer)domain_pop);
  set(cb, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRegisterStringA, (NvtxFunctionPointer)register_string);
  atexit(dump);
  return 1;
}
