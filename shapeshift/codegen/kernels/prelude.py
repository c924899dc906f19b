"""The includes and shared helpers that every kernel fragment may rely on.

Kept small: anything here is compiled into every model's library.
"""

#: The includes: what a kernel fragment compiled as an object of its own starts with.
HEADER = """\
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#include <float.h>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif
"""

#: A model's translation unit starts with this: the includes, the one function every model
#: library exports (in one unit only: objects linked beside it must not define it), and what
#: each segment function runs first (``ss_enter_threads``, with its session's thread count).
PRELUDE = HEADER + r"""
#ifdef __linux__
#include <sys/syscall.h>
/* glibc declares these only for _GNU_SOURCE / POSIX, which -std=c11 leaves off. */
extern int sched_getcpu(void);
extern long syscall(long number, ...);
extern int setenv(const char* name, const char* value, int overwrite);
extern int pthread_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void));
#endif

/* The thread count of a kernel library's parallel regions where no session gives one: what
   the tuner's workers and the benches time kernels with (ss_segment_enter). A model's
   segments take their session's count as an argument instead (ss_enter_threads): two
   sessions of one model share this library, and with the count kept here the one made last
   set it for both (a session of 1 thread ran on 2 after a 2-thread session of the same
   model was made in the process). */
static int ss_num_threads;
void ss_set_num_threads(int n) { ss_num_threads = n; omp_set_num_threads(n); }

/* Keeps the calling thread's OpenMP workers off the CPU it runs on. After the process has
   been idle for tens of milliseconds (a server between requests), a VM's idle vCPU is
   descheduled by its host, Linux then finds no idle CPU to wake a worker on, and puts it
   on the caller's: the two share one CPU, every parallel region waits for a time slice,
   and a run took 8x its time (yolov8n at 64x96 on 2 threads, 20 ms between runs: 15.9
   ms against 1.1 back to back and onnxruntime's 2.1; AMD Zen 4 VM). Each worker may run
   on any CPU the caller may, but the caller's own; set again only when the caller has
   moved (sched_getcpu: a few nanoseconds), so a run pays one or two system calls at most.
   Not where the user binds threads (OMP_PROC_BIND, OMP_PLACES) or allows one CPU. The
   workers' thread ids are the team's, gathered once per calling thread and team size.
   Linux only (its system calls), as is what it works around. */
#ifdef __linux__
#define SS_MAX_WORKERS 255
#define SS_MASK_WORDS 16 /* 1024 CPUs */
static _Thread_local long ss_worker_tids[SS_MAX_WORKERS];
static _Thread_local int ss_workers;          /* how many tids are known */
static _Thread_local int ss_gathered_for;     /* the team size they were gathered for (0: none) */
static _Thread_local int ss_placed_from = -1; /* the caller's CPU when they were placed */

static inline void ss_place_workers(int n) {
    const int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= 64 * SS_MASK_WORDS || (cpu == ss_placed_from && ss_gathered_for == n)) return;
    if (ss_gathered_for != n) {
        /* Into the caller's stack: inside the region each thread's _Thread_local is its own. */
        long tids[SS_MAX_WORKERS];
        int team = 1;
        #pragma omp parallel num_threads(n)
        {
            const int t = omp_get_thread_num();
            if (t == 0) team = omp_get_num_threads();
            else if (t <= SS_MAX_WORKERS) tids[t - 1] = syscall(SYS_gettid);
        }
        /* OpenMP may give fewer threads than asked (OMP_THREAD_LIMIT, OMP_DYNAMIC): those
           it gave, and not asked again at every call. */
        ss_workers = team - 1 < SS_MAX_WORKERS ? team - 1 : SS_MAX_WORKERS;
        ss_gathered_for = n;
        memcpy(ss_worker_tids, tids, (size_t)ss_workers * sizeof *tids);
    }
    unsigned long mask[SS_MASK_WORDS] = {0};
    if (syscall(SYS_sched_getaffinity, 0, sizeof mask, mask) <= 0) return;
    mask[cpu / 64] &= ~(1UL << (cpu % 64));
    int others = 0;
    for (int w = 0; w < SS_MASK_WORDS; ++w) others |= mask[w] != 0;
    ss_placed_from = cpu;
    if (!others) return;
    for (int i = 0; i < ss_workers; ++i)
        if (syscall(SYS_sched_setaffinity, ss_worker_tids[i], sizeof mask, mask) != 0) {
            ss_gathered_for = 0; /* a thread the pool has replaced: gathered again next time */
            ss_placed_from = -1;
            return;
        }
}
#else
static inline void ss_place_workers(int n) { (void)n; }
#endif

/* A process forked from one whose forking thread had run parallel regions: libgomp keeps
   that thread's pool of workers, which the child does not have, and the child's first
   region waited for them forever (a server forking its workers after a warm-up run; a
   multiprocessing pool). In the child, that thread (the child's first: its id is the
   child's pid) runs one thread; other threads get pools of their own. The child handler of
   each library loaded at the fork marks it, and names it in the environment for the
   libraries loaded later. */
#define SS_FORKED_ENV "SHAPESHIFT_FORKED_PID"
/* Per library and thread: 0 not looked at yet, 1 may run a team, 2 a forked thread: one. */
static _Thread_local int ss_thread_kind;

#ifdef __linux__
static void ss_after_fork_in_child(void) {
    char text[24], *end = text + sizeof text - 1;
    long pid = syscall(SYS_getpid);
    *end = 0;
    do { *--end = (char)('0' + pid % 10); pid /= 10; } while (pid > 0 && end > text);
    setenv(SS_FORKED_ENV, end, 1);
    ss_thread_kind = 2;
}

__attribute__((constructor)) static void ss_prelude_loaded(void) {
    pthread_atfork(NULL, NULL, ss_after_fork_in_child);
}

static int ss_forked_thread(void) {
    const char* named = getenv(SS_FORKED_ENV);
    const long pid = syscall(SYS_getpid);
    return named && atol(named) == pid && syscall(SYS_gettid) == pid;
}
#else
static int ss_forked_thread(void) { return 0; }
#endif

/* Runs this thread's parallel regions on `threads` threads (<= 0: the library's count,
   else OpenMP's). OpenMP keeps the count per calling thread, so it is set again wherever
   it differs: a session run from another thread than the one that made it ran its regions
   on every core instead. */
static inline void ss_enter_threads(int threads) {
    if (ss_thread_kind == 0) ss_thread_kind = ss_forked_thread() ? 2 : 1;
    const int n = ss_thread_kind == 2 ? 1 : threads > 0 ? threads
                  : ss_num_threads > 0 ? ss_num_threads : omp_get_max_threads();
    if (omp_get_max_threads() != n) omp_set_num_threads(n);
    if (n > 1 && omp_get_proc_bind() == omp_proc_bind_false && !omp_in_parallel()) ss_place_workers(n);
}

/* What a kernel timed outside a session runs first: the library's count. */
static inline void ss_segment_enter(void) { ss_enter_threads(0); }
"""
