/*
 * Internal declarations of fsage._live (the live reader's tree walk), shared by its sources:
 *
 *   _live.c          the Python module: walk()'s arguments and result, sort_unique, mallopt
 *   _live_scan.c     reading one directory: listing, statx, FIEMAP, the records of its entries
 *   _live_workers.c  the worker threads, their shared stack, hard links seen, progress
 *   _live_join.c     joining the workers' records into columns sorted by inode
 *
 * Not part of any interface: everything here is hidden inside the module.
 */
#ifndef FSAGE_LIVE_H
#define FSAGE_LIVE_H

#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <malloc.h>

#include <linux/fiemap.h>
#include <linux/fs.h>

#define MODE_WALK 0   /* walk the whole tree below each task */
#define MODE_RECORD 1 /* record each task's directory only (no listing, no device check) */

#define MAX_THREADS 64
#define DENTS_SIZE (256 * 1024)
#define STATX_WANT (STATX_BASIC_STATS | STATX_BTIME)
#define PROGRESS_EVERY 4096 /* records between progress calls */
#define COUNT_FLUSH 256     /* records a worker counts before adding them to the total */

/* fsage's extent flags (fsage/layout.py EXTENT_*; a test holds them equal) */
#define EXTENT_UNWRITTEN 1
#define EXTENT_DELALLOC 2
#define EXTENT_INLINE 4
#define EXTENT_SHARED 8
#define EXTENT_ENCODED 16

/* Functions shared between the module's sources stay out of its exported symbols. */
#define LIVE_INTERNAL __attribute__((visibility("hidden")))

/* ---- growable byte buffers ---------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static inline int buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(buf_t *b, const void *src, size_t n) {
    if (buf_reserve(b, n))
        return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int buf_u64(buf_t *b, uint64_t v) { return buf_put(b, &v, sizeof v); }

static inline void buf_free(buf_t *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* An empty b with room for cap bytes (best effort: b grows as needed anyway). */
static inline void buf_init_cap(buf_t *b, size_t cap) {
    b->p = malloc(cap ? cap : 1);
    b->len = 0;
    b->cap = b->p ? cap : 0;
}

/* A list of (path, errno) pairs: paths concatenated, offsets and errnos beside. */
typedef struct {
    buf_t paths, off, err;
    size_t n;
} pathlist_t;

static inline int pathlist_add(pathlist_t *l, const char *p, size_t len, int err) {
    uint64_t o = l->paths.len;
    int32_t e = err;
    if (buf_put(&l->paths, p, len) || buf_u64(&l->off, o) || buf_put(&l->err, &e, sizeof e))
        return -1;
    l->n++;
    return 0;
}

static inline void pathlist_free(pathlist_t *l) {
    buf_free(&l->paths);
    buf_free(&l->off);
    buf_free(&l->err);
}

/* A set of inode numbers (open addressing; _live_workers.c). */
typedef struct {
    uint64_t *slots; /* 0 = empty; inode 0 is kept in has_zero */
    size_t cap, n;
    int has_zero;
} inoset_t;

/* ---- the walker --------------------------------------------------------------------------- */

typedef struct {
    char *rel; /* from the mount root, "" or "/a/b"; NUL-terminated */
    size_t len;
    uint64_t parent;
    int has_parent;
    long top; /* index among the tasks walk() was given, -1 for a directory found below */
} task_t;

typedef struct {
    task_t *v;
    size_t n, cap;
} tasks_t;

static inline int tasks_push(tasks_t *t, char *rel, size_t len, uint64_t parent,
                             int has_parent, long top) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        task_t *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return -1;
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n] = (task_t){rel, len, parent, has_parent, top};
    t->n++;
    return 0;
}

static inline void tasks_free(tasks_t *t) {
    for (size_t i = 0; i < t->n; i++)
        free(t->v[i].rel);
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
}

typedef struct {
    const char *p;
    size_t len;
} span_t;

/* One file's record; its extents are ext_count ext_t from ext_start in its worker's ext. */
typedef struct {
    uint64_t ino, size, ext_start;
    int64_t atime, mtime, ctime, crtime;
    uint32_t gen, mode, nlink, uid, gid, ext_count;
    uint32_t iflags; /* FS_IOC_GETFLAGS; 0 where not asked or refused */
} rec_t;

/* A merged extent, still in bytes, with its FIEMAP flags (LAST and MERGED cleared). */
typedef struct {
    uint64_t logical, physical, length;
    uint32_t flags, pad;
} ext_t;

/* What the workers share; every field below the mutex is guarded by it. */
typedef struct {
    /* set before the workers start, read-only after */
    int base_fd;
    dev_t dev;
    int mode;
    span_t *subs; /* sorted mount points below the root, relative to it */
    size_t nsubs;
    int sync;
    uint32_t batch;
    int nthreads;
    int want_progress;
    /* written with atomics */
    int stop; /* end the walk early: an error, or the caller's progress raised */
    uint64_t nrec;
    uint64_t next_checkpoint;
    int claimed_failed; /* a hard-linked inode was claimed, then could not be read */
    pthread_mutex_t mu;
    pthread_cond_t work;   /* directories were pushed, or the walk ended */
    pthread_cond_t main;   /* a checkpoint is asked for, or a worker finished */
    pthread_cond_t resume; /* the calling thread answered a checkpoint */
    tasks_t stack;
    size_t active; /* directories being read */
    int finished;  /* workers that have returned */
    uint64_t ck_asked, ck_done, ck_count;
    int64_t *top_ino; /* per task given: its directory's inode, -1 until recorded */
    pthread_mutex_t seen_mu;
    inoset_t seen; /* inodes with more than one link, recorded or claimed */
} shared_t;

typedef struct {
    shared_t *sh;
    int dir_fiemap, getversion; /* cleared when the file system refuses the call */
    int getflags;               /* likewise for FS_IOC_GETFLAGS */
    struct fiemap *fm;
    buf_t recs, ext, lpar, lino, lend, names;
    uint64_t unflushed;
    pathlist_t skipped, not_crossed, no_fiemap;
    uint64_t fiemap_ok;
    int pend_lo, pend_n; /* files read but not yet closed: descriptors pend_lo.. +pend_n-1 */
    tasks_t found;  /* subdirectories of the directory being read */
    buf_t listing;  /* the directory being read, as getdents64 lists it */
    buf_t order;    /* its entries in inode order */
    buf_t scratch;  /* rel + "/" + name for messages and tasks */
    int oom;
} walker_t;

static inline int stopped(const walker_t *w) {
    return w->oom || __atomic_load_n(&w->sh->stop, __ATOMIC_RELAXED);
}

static inline void fail_oom(walker_t *w) {
    w->oom = 1;
    __atomic_store_n(&w->sh->stop, 1, __ATOMIC_RELAXED);
}

/* openat and close through syscall(): glibc's wrappers are thread-cancellation points, which
 * cost two atomic operations per call in a threaded process. */
static inline int xopenat(int dfd, const char *name, int flags) {
    long fd;
    do
        fd = syscall(SYS_openat, dfd, name, flags, 0);
    while (fd < 0 && errno == EINTR);
    return (int)fd;
}

static inline void xclose(int fd) { (void)syscall(SYS_close, fd); }

/* _live_scan.c */
LIVE_INTERNAL int cmp_span(const void *a, const void *b);
/* Read the directory of task t: record it and its entries, queue its subdirectories in
 * w->found. */
LIVE_INTERNAL void process(walker_t *w, const task_t *t);

/* _live_workers.c */
/* Add this worker's uncounted records to the total (and wait for a progress report when one is
 * due and may_wait). */
LIVE_INTERNAL void flush_count(walker_t *w, int may_wait);
/* For an inode with several links: 1 if this worker is the first to see it (and must record
 * it), 0 if it was seen before (only this name is to be added), -1 out of memory. */
LIVE_INTERNAL int claim(walker_t *w, uint64_t ino);
LIVE_INTERNAL void *worker_main(void *arg);
LIVE_INTERNAL int supervise(shared_t *sh, PyObject *progress, uint64_t base, PyThreadState **ts);
LIVE_INTERNAL int walker_init(walker_t *w, shared_t *sh, size_t expect, int dir_fiemap,
                              int getversion);
LIVE_INTERNAL void walker_free(walker_t *w);

/* _live_join.c */
typedef struct {
    uint64_t key;
    uint32_t worker, index;
} sortkey_t;

enum {
    C_INO, C_GEN, C_MODE, C_NLINK, C_UID, C_GID, C_SIZE, C_ATIME, C_MTIME, C_CTIME, C_CRTIME,
    C_FLAGS,
    C_EXT_OFF, C_EXT_LOGICAL, C_EXT_PHYSICAL, C_EXT_LENGTH, C_EXT_FLAGS,
    C_L_PARENT, C_L_INO, C_NAME_OFF, N_COLS
};

typedef struct {
    buf_t col[N_COLS];
    buf_t names;
} joined_t;

/* Sort keys by inode and keep the first of each inode; how many are kept. */
LIVE_INTERNAL size_t sort_unique(sortkey_t *keys, sortkey_t *tmp, size_t n, int use_table);
/* The workers' records as FileTable columns sorted by inode, and their link tables. */
LIVE_INTERNAL int join_workers(walker_t *ws, int nw, uint64_t block_size, int filter_links,
                               joined_t *out);
LIVE_INTERNAL void joined_free(joined_t *j);

#endif
