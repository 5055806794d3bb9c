/*
 * fsage._live: the tree walk of the live reader (fsage/snapshotter/live.py) in C.
 *
 * walk() reads a mounted tree relative to directory file descriptors: getdents64 on each
 * directory, openat + statx + FS_IOC_GETVERSION + FS_IOC_FIEMAP on each regular file, statx on
 * everything else. It runs on its own worker threads (without the GIL), which share one stack
 * of pending directories, so a wide or lopsided tree keeps every thread busy. Each worker
 * unshares its file-descriptor table: the kernel then neither locks a shared table on every
 * open and close nor takes a reference on every ioctl, which is what lets two threads run
 * almost twice as fast as one. The calling thread only reports progress and watches for
 * signals.
 *
 * Adjacent FIEMAP extents are merged as they are read; at the end the records of all workers
 * are sorted by inode number (radix sort) and handed to Python as the columns of a FileTable
 * (fsage/layout.py), each a Buffer that numpy wraps without a copy:
 *
 *   ino u64, generation u32, mode u32, nlink u32, uid u32, gid u32, size u64,
 *   atime, mtime, ctime, crtime i64 (ns; crtime from statx's btime, 0 where missing),
 *   ext_off u64[n+1], ext_logical, ext_physical, ext_length u64 (blocks), ext_flags u32
 *   l_parent, l_ino u64[m], name_off u64[m+1], names bytes: the link table
 *
 * Walk rules, hard-link handling and what is skipped are those of the Python walk in live.py,
 * so both give the same Layout (the link table's order aside).
 */
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

/* ---- growable byte buffers ---------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static int buf_reserve(buf_t *b, size_t extra) {
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

static int buf_put(buf_t *b, const void *src, size_t n) {
    if (buf_reserve(b, n))
        return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static int buf_u64(buf_t *b, uint64_t v) { return buf_put(b, &v, sizeof v); }

static void buf_free(buf_t *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* An empty b with room for cap bytes (best effort: b grows as needed anyway). */
static void buf_init_cap(buf_t *b, size_t cap) {
    b->p = malloc(cap ? cap : 1);
    b->len = 0;
    b->cap = b->p ? cap : 0;
}

/* A list of (path, errno) pairs: paths concatenated, offsets and errnos beside. */
typedef struct {
    buf_t paths, off, err;
    size_t n;
} pathlist_t;

static int pathlist_add(pathlist_t *l, const char *p, size_t len, int err) {
    uint64_t o = l->paths.len;
    int32_t e = err;
    if (buf_put(&l->paths, p, len) || buf_u64(&l->off, o) || buf_put(&l->err, &e, sizeof e))
        return -1;
    l->n++;
    return 0;
}

static void pathlist_free(pathlist_t *l) {
    buf_free(&l->paths);
    buf_free(&l->off);
    buf_free(&l->err);
}

/* ---- a set of inode numbers (open addressing) --------------------------------------------- */

typedef struct {
    uint64_t *slots; /* 0 = empty; inode 0 is kept in has_zero */
    size_t cap, n;
    int has_zero;
} inoset_t;

static size_t ino_hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static int inoset_has(const inoset_t *s, uint64_t ino) {
    if (ino == 0)
        return s->has_zero;
    if (!s->cap)
        return 0;
    for (size_t i = ino_hash(ino) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->slots[i] == ino)
            return 1;
        if (s->slots[i] == 0)
            return 0;
    }
}

static int inoset_add(inoset_t *s, uint64_t ino) {
    if (ino == 0) {
        s->has_zero = 1;
        return 0;
    }
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        uint64_t *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return -1;
        for (size_t j = 0; j < s->cap; j++) {
            uint64_t v = s->slots[j];
            if (!v)
                continue;
            size_t i = ino_hash(v) & (cap - 1);
            while (slots[i])
                i = (i + 1) & (cap - 1);
            slots[i] = v;
        }
        free(s->slots);
        s->slots = slots;
        s->cap = cap;
    }
    size_t i = ino_hash(ino) & (s->cap - 1);
    while (s->slots[i] && s->slots[i] != ino)
        i = (i + 1) & (s->cap - 1);
    if (!s->slots[i]) {
        s->slots[i] = ino;
        s->n++;
    }
    return 0;
}

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

static int tasks_push(tasks_t *t, char *rel, size_t len, uint64_t parent, int has_parent,
                      long top) {
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

static void tasks_free(tasks_t *t) {
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

static int stopped(const walker_t *w) {
    return w->oom || __atomic_load_n(&w->sh->stop, __ATOMIC_RELAXED);
}

static void fail_oom(walker_t *w) {
    w->oom = 1;
    __atomic_store_n(&w->sh->stop, 1, __ATOMIC_RELAXED);
}

static void note(walker_t *w, pathlist_t *l, const char *rel, size_t rlen, const char *name,
                 int err) {
    /* Append rel (+ "/" + name) with err to l. */
    w->scratch.len = 0;
    if (buf_put(&w->scratch, rel, rlen) ||
        (name && (buf_put(&w->scratch, "/", 1) || buf_put(&w->scratch, name, strlen(name)))) ||
        pathlist_add(l, w->scratch.p ? w->scratch.p : "", w->scratch.len, err))
        fail_oom(w);
}

static int cmp_span(const void *a, const void *b) {
    const span_t *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c)
        return c;
    return (x->len > y->len) - (x->len < y->len);
}

static int is_submount(const shared_t *sh, const char *rel, size_t len) {
    if (!sh->nsubs)
        return 0;
    span_t key = {rel, len};
    return bsearch(&key, sh->subs, sh->nsubs, sizeof key, cmp_span) != NULL;
}

static int xstatx(int dfd, const char *name, int flags, struct statx *sx) {
    int r;
    do
        r = statx(dfd, name, flags, STATX_WANT, sx);
    while (r < 0 && errno == EINTR);
    return r;
}

/* statx of an open file. Linux 6.11 and later take a NULL path, which spares copying and
 * looking up the empty name; older kernels answer EFAULT, and "" is used from then on. */
static int null_path_ok = 1;

static int fstatx(int fd, struct statx *sx) {
    if (__atomic_load_n(&null_path_ok, __ATOMIC_RELAXED)) {
        int r;
        do
            r = (int)syscall(SYS_statx, fd, NULL, AT_EMPTY_PATH, STATX_WANT, sx);
        while (r < 0 && errno == EINTR);
        if (r == 0 || errno != EFAULT)
            return r;
        __atomic_store_n(&null_path_ok, 0, __ATOMIC_RELAXED);
    }
    return xstatx(fd, "", AT_EMPTY_PATH, sx);
}

/* openat and close through syscall(): glibc's wrappers are thread-cancellation points, which
 * cost two atomic operations per call in a threaded process. */
static int xopenat(int dfd, const char *name, int flags) {
    long fd;
    do
        fd = syscall(SYS_openat, dfd, name, flags, 0);
    while (fd < 0 && errno == EINTR);
    return (int)fd;
}

static void xclose(int fd) { (void)syscall(SYS_close, fd); }

/* Files are closed in runs with one close_range: the descriptors of one directory's files
 * are consecutive (the lowest free number is always taken), and every number in a run is a
 * descriptor this worker opened, so the run closes nothing else. */
#define CLOSE_RUN 64

static void close_pending(walker_t *w) {
    if (w->pend_n > 1 && syscall(SYS_close_range, (unsigned)w->pend_lo,
                                 (unsigned)(w->pend_lo + w->pend_n - 1), 0) == 0) {
        w->pend_n = 0;
        return;
    }
    for (int i = 0; i < w->pend_n; i++)
        xclose(w->pend_lo + i);
    w->pend_n = 0;
}

static void close_later(walker_t *w, int fd) {
    if (w->pend_n && fd != w->pend_lo + w->pend_n)
        close_pending(w);
    if (!w->pend_n)
        w->pend_lo = fd;
    if (++w->pend_n == CLOSE_RUN)
        close_pending(w);
}

/* Open the directory at rel (below the base), component by component when the path is long. */
static int open_rel(const shared_t *sh, const char *rel, size_t len, int flags) {
    if (len == 0)
        return xopenat(sh->base_fd, ".", flags);
    if (len < PATH_MAX - 1)
        return xopenat(sh->base_fd, rel + 1, flags);
    int cur = -1;
    const char *p = rel;
    const char *end = rel + len;
    char comp[NAME_MAX + 1];
    while (p < end) {
        while (p < end && *p == '/')
            p++;
        const char *q = p;
        while (q < end && *q != '/')
            q++;
        size_t n = (size_t)(q - p);
        if (n > NAME_MAX) {
            if (cur >= 0)
                xclose(cur);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(comp, p, n);
        comp[n] = 0;
        int last = q >= end;
        int fd = xopenat(cur >= 0 ? cur : sh->base_fd, comp,
                         last ? flags : O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int saved = errno;
        if (cur >= 0)
            xclose(cur);
        if (fd < 0) {
            errno = saved;
            return -1;
        }
        cur = fd;
        p = q;
    }
    return cur;
}

/* ---- progress: workers ask, the calling thread (which holds the GIL) answers ------------- */

/* Add this worker's uncounted records to the total; when the total passes the next multiple
 * of PROGRESS_EVERY, wait while the calling thread reports it (so a progress callback sees
 * the walk paused, as with one thread it always is). */
static void flush_count(walker_t *w, int may_wait) {
    shared_t *sh = w->sh;
    uint64_t total = __atomic_add_fetch(&sh->nrec, w->unflushed, __ATOMIC_RELAXED);
    w->unflushed = 0;
    if (!may_wait || !sh->want_progress ||
        total < __atomic_load_n(&sh->next_checkpoint, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&sh->mu);
    if (total >= sh->next_checkpoint) {
        sh->next_checkpoint = (total / PROGRESS_EVERY + 1) * PROGRESS_EVERY;
        uint64_t seq = ++sh->ck_asked;
        sh->ck_count = total;
        pthread_cond_signal(&sh->main);
        while (sh->ck_done < seq && !__atomic_load_n(&sh->stop, __ATOMIC_RELAXED))
            pthread_cond_wait(&sh->resume, &sh->mu);
    }
    pthread_mutex_unlock(&sh->mu);
}

static void record(walker_t *w, const struct statx *sx, uint32_t gen, size_t ext_start,
                   long n_ext) {
    rec_t r = {
        .ino = sx->stx_ino,
        .size = sx->stx_size,
        .ext_start = ext_start,
        .atime = sx->stx_atime.tv_sec * 1000000000LL + sx->stx_atime.tv_nsec,
        .mtime = sx->stx_mtime.tv_sec * 1000000000LL + sx->stx_mtime.tv_nsec,
        .ctime = sx->stx_ctime.tv_sec * 1000000000LL + sx->stx_ctime.tv_nsec,
        .crtime = (sx->stx_mask & STATX_BTIME)
                      ? sx->stx_btime.tv_sec * 1000000000LL + sx->stx_btime.tv_nsec
                      : 0,
        .gen = gen,
        .mode = sx->stx_mode,
        .nlink = sx->stx_nlink,
        .uid = sx->stx_uid,
        .gid = sx->stx_gid,
        .ext_count = (uint32_t)n_ext,
    };
    if (buf_put(&w->recs, &r, sizeof r)) {
        fail_oom(w);
        return;
    }
    if (++w->unflushed == COUNT_FLUSH)
        flush_count(w, 1);
}

static void link_name(walker_t *w, uint64_t parent, uint64_t ino, const char *name, size_t n) {
    if (buf_u64(&w->lpar, parent) || buf_u64(&w->lino, ino) || buf_put(&w->names, name, n) ||
        buf_u64(&w->lend, w->names.len))
        fail_oom(w);
}

/* For an inode with several links: 1 if this worker is the first to see it (and must record
 * it), 0 if it was seen before (only this name is to be added), -1 out of memory. */
static int claim(walker_t *w, uint64_t ino) {
    shared_t *sh = w->sh;
    pthread_mutex_lock(&sh->seen_mu);
    int r = inoset_has(&sh->seen, ino) ? 0 : (inoset_add(&sh->seen, ino) ? -1 : 1);
    pthread_mutex_unlock(&sh->seen_mu);
    if (r < 0)
        fail_oom(w);
    return r;
}

static uint32_t generation(walker_t *w, int fd) {
    if (!w->getversion)
        return 0;
    long v = 0;
    int r;
    do
        r = ioctl(fd, FS_IOC_GETVERSION, &v);
    while (r < 0 && errno == EINTR);
    if (r < 0) {
        w->getversion = 0;
        return 0;
    }
    return (uint32_t)v;
}

static int joins(const ext_t *prev, const struct fiemap_extent *fe, uint32_t flags) {
    return prev->flags == flags &&
           !(flags & (FIEMAP_EXTENT_NOT_ALIGNED | FIEMAP_EXTENT_UNKNOWN)) &&
           prev->logical + prev->length == fe->fe_logical &&
           prev->physical + prev->length == fe->fe_physical;
}

/* Extent flags under which reported lengths may exceed the blocks stat counts. */
#define UNCOUNTED_FLAGS                                                                        \
    (FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_DATA_ENCRYPTED | FIEMAP_EXTENT_DATA_INLINE |        \
     FIEMAP_EXTENT_DATA_TAIL | FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_NOT_ALIGNED)

/* Append the extents of fd to w->ext, merging adjacent ones; how many were appended, or
 * -errno (nothing appended).
 *
 * The first calls ask only for [0, size): asking for everything makes the file system look
 * for extents past the end of the file as well, about a tenth of the walk. Extents may lie
 * past the end (fallocate with KEEP_SIZE), so when the extents found cover fewer bytes than
 * stat's block count (which counts every allocated and delayed block), the rest of the file
 * is asked for too. */
static long fiemap(walker_t *w, int fd, uint64_t size, uint64_t allocated) {
    const shared_t *sh = w->sh;
    uint64_t start = 0, end = size ? size : UINT64_MAX, covered = 0;
    int trust_count = 1;
    long total = 0;
    size_t mark = w->ext.len;
    for (;;) {
        memset(w->fm, 0, sizeof *w->fm);
        w->fm->fm_start = start;
        w->fm->fm_length = end - start;
        w->fm->fm_flags = sh->sync ? FIEMAP_FLAG_SYNC : 0;
        w->fm->fm_extent_count = sh->batch;
        int r;
        do
            r = ioctl(fd, FS_IOC_FIEMAP, w->fm);
        while (r < 0 && errno == EINTR);
        if (r < 0) {
            int e = errno;
            w->ext.len = mark;
            return -e;
        }
        uint32_t mapped = w->fm->fm_mapped_extents;
        if (mapped && buf_reserve(&w->ext, mapped * sizeof(ext_t))) {
            fail_oom(w);
            w->ext.len = mark;
            return 0;
        }
        for (uint32_t i = 0; i < mapped; i++) {
            const struct fiemap_extent *fe = &w->fm->fm_extents[i];
            uint32_t flags = fe->fe_flags & ~(uint32_t)(FIEMAP_EXTENT_LAST | FIEMAP_EXTENT_MERGED);
            covered += fe->fe_length;
            if (flags & UNCOUNTED_FLAGS)
                trust_count = 0;
            ext_t *next = (ext_t *)(w->ext.p + w->ext.len);
            if (total && joins(next - 1, fe, flags)) {
                next[-1].length += fe->fe_length;
                continue;
            }
            *next = (ext_t){fe->fe_logical, fe->fe_physical, fe->fe_length, flags, 0};
            w->ext.len += sizeof(ext_t);
            total++;
        }
        const struct fiemap_extent *last = mapped ? &w->fm->fm_extents[mapped - 1] : NULL;
        uint64_t after = last ? last->fe_logical + last->fe_length : start;
        if (mapped == sh->batch && !(last->fe_flags & FIEMAP_EXTENT_LAST) && after > start &&
            after < end) {
            start = after; /* a full buffer: more of this range */
            continue;
        }
        /* this range is done */
        if (end == UINT64_MAX || (trust_count && covered >= allocated))
            return total;
        start = after > end ? after : end; /* the extent across the end is already in */
        end = UINT64_MAX;
        if (start == UINT64_MAX)
            return total;
    }
}

static int fiemap_unsupported(int e) { return e == EOPNOTSUPP || e == ENOTTY || e == EINVAL; }

static size_t ext_count(const walker_t *w) { return w->ext.len / sizeof(ext_t); }

/* Open, check and record the directory of task t; its fd, or -1 when it is left out. */
static int open_dir(walker_t *w, const task_t *t, uint64_t *ino) {
    shared_t *sh = w->sh;
    int fd = open_rel(sh, t->rel, t->len, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        note(w, &w->skipped, t->rel, t->len, NULL, errno);
        return -1;
    }
    struct statx sx;
    if (fstatx(fd, &sx) < 0) {
        note(w, &w->skipped, t->rel, t->len, NULL, errno);
        xclose(fd);
        return -1;
    }
    if (sh->mode != MODE_RECORD && (makedev(sx.stx_dev_major, sx.stx_dev_minor) != sh->dev ||
                                    is_submount(sh, t->rel, t->len))) {
        note(w, &w->not_crossed, t->rel, t->len, NULL, 0);
        xclose(fd);
        return -1;
    }
    uint32_t gen = generation(w, fd);
    size_t first = ext_count(w);
    long n = 0;
    if (w->dir_fiemap) {
        n = fiemap(w, fd, sx.stx_size, sx.stx_blocks * 512);
        if (n < 0) {
            if (fiemap_unsupported((int)-n))
                w->dir_fiemap = 0;
            else
                note(w, &w->no_fiemap, t->rel, t->len, NULL, (int)-n);
            n = 0;
        }
    }
    record(w, &sx, gen, first, n);
    if (t->has_parent) {
        const char *name = t->rel + t->len;
        while (name > t->rel && name[-1] != '/')
            name--;
        link_name(w, t->parent, sx.stx_ino, name, (size_t)(t->rel + t->len - name));
    }
    if (t->top >= 0)
        sh->top_ino[t->top] = (int64_t)sx.stx_ino; /* each top task is read once */
    *ino = sx.stx_ino;
    return fd;
}

static void regular_file(walker_t *w, int dfd, const task_t *t, uint64_t dino,
                         const char *name) {
    size_t nlen = strlen(name);
    const int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
    int fd = xopenat(dfd, name, flags);
    if (fd < 0 && errno == EMFILE && w->pend_n) { /* a low descriptor limit: close the run */
        close_pending(w);
        fd = xopenat(dfd, name, flags);
    }
    if (fd < 0) {
        note(w, &w->skipped, t->rel, t->len, name, errno);
        return;
    }
    struct statx sx;
    if (fstatx(fd, &sx) < 0) {
        note(w, &w->skipped, t->rel, t->len, name, errno);
        xclose(fd);
        return;
    }
    if (!S_ISREG(sx.stx_mode)) { /* replaced by something else since the listing */
        note(w, &w->skipped, t->rel, t->len, name, ENOENT);
        xclose(fd);
        return;
    }
    int claimed = 0;
    if (sx.stx_nlink > 1) {
        int c = claim(w, sx.stx_ino);
        if (c <= 0) { /* another name of it is (being) recorded */
            xclose(fd);
            if (c == 0)
                link_name(w, dino, sx.stx_ino, name, nlen);
            return;
        }
        claimed = 1;
    }
    uint32_t gen = generation(w, fd);
    size_t first = ext_count(w);
    long n = 0;
    if (sx.stx_size || sx.stx_blocks) {
        n = fiemap(w, fd, sx.stx_size, sx.stx_blocks * 512);
        if (n < 0) {
            int e = (int)-n;
            if (!fiemap_unsupported(e)) {
                note(w, &w->skipped, t->rel, t->len, name, e);
                xclose(fd);
                if (claimed) /* its other names must not point at a missing record */
                    __atomic_store_n(&w->sh->claimed_failed, 1, __ATOMIC_RELAXED);
                return;
            }
            note(w, &w->no_fiemap, t->rel, t->len, name, e);
            n = 0;
        } else {
            w->fiemap_ok++;
        }
    }
    close_later(w, fd);
    record(w, &sx, gen, first, n);
    link_name(w, dino, sx.stx_ino, name, nlen);
}

static void other_entry(walker_t *w, int dfd, const task_t *t, uint64_t dino, const char *name,
                        const struct statx *known) {
    struct statx sx;
    if (known)
        sx = *known;
    else if (xstatx(dfd, name, AT_SYMLINK_NOFOLLOW, &sx) < 0) {
        note(w, &w->skipped, t->rel, t->len, name, errno);
        return;
    }
    size_t nlen = strlen(name);
    if (sx.stx_nlink > 1) {
        int c = claim(w, sx.stx_ino);
        if (c < 0)
            return;
        if (c == 0) {
            link_name(w, dino, sx.stx_ino, name, nlen);
            return;
        }
    }
    record(w, &sx, 0, ext_count(w), 0);
    link_name(w, dino, sx.stx_ino, name, nlen);
}

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static void subdir(walker_t *w, const task_t *t, uint64_t dino, const char *name) {
    size_t nlen = strlen(name);
    char *rel = malloc(t->len + nlen + 2);
    if (!rel) {
        fail_oom(w);
        return;
    }
    memcpy(rel, t->rel, t->len);
    rel[t->len] = '/';
    memcpy(rel + t->len + 1, name, nlen + 1);
    if (tasks_push(&w->found, rel, t->len + 1 + nlen, dino, 1, -1)) {
        free(rel);
        fail_oom(w);
    }
}

/* A directory entry of the listing, by inode number. */
typedef struct {
    uint64_t ino;
    size_t pos; /* in the listing: ties (hard links in one directory) keep listing order */
} dent_ref_t;

static int cmp_dent_ref(const void *a, const void *b) {
    const dent_ref_t *x = a, *y = b;
    if (x->ino != y->ino)
        return (x->ino > y->ino) - (x->ino < y->ino);
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* The whole listing of dfd in w->listing; 0, or -1 once noted (errno), out of memory or
 * stopped. */
static int list_dir(walker_t *w, int dfd, const task_t *t) {
    w->listing.len = 0;
    for (;;) {
        if (stopped(w))
            return -1;
        if (buf_reserve(&w->listing, DENTS_SIZE)) {
            fail_oom(w);
            return -1;
        }
        long nread;
        do
            nread = syscall(SYS_getdents64, dfd, w->listing.p + w->listing.len, DENTS_SIZE);
        while (nread < 0 && errno == EINTR);
        if (nread < 0) {
            note(w, &w->skipped, t->rel, t->len, "", errno); /* rel + "/" */
            return -1;
        }
        if (nread == 0)
            return 0;
        w->listing.len += (size_t)nread;
    }
}

/* Each entry of the directory, in inode order: the inodes (and their extent trees) are then
 * read in the order they lie on disk and in memory rather than in the directory's hash order,
 * which takes a few per cent less CPU with warm caches (and reads the inode tables in order
 * with cold ones). The Python walk reads them in the same order. */
static void read_dir(walker_t *w, int dfd, const task_t *t, uint64_t dino) {
    if (list_dir(w, dfd, t) < 0)
        return;
    size_t count = 0;
    for (size_t pos = 0; pos < w->listing.len; count++)
        pos += ((const struct linux_dirent64 *)(w->listing.p + pos))->d_reclen;
    if (buf_reserve(&w->order, count * sizeof(dent_ref_t))) {
        fail_oom(w);
        return;
    }
    dent_ref_t *refs = (dent_ref_t *)w->order.p;
    count = 0;
    for (size_t pos = 0; pos < w->listing.len; count++) {
        const struct linux_dirent64 *d = (const struct linux_dirent64 *)(w->listing.p + pos);
        refs[count] = (dent_ref_t){d->d_ino, pos};
        pos += d->d_reclen;
    }
    qsort(refs, count, sizeof *refs, cmp_dent_ref);
    for (size_t k = 0; k < count && !stopped(w); k++) {
        const struct linux_dirent64 *d = (const struct linux_dirent64 *)(w->listing.p + refs[k].pos);
        const char *name = d->d_name;
        if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)))
            continue;
        unsigned char type = d->d_type;
        struct statx sx;
        int have = 0;
        if (type == DT_UNKNOWN) {
            if (xstatx(dfd, name, AT_SYMLINK_NOFOLLOW, &sx) < 0) {
                note(w, &w->skipped, t->rel, t->len, name, errno);
                continue;
            }
            have = 1;
            type = IFTODT(sx.stx_mode);
        }
        if (type == DT_DIR)
            subdir(w, t, dino, name);
        else if (type == DT_REG)
            regular_file(w, dfd, t, dino, name);
        else
            other_entry(w, dfd, t, dino, name, have ? &sx : NULL);
    }
}

static void process(walker_t *w, const task_t *t) {
    uint64_t dino = 0;
    int dfd = open_dir(w, t, &dino);
    if (dfd < 0)
        return;
    if (w->sh->mode != MODE_RECORD)
        read_dir(w, dfd, t, dino);
    close_pending(w);
    xclose(dfd);
}

/* A worker: take a directory from the shared stack, read it, put its subdirectories back;
 * until the stack is empty and no other worker is reading one (or the walk is stopped). */
static void *worker_main(void *arg) {
    walker_t *w = arg;
    shared_t *sh = w->sh;
    (void)unshare(CLONE_FILES); /* best effort: a private fd table (see the top of this file) */
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) && sh->stack.n == 0 && sh->active)
            pthread_cond_wait(&sh->work, &sh->mu);
        if (__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) || sh->stack.n == 0)
            break;
        task_t t = sh->stack.v[--sh->stack.n];
        sh->active++;
        pthread_mutex_unlock(&sh->mu);
        process(w, &t);
        free(t.rel);
        pthread_mutex_lock(&sh->mu);
        /* in listing order: the last subdirectory listed is read next (as the Python walk) */
        size_t moved = w->found.n;
        for (size_t i = 0; i < moved; i++) {
            task_t *f = &w->found.v[i];
            if (tasks_push(&sh->stack, f->rel, f->len, f->parent, f->has_parent, f->top)) {
                free(f->rel);
                fail_oom(w);
            }
        }
        w->found.n = 0;
        sh->active--;
        if (moved > 1 || sh->active == 0 || __atomic_load_n(&sh->stop, __ATOMIC_RELAXED))
            pthread_cond_broadcast(&sh->work);
    }
    pthread_cond_broadcast(&sh->work);
    pthread_mutex_unlock(&sh->mu);
    flush_count(w, 0);
    pthread_mutex_lock(&sh->mu);
    sh->finished++;
    pthread_cond_signal(&sh->main);
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

/* In the calling thread, without the GIL (*ts saved): wait for the workers, taking the GIL
 * to report progress when one asks and to let signal handlers run every 100 ms. 1 if a
 * Python exception is set (the walk was then stopped). */
static int supervise(shared_t *sh, PyObject *progress, uint64_t base, PyThreadState **ts) {
    int py_error = 0;
    pthread_mutex_lock(&sh->mu);
    while (sh->finished < sh->nthreads) {
        int answer = sh->ck_asked > sh->ck_done;
        if (!answer) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 100 * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            int r = pthread_cond_timedwait(&sh->main, &sh->mu, &until);
            if (r != ETIMEDOUT)
                continue;
        }
        uint64_t seq = sh->ck_asked, count = sh->ck_count;
        pthread_mutex_unlock(&sh->mu);
        PyEval_RestoreThread(*ts);
        if (!py_error && answer && progress) {
            PyObject *r = PyObject_CallFunction(progress, "K", (unsigned long long)(base + count));
            if (!r)
                py_error = 1;
            else
                Py_DECREF(r);
        }
        if (!py_error && PyErr_CheckSignals() < 0)
            py_error = 1;
        *ts = PyEval_SaveThread();
        pthread_mutex_lock(&sh->mu);
        if (py_error && !__atomic_load_n(&sh->stop, __ATOMIC_RELAXED)) {
            __atomic_store_n(&sh->stop, 1, __ATOMIC_RELAXED);
            pthread_cond_broadcast(&sh->work);
        }
        if (answer) {
            sh->ck_done = seq;
            pthread_cond_broadcast(&sh->resume);
        }
    }
    pthread_mutex_unlock(&sh->mu);
    return py_error;
}

/* ---- joining the workers' records: sort by inode, convert extents to blocks -------------- */

typedef struct {
    uint64_t key;
    uint32_t worker, index;
} sortkey_t;

/* Stable LSD radix sort of keys by key, a byte at a time, skipping bytes all keys share. */
static void radix_sort(sortkey_t *keys, sortkey_t *tmp, size_t n) {
    if (n < 2)
        return;
    uint64_t differ = 0;
    for (size_t i = 1; i < n; i++)
        differ |= keys[i].key ^ keys[0].key;
    sortkey_t *src = keys, *dst = tmp;
    for (int shift = 0; shift < 64; shift += 8) {
        if (!((differ >> shift) & 0xFF))
            continue;
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++)
            count[((src[i].key >> shift) & 0xFF) + 1]++;
        for (int b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i].key >> shift) & 0xFF]++] = src[i];
        sortkey_t *s = src;
        src = dst;
        dst = s;
    }
    if (src != keys)
        memcpy(keys, src, n * sizeof *keys);
}

/* Sort keys by inode and keep the first of each inode; how many are kept. Inode numbers
 * mostly fill a range not much wider than their count (ext4, btrfs): then a table indexed by
 * inode does it in two passes; else (xfs's sparse numbers) the radix sort. */
static size_t sort_unique(sortkey_t *keys, sortkey_t *tmp, size_t n, int use_table) {
    if (n == 0)
        return 0;
    uint64_t lo = keys[0].key, hi = keys[0].key;
    for (size_t i = 1; i < n; i++) {
        lo = keys[i].key < lo ? keys[i].key : lo;
        hi = keys[i].key > hi ? keys[i].key : hi;
    }
    size_t kept = 0;
    uint32_t *slot = NULL;
    if (use_table && hi - lo < 4 * (uint64_t)n + 4096 && n < UINT32_MAX)
        slot = calloc((size_t)(hi - lo) + 1, sizeof *slot);
    if (slot) {
        for (size_t i = 0; i < n; i++) {
            uint32_t *s = &slot[keys[i].key - lo];
            if (!*s)
                *s = (uint32_t)i + 1;
        }
        for (uint64_t v = 0; v <= hi - lo; v++)
            if (slot[v])
                tmp[kept++] = keys[slot[v] - 1];
        free(slot);
        memcpy(keys, tmp, kept * sizeof *keys);
        return kept;
    }
    radix_sort(keys, tmp, n);
    for (size_t i = 0; i < n; i++)
        if (!i || keys[i].key != keys[i - 1].key)
            keys[kept++] = keys[i];
    return kept;
}

static uint32_t fsage_flags(uint32_t f) {
    uint32_t out = 0;
    if (f & FIEMAP_EXTENT_UNWRITTEN)
        out |= EXTENT_UNWRITTEN;
    if (f & FIEMAP_EXTENT_DELALLOC)
        out |= EXTENT_DELALLOC;
    if (f & (FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_DATA_TAIL))
        out |= EXTENT_INLINE;
    if (f & FIEMAP_EXTENT_SHARED)
        out |= EXTENT_SHARED;
    if (f & (FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_DATA_ENCRYPTED))
        out |= EXTENT_ENCODED;
    return out;
}

enum {
    C_INO, C_GEN, C_MODE, C_NLINK, C_UID, C_GID, C_SIZE, C_ATIME, C_MTIME, C_CTIME, C_CRTIME,
    C_EXT_OFF, C_EXT_LOGICAL, C_EXT_PHYSICAL, C_EXT_LENGTH, C_EXT_FLAGS,
    C_L_PARENT, C_L_INO, C_NAME_OFF, N_COLS
};
static const char *const col_names[N_COLS] = {
    "ino", "generation", "mode", "nlink", "uid", "gid", "size", "atime", "mtime", "ctime",
    "crtime", "ext_off", "ext_logical", "ext_physical", "ext_length", "ext_flags",
    "l_parent", "l_ino", "name_off",
};

typedef struct {
    buf_t col[N_COLS];
    buf_t names;
} joined_t;

static void joined_free(joined_t *j) {
    for (int c = 0; c < N_COLS; c++)
        buf_free(&j->col[c]);
    buf_free(&j->names);
}

static int alloc_col(buf_t *b, size_t bytes) {
    b->p = malloc(bytes ? bytes : 1);
    b->len = b->cap = b->p ? bytes : 0;
    return b->p ? 0 : -1;
}

static int has_key(const sortkey_t *keys, size_t n, uint64_t ino) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid].key < ino)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && keys[lo].key == ino;
}

/* One part of joining the workers' output; the three parts run at once. */
typedef struct {
    const walker_t *ws;
    int nw;
    const sortkey_t *keys; /* sorted, one per inode */
    size_t n;
    uint64_t block_size;
    int filter_links; /* drop link rows whose inode has no record */
    joined_t *out;
    int err;
} join_t;

static const rec_t *rec_of(const join_t *j, size_t i) {
    return &((const rec_t *)j->ws[j->keys[i].worker].recs.p)[j->keys[i].index];
}

/* ino .. crtime, in inode order */
static void *join_records(void *arg) {
    join_t *j = arg;
    static const size_t width[C_CRTIME + 1] = {8, 4, 4, 4, 4, 4, 8, 8, 8, 8, 8};
    for (int c = 0; c <= C_CRTIME; c++)
        if (alloc_col(&j->out->col[c], j->n * width[c])) {
            j->err = 1;
            return NULL;
        }
    buf_t *col = j->out->col;
    uint64_t *ino = (uint64_t *)col[C_INO].p, *size = (uint64_t *)col[C_SIZE].p;
    uint32_t *gen = (uint32_t *)col[C_GEN].p, *mode = (uint32_t *)col[C_MODE].p;
    uint32_t *nlink = (uint32_t *)col[C_NLINK].p, *uid = (uint32_t *)col[C_UID].p;
    uint32_t *gid = (uint32_t *)col[C_GID].p;
    int64_t *atime = (int64_t *)col[C_ATIME].p, *mtime = (int64_t *)col[C_MTIME].p;
    int64_t *ctime_ = (int64_t *)col[C_CTIME].p, *crtime = (int64_t *)col[C_CRTIME].p;
    for (size_t i = 0; i < j->n; i++) {
        const rec_t *r = rec_of(j, i);
        ino[i] = r->ino;
        gen[i] = r->gen;
        mode[i] = r->mode;
        nlink[i] = r->nlink;
        uid[i] = r->uid;
        gid[i] = r->gid;
        size[i] = r->size;
        atime[i] = r->atime;
        mtime[i] = r->mtime;
        ctime_[i] = r->ctime;
        crtime[i] = r->crtime;
    }
    return NULL;
}

/* ext_off and the extent columns, in blocks */
static void *join_extents(void *arg) {
    join_t *j = arg;
    buf_t *col = j->out->col;
    if (alloc_col(&col[C_EXT_OFF], (j->n + 1) * 8)) {
        j->err = 1;
        return NULL;
    }
    uint64_t *off = (uint64_t *)col[C_EXT_OFF].p;
    off[0] = 0;
    for (size_t i = 0; i < j->n; i++)
        off[i + 1] = off[i] + rec_of(j, i)->ext_count;
    size_t m = off[j->n];
    if (alloc_col(&col[C_EXT_LOGICAL], m * 8) || alloc_col(&col[C_EXT_PHYSICAL], m * 8) ||
        alloc_col(&col[C_EXT_LENGTH], m * 8) || alloc_col(&col[C_EXT_FLAGS], m * 4)) {
        j->err = 1;
        return NULL;
    }
    uint64_t *lo = (uint64_t *)col[C_EXT_LOGICAL].p, *ph = (uint64_t *)col[C_EXT_PHYSICAL].p;
    uint64_t *ln = (uint64_t *)col[C_EXT_LENGTH].p;
    uint32_t *fl = (uint32_t *)col[C_EXT_FLAGS].p;
    const uint64_t bs = j->block_size;
    size_t e = 0;
    for (size_t i = 0; i < j->n; i++) {
        const rec_t *r = rec_of(j, i);
        const ext_t *x = (const ext_t *)j->ws[j->keys[i].worker].ext.p + r->ext_start;
        for (uint32_t k = 0; k < r->ext_count; k++, e++) {
            uint64_t first = x[k].logical / bs;
            lo[e] = first;
            ph[e] = x[k].physical / bs;
            ln[e] = (x[k].logical + x[k].length + bs - 1) / bs - first;
            fl[e] = fsage_flags(x[k].flags);
        }
    }
    return NULL;
}

/* the link tables, one worker's after another */
static void *join_links(void *arg) {
    join_t *j = arg;
    size_t nlinks = 0, nnames = 0;
    for (int k = 0; k < j->nw; k++) {
        nlinks += j->ws[k].lino.len / sizeof(uint64_t);
        nnames += j->ws[k].names.len;
    }
    buf_t *col = j->out->col;
    if (alloc_col(&col[C_L_PARENT], nlinks * 8) || alloc_col(&col[C_L_INO], nlinks * 8) ||
        alloc_col(&col[C_NAME_OFF], (nlinks + 1) * 8) || alloc_col(&j->out->names, nnames)) {
        j->err = 1;
        return NULL;
    }
    uint64_t *lpar = (uint64_t *)col[C_L_PARENT].p, *lino = (uint64_t *)col[C_L_INO].p;
    uint64_t *noff = (uint64_t *)col[C_NAME_OFF].p;
    char *names = j->out->names.p;
    size_t l = 0, nb = 0;
    noff[0] = 0;
    for (int k = 0; k < j->nw; k++) {
        const walker_t *w = &j->ws[k];
        const uint64_t *wp = (const uint64_t *)w->lpar.p, *wi = (const uint64_t *)w->lino.p;
        const uint64_t *we = (const uint64_t *)w->lend.p;
        size_t cnt = w->lino.len / sizeof(uint64_t);
        for (size_t i = 0; i < cnt; i++) {
            uint64_t a = i ? we[i - 1] : 0, b = we[i];
            if (j->filter_links && !has_key(j->keys, j->n, wi[i]))
                continue;
            lpar[l] = wp[i];
            lino[l] = wi[i];
            memcpy(names + nb, w->names.p + a, b - a);
            nb += b - a;
            noff[++l] = nb;
        }
    }
    col[C_L_PARENT].len = col[C_L_INO].len = l * sizeof(uint64_t);
    col[C_NAME_OFF].len = (l + 1) * sizeof(uint64_t);
    j->out->names.len = nb;
    return NULL;
}

/* The workers' records as FileTable columns sorted by inode (an inode recorded twice, which
 * only a tree changing under the walk can cause, is kept once), and their link tables. */
static int join_workers(walker_t *ws, int nw, uint64_t block_size, int filter_links,
                        joined_t *out) {
    size_t n = 0;
    for (int k = 0; k < nw; k++)
        n += ws[k].recs.len / sizeof(rec_t);
    sortkey_t *keys = malloc((n ? n : 1) * sizeof *keys);
    sortkey_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!keys || !tmp) {
        free(keys);
        free(tmp);
        return -1;
    }
    size_t at = 0;
    for (int k = 0; k < nw; k++) {
        const rec_t *r = (const rec_t *)ws[k].recs.p;
        size_t cnt = ws[k].recs.len / sizeof(rec_t);
        for (size_t i = 0; i < cnt; i++)
            keys[at++] = (sortkey_t){r[i].ino, (uint32_t)k, (uint32_t)i};
    }
    size_t kept = sort_unique(keys, tmp, n, 1);
    free(tmp);
    join_t parts[3];
    for (int p = 0; p < 3; p++)
        parts[p] = (join_t){ws, nw, keys, kept, block_size, filter_links, out, 0};
    void *(*const jobs[3])(void *) = {join_records, join_extents, join_links};
    pthread_t tids[2];
    int started[2] = {0, 0};
    for (int p = 0; p < 2; p++)
        started[p] = pthread_create(&tids[p], NULL, jobs[p], &parts[p]) == 0;
    for (int p = 0; p < 2; p++)
        if (!started[p])
            jobs[p](&parts[p]);
    join_links(&parts[2]);
    for (int p = 0; p < 2; p++)
        if (started[p])
            pthread_join(tids[p], NULL);
    free(keys);
    return parts[0].err || parts[1].err || parts[2].err ? -1 : 0;
}

static void walker_free(walker_t *w) {
    free(w->fm);
    buf_free(&w->listing);
    buf_free(&w->recs);
    buf_free(&w->ext);
    buf_free(&w->lpar);
    buf_free(&w->lino);
    buf_free(&w->lend);
    buf_free(&w->names);
    buf_free(&w->scratch);
    buf_free(&w->order);
    pathlist_free(&w->skipped);
    pathlist_free(&w->not_crossed);
    pathlist_free(&w->no_fiemap);
    tasks_free(&w->found);
}

/* Room for about `expect` records, so that the buffers rarely move while the walk runs. */
static int walker_init(walker_t *w, shared_t *sh, size_t expect, int dir_fiemap,
                       int getversion) {
    memset(w, 0, sizeof *w);
    w->sh = sh;
    w->dir_fiemap = dir_fiemap;
    w->getversion = getversion;
    w->fm = calloc(1, sizeof(struct fiemap) + (size_t)sh->batch * sizeof(struct fiemap_extent));
    buf_init_cap(&w->listing, DENTS_SIZE);
    if (!w->fm || !w->listing.p)
        return -1;
    buf_init_cap(&w->recs, expect * sizeof(rec_t));
    buf_init_cap(&w->ext, expect * sizeof(ext_t));
    buf_init_cap(&w->lpar, expect * 8);
    buf_init_cap(&w->lino, expect * 8);
    buf_init_cap(&w->lend, expect * 8);
    buf_init_cap(&w->names, expect * 16);
    return 0;
}

static PyObject *bytes_of(buf_t *b) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len);
}

/* A writable buffer that owns a buf_t's memory: numpy.frombuffer wraps it without a copy. */
typedef struct {
    PyObject_HEAD
    char *p;
    Py_ssize_t len;
    Py_ssize_t exports;
} BufferObject;

static void Buffer_dealloc(BufferObject *self) {
    free(self->p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Buffer_getbuffer(BufferObject *self, Py_buffer *view, int flags) {
    int r = PyBuffer_FillInfo(view, (PyObject *)self, self->p ? self->p : (void *)"",
                              self->len, 0, flags);
    if (r == 0)
        self->exports++;
    return r;
}

static void Buffer_releasebuffer(BufferObject *self, Py_buffer *view) {
    (void)view;
    self->exports--;
}

static Py_ssize_t Buffer_length(BufferObject *self) { return self->len; }

static PyBufferProcs Buffer_as_buffer = {
    (getbufferproc)Buffer_getbuffer,
    (releasebufferproc)Buffer_releasebuffer,
};

static PySequenceMethods Buffer_as_sequence = {.sq_length = (lenfunc)Buffer_length};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fsage._live.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_as_sequence = &Buffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory filled by walk(), exported through the buffer protocol.",
};

/* Hand b's memory to a new Buffer (b is left empty). */
static PyObject *buffer_of(buf_t *b) {
    BufferObject *o = PyObject_New(BufferObject, &BufferType);
    if (!o)
        return NULL;
    if (b->p && b->len < b->cap) {
        char *p = realloc(b->p, b->len ? b->len : 1);
        if (p)
            b->p = p;
    }
    o->p = b->p;
    o->len = (Py_ssize_t)b->len;
    o->exports = 0;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

static PyObject *pathlist_py(const pathlist_t *l, int with_err) {
    PyObject *out = PyList_New((Py_ssize_t)l->n);
    if (!out)
        return NULL;
    const uint64_t *off = (const uint64_t *)l->off.p;
    const int32_t *err = (const int32_t *)l->err.p;
    for (size_t i = 0; i < l->n; i++) {
        uint64_t a = off[i], b = i + 1 < l->n ? off[i + 1] : l->paths.len;
        PyObject *p = PyBytes_FromStringAndSize(l->paths.p + a, (Py_ssize_t)(b - a));
        PyObject *item = p && with_err ? Py_BuildValue("(Ni)", p, (int)err[i]) : p;
        if (!item) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    return out;
}

static int parse_tasks(PyObject *seq, tasks_t *out) {
    PyObject *fast = PySequence_Fast(seq, "tasks must be a sequence");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        const char *rel;
        Py_ssize_t len;
        PyObject *parent;
        if (!PyArg_ParseTuple(item, "y#O", &rel, &len, &parent))
            goto fail;
        if (len && rel[0] != '/') {
            PyErr_SetString(PyExc_ValueError, "a task's path must be empty or start with '/'");
            goto fail;
        }
        uint64_t par = 0;
        int has = parent != Py_None;
        if (has) {
            par = PyLong_AsUnsignedLongLong(parent);
            if (PyErr_Occurred())
                goto fail;
        }
        char *copy = malloc((size_t)len + 1);
        if (!copy) {
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(copy, rel, (size_t)len);
        copy[len] = 0;
        if (tasks_push(out, copy, (size_t)len, par, has, (long)i)) {
            free(copy);
            PyErr_NoMemory();
            goto fail;
        }
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

/* The (path, errno) lists of every worker, as one Python list. */
static PyObject *pathlists_py(walker_t *ws, int nw, size_t member, int with_err) {
    PyObject *out = PyList_New(0);
    for (int k = 0; out && k < nw; k++) {
        PyObject *part = pathlist_py((const pathlist_t *)((const char *)&ws[k] + member), with_err);
        if (!part || PyList_SetSlice(out, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, part) < 0)
            Py_CLEAR(out);
        Py_XDECREF(part);
    }
    return out;
}

static PyObject *top_inos_py(const int64_t *top, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *v = top[i] < 0 ? Py_NewRef(Py_None)
                                 : PyLong_FromUnsignedLongLong((unsigned long long)top[i]);
        if (!v)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    return out;
}

static PyObject *result_py(joined_t *j, walker_t *ws, int nw, const shared_t *sh, size_t ntop) {
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    for (int c = 0; c < N_COLS; c++) {
        PyObject *b = buffer_of(&j->col[c]);
        if (!b || PyDict_SetItemString(d, col_names[c], b) < 0) {
            Py_XDECREF(b);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(b);
    }
    uint64_t fiemap_ok = 0;
    int dir_fiemap = 1, getversion = 1;
    for (int k = 0; k < nw; k++) {
        fiemap_ok += ws[k].fiemap_ok;
        dir_fiemap &= ws[k].dir_fiemap;
        getversion &= ws[k].getversion;
    }
    struct {
        const char *key;
        PyObject *value;
    } items[] = {
        {"names", bytes_of(&j->names)},
        {"skipped", pathlists_py(ws, nw, offsetof(walker_t, skipped), 1)},
        {"not_crossed", pathlists_py(ws, nw, offsetof(walker_t, not_crossed), 0)},
        {"no_fiemap", pathlists_py(ws, nw, offsetof(walker_t, no_fiemap), 1)},
        {"fiemap_ok", PyLong_FromUnsignedLongLong(fiemap_ok)},
        {"dir_fiemap", PyBool_FromLong(dir_fiemap)},
        {"getversion", PyBool_FromLong(getversion)},
        {"top_ino", top_inos_py(sh->top_ino, ntop)},
    };
    int err = 0;
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        if (!err && (!items[i].value || PyDict_SetItemString(d, items[i].key, items[i].value) < 0))
            err = 1;
        Py_XDECREF(items[i].value);
    }
    if (err) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

PyDoc_STRVAR(walk_doc,
             "walk(base, tasks, *, mode, dev, submounts, sync, batch, dir_fiemap, getversion,\n"
             "     block_size, threads=1, expect=0, progress=None, progress_base=0) -> dict\n\n"
             "Walk the directories ``tasks`` ((rel, parent inode or None) pairs, rel from the\n"
             "mount root ``base``) on ``threads`` worker threads and return the columns\n"
             "described in fsage/_live.c. ``expect`` (an estimate of the records) sizes the\n"
             "buffers; ``progress`` is called with the number of records read every 4096.");

static PyObject *py_walk(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"base",       "tasks",      "mode",     "dev",        "submounts",
                             "sync",       "batch",      "dir_fiemap", "getversion", "block_size",
                             "threads",    "expect",     "progress", "progress_base", NULL};
    PyObject *base_obj, *tasks_obj, *subs_obj = NULL, *progress = Py_None;
    int mode = -1, sync = 0, dir_fiemap = 1, getversion = 1, threads = 1;
    unsigned long long dev = 0, progress_base = 0, block_size = 0, expect = 0;
    unsigned int batch = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|$iKOpIppKiKOK", kwlist,
                                     PyUnicode_FSConverter, &base_obj, &tasks_obj, &mode, &dev,
                                     &subs_obj, &sync, &batch, &dir_fiemap, &getversion,
                                     &block_size, &threads, &expect, &progress, &progress_base))
        return NULL;
    PyObject *result = NULL, *subs_fast = NULL;
    shared_t sh;
    memset(&sh, 0, sizeof sh);
    sh.base_fd = -1;
    pthread_mutex_init(&sh.mu, NULL);
    pthread_mutex_init(&sh.seen_mu, NULL);
    pthread_cond_init(&sh.work, NULL);
    pthread_cond_init(&sh.main, NULL);
    pthread_cond_init(&sh.resume, NULL);
    walker_t *ws = NULL;
    int nw = 0;
    joined_t joined;
    memset(&joined, 0, sizeof joined);
    tasks_t top = {0};
    if ((mode != MODE_WALK && mode != MODE_RECORD) || batch < 1 || batch > 65536) {
        PyErr_SetString(PyExc_ValueError, "bad mode or batch");
        goto out;
    }
    if (!subs_obj || !block_size) {
        PyErr_SetString(PyExc_TypeError, "walk() needs mode, dev, submounts, batch, block_size");
        goto out;
    }
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be between 1 and %d", MAX_THREADS);
        goto out;
    }
    sh.mode = mode;
    sh.dev = (dev_t)dev;
    sh.sync = sync;
    sh.batch = batch;
    sh.want_progress = progress != Py_None;
    sh.next_checkpoint = PROGRESS_EVERY;
    subs_fast = PySequence_Fast(subs_obj, "submounts must be a sequence of bytes");
    if (!subs_fast)
        goto out;
    sh.nsubs = (size_t)PySequence_Fast_GET_SIZE(subs_fast);
    sh.subs = calloc(sh.nsubs + 1, sizeof *sh.subs);
    if (!sh.subs) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < sh.nsubs; i++) {
        char *p;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(subs_fast, i), &p, &n) < 0)
            goto out;
        sh.subs[i].p = p; /* the bytes objects stay alive in subs_fast */
        sh.subs[i].len = (size_t)n;
    }
    qsort(sh.subs, sh.nsubs, sizeof *sh.subs, cmp_span);
    if (parse_tasks(tasks_obj, &top) < 0)
        goto out;
    sh.top_ino = malloc((top.n ? top.n : 1) * sizeof *sh.top_ino);
    if (!sh.top_ino) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < top.n; i++) /* the first task is read first */
        sh.top_ino[i] = -1;
    for (size_t i = top.n; i-- > 0;) {
        if (tasks_push(&sh.stack, top.v[i].rel, top.v[i].len, top.v[i].parent,
                       top.v[i].has_parent, top.v[i].top)) {
            PyErr_NoMemory();
            goto out;
        }
        top.v[i].rel = NULL; /* now owned by the stack */
    }
    if (mode == MODE_RECORD || top.n == 0)
        threads = 1;
    if (expect > (1ULL << 22))
        expect = 1ULL << 22;
    ws = calloc((size_t)threads, sizeof *ws);
    if (!ws) {
        PyErr_NoMemory();
        goto out;
    }
    pthread_t tids[MAX_THREADS];
    int base_err = 0, oom = 0, py_error = 0;
    const char *base = PyBytes_AS_STRING(base_obj);
    PyThreadState *ts = PyEval_SaveThread();
    sh.base_fd = xopenat(AT_FDCWD, base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sh.base_fd < 0)
        base_err = errno;
    for (int k = 0; !base_err && k < threads; k++) {
        if (walker_init(&ws[k], &sh, (size_t)expect / (size_t)threads + 64, dir_fiemap,
                        getversion) ||
            pthread_create(&tids[k], NULL, worker_main, &ws[k])) {
            walker_free(&ws[k]);
            if (k == 0)
                oom = 1;
            break;
        }
        nw = k + 1;
    }
    sh.nthreads = nw;
    if (nw)
        py_error = supervise(&sh, progress == Py_None ? NULL : progress, progress_base, &ts);
    for (int k = 0; k < nw; k++) {
        pthread_join(tids[k], NULL);
        oom |= ws[k].oom;
    }
    if (!base_err && !oom && !py_error)
        oom = join_workers(ws, nw, block_size, sh.claimed_failed, &joined) < 0;
    PyEval_RestoreThread(ts);
    if (py_error)
        goto out;
    if (base_err) {
        errno = base_err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, base_obj);
        goto out;
    }
    if (oom) {
        PyErr_NoMemory();
        goto out;
    }
    result = result_py(&joined, ws, nw, &sh, top.n);
out:
    for (int k = 0; k < nw; k++)
        walker_free(&ws[k]);
    free(ws);
    joined_free(&joined);
    tasks_free(&top);
    tasks_free(&sh.stack);
    free(sh.top_ino);
    free(sh.subs);
    free(sh.seen.slots);
    if (sh.base_fd >= 0)
        close(sh.base_fd);
    pthread_mutex_destroy(&sh.mu);
    pthread_mutex_destroy(&sh.seen_mu);
    pthread_cond_destroy(&sh.work);
    pthread_cond_destroy(&sh.main);
    pthread_cond_destroy(&sh.resume);
    Py_XDECREF(subs_fast);
    Py_DECREF(base_obj);
    return result;
}

PyDoc_STRVAR(sort_unique_doc,
             "sort_unique(inos, use_table) -> bytes\n\n"
             "The join's sort on its own, for the tests: the uint32 positions of the first\n"
             "occurrence of each value of the uint64 buffer ``inos``, in increasing value.");

static PyObject *py_sort_unique(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    int use_table;
    if (!PyArg_ParseTuple(args, "y*p", &view, &use_table))
        return NULL;
    size_t n = (size_t)view.len / sizeof(uint64_t);
    sortkey_t *keys = malloc((n ? n : 1) * sizeof *keys), *tmp = malloc((n ? n : 1) * sizeof *tmp);
    PyObject *out = NULL;
    if (keys && tmp) {
        const uint64_t *v = view.buf;
        for (size_t i = 0; i < n; i++)
            keys[i] = (sortkey_t){v[i], 0, (uint32_t)i};
        size_t kept = sort_unique(keys, tmp, n, use_table);
        uint32_t *pos = (uint32_t *)tmp; /* the keys are in keys now */
        for (size_t i = 0; i < kept; i++)
            pos[i] = keys[i].index;
        out = PyBytes_FromStringAndSize((const char *)pos, (Py_ssize_t)(kept * sizeof *pos));
    } else
        PyErr_NoMemory();
    free(keys);
    free(tmp);
    PyBuffer_Release(&view);
    return out;
}

/* glibc's mallopt, for fsage.heap: here so that `fsage snapshot` need not import ctypes (a few
 * ms of CPU) before its walk starts. */
PyDoc_STRVAR(mallopt_doc, "mallopt(param, value) -> int: glibc's mallopt (1 on success).");

static PyObject *py_mallopt(PyObject *self, PyObject *args) {
    (void)self;
    int param, value;
    if (!PyArg_ParseTuple(args, "ii", &param, &value))
        return NULL;
    return PyLong_FromLong(mallopt(param, value));
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))py_walk, METH_VARARGS | METH_KEYWORDS, walk_doc},
    {"sort_unique", py_sort_unique, METH_VARARGS, sort_unique_doc},
    {"mallopt", py_mallopt, METH_VARARGS, mallopt_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fsage._live", "The live reader's tree walk in C (see live.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__live(void) {
    if (PyType_Ready(&BufferType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&BufferType);
    if (PyModule_AddObject(m, "Buffer", (PyObject *)&BufferType) < 0) {
        Py_DECREF(&BufferType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MODE_WALK", MODE_WALK) ||
        PyModule_AddIntConstant(m, "MODE_RECORD", MODE_RECORD) ||
        PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS) ||
        PyModule_AddIntConstant(m, "EXTENT_UNWRITTEN", EXTENT_UNWRITTEN) ||
        PyModule_AddIntConstant(m, "EXTENT_DELALLOC", EXTENT_DELALLOC) ||
        PyModule_AddIntConstant(m, "EXTENT_INLINE", EXTENT_INLINE) ||
        PyModule_AddIntConstant(m, "EXTENT_SHARED", EXTENT_SHARED) ||
        PyModule_AddIntConstant(m, "EXTENT_ENCODED", EXTENT_ENCODED)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
