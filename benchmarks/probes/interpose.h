/* What the LD_PRELOAD probes share: how to get between a CUDA library and the driver.
 * DALI and nvJPEG link cudart statically and load libcuda with dlopen; cudart then takes the
 * driver's entry points through dlsym(cuGetProcAddress*) and cuGetProcAddress, and DALI's own
 * stubs through dlsym. So: interpose dlsym, wrap cuGetProcAddress (v1 and v2 ABIs), and hand every
 * entry point asked for to the including file's
 *     static void *probe_substitute(const char *sym, void *fn);
 * which keeps fn as the real one and returns its wrapper, or returns fn. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long u64;

static void *(*real_dlsym)(void *, const char *);
static CUresult (*real_gpa1)(const char *, void **, int, u64);
static CUresult (*real_gpa2)(const char *, void **, int, u64, int *);

static void *probe_substitute(const char *sym, void *fn);
static CUresult my_gpa1(const char *sym, void **pfn, int ver, u64 flags);
static CUresult my_gpa2(const char *sym, void **pfn, int ver, u64 flags, int *status);

static void resolve_real(void) {
  if (real_dlsym) return;
  real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym) real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

static void *substitute(const char *sym, void *fn) {
  if (strcmp(sym, "cuGetProcAddress_v2") == 0) { real_gpa2 = fn; return (void *)my_gpa2; }
  if (strcmp(sym, "cuGetProcAddress") == 0) { real_gpa1 = fn; return (void *)my_gpa1; }
  return probe_substitute(sym, fn);
}

/* asked through cuGetProcAddress itself, "cuGetProcAddress" comes in the v2 ABI from CUDA 12 on */
static void *substitute_versioned(const char *sym, void *fn, int ver) {
  if (strcmp(sym, "cuGetProcAddress") == 0 && ver >= 12000) { real_gpa2 = fn; return (void *)my_gpa2; }
  return substitute(sym, fn);
}

static CUresult my_gpa1(const char *sym, void **pfn, int ver, u64 flags) {
  CUresult r = real_gpa1(sym, pfn, ver, flags);
  if (r == 0 && pfn && *pfn) *pfn = substitute_versioned(sym, *pfn, ver);
  return r;
}

static CUresult my_gpa2(const char *sym, void **pfn, int ver, u64 flags, int *status) {
  CUresult r = real_gpa2(sym, pfn, ver, flags, status);
  if (r == 0 && pfn && *pfn) *pfn = substitute_versioned(sym, *pfn, ver);
  return r;
}

void *dlsym(void *handle, const char *sym) {
  resolve_real();
  void *fn = real_dlsym(handle, sym);
  if (!fn || strncmp(sym, "cu", 2) != 0) return fn;
  return substitute(sym, fn);
}
