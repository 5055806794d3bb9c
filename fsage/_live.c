/*
 * fsage._live: the tree walk of the live reader (fsage/snapshotter/live.py) in C.
 *
 * walk() reads a mounted tree relative to directory file descriptors: getdents64 on each
 * directory, openat + statx + FS_IOC_GETVERSION + FS_IOC_FIEMAP on each regular file, statx on
 * everything else. The walk runs without the GIL, keeps its pending directories on an explicit
 * stack (no recursion, at most three descriptors open at once) and hands back columns as bytes
 * objects that Python wraps with numpy.frombuffer:
 *
 * (Buffer objects, writable and without a copy; names is bytes):
 *   meta     int64[n][11]  ino, generation, mode, nlink, uid, gid, size, atime, mtime, ctime,
 *                          crtime (times in ns; crtime from statx's btime, 0 where missing)
 *   counts   int64[n]      raw FIEMAP extents of each record
 *   raw      struct fiemap_extent[] (56 bytes each), unmerged, in record order
 *   l_parent, l_ino        uint64[m] link table (directory inode, inode)
 *   name_off uint64[m+1], names    the link names, concatenated
 *
 * Walk order, hard-link handling and what is skipped are those of the Python walk in live.py,
 * so both give the same Layout.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <linux/fiemap.h>
#include <linux/fs.h>

#define MODE_WALK 0   /* walk the whole tree below each task */
#define MODE_DEFER 1  /* read each task's directory; return its subdirectories as tasks */
#define MODE_RECORD 2 /* record each task's directory only (no listing, no device check) */

#define META_COLS 11
#define DENTS_SIZE (256 * 1024)
#define STATX_WANT (STATX_BASIC_STATS | STATX_BTIME)

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
} task_t;

typedef struct {
    task_t *v;
    size_t n, cap;
} tasks_t;

static int tasks_push(tasks_t *t, char *rel, size_t len, uint64_t parent, int has_parent) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        task_t *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return -1;
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n].rel = rel;
    t->v[t->n].len = len;
    t->v[t->n].parent = parent;
    t->v[t->n].has_parent = has_parent;
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

typedef struct {
    int base_fd;
    dev_t dev;
    int mode;
    span_t *subs; /* sorted mount points below the root, relative to it */
    size_t nsubs;
    int sync, dir_fiemap, getversion;
    uint32_t batch;
    struct fiemap *fm;
    char *dents;
    buf_t meta, counts, raw, lpar, lino, loff, names;
    uint64_t nrec;
    pathlist_t skipped, not_crossed, no_fiemap;
    uint64_t fiemap_ok;
    inoset_t seen;
    tasks_t stack, deferred;
    buf_t scratch; /* rel + "/" + name for messages and tasks */
    int oom;
    /* progress: called with the GIL every 4096 records */
    PyObject *progress;
    uint64_t progress_base;
    PyThreadState *ts;
    int py_error;
    const char *stop; /* a byte another thread sets to end the walk early */
} walker_t;

static void note(walker_t *w, pathlist_t *l, const char *rel, size_t rlen, const char *name,
                 int err) {
    /* Append rel (+ "/" + name) with err to l. */
    w->scratch.len = 0;
    if (buf_put(&w->scratch, rel, rlen) ||
        (name && (buf_put(&w->scratch, "/", 1) || buf_put(&w->scratch, name, strlen(name)))) ||
        pathlist_add(l, w->scratch.p ? w->scratch.p : "", w->scratch.len, err))
        w->oom = 1;
}

static int cmp_span(const void *a, const void *b) {
    const span_t *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c)
        return c;
    return (x->len > y->len) - (x->len < y->len);
}

static int is_submount(const walker_t *w, const char *rel, size_t len) {
    if (!w->nsubs)
        return 0;
    span_t key = {rel, len};
    return bsearch(&key, w->subs, w->nsubs, sizeof key, cmp_span) != NULL;
}

static int xstatx(int dfd, const char *name, int flags, struct statx *sx) {
    int r;
    do
        r = statx(dfd, name, flags, STATX_WANT, sx);
    while (r < 0 && errno == EINTR);
    return r;
}

static int xopenat(int dfd, const char *name, int flags) {
    int fd;
    do
        fd = openat(dfd, name, flags);
    while (fd < 0 && errno == EINTR);
    return fd;
}

/* Open the directory at rel (below the base), component by component when the path is long. */
static int open_rel(walker_t *w, const char *rel, size_t len, int flags) {
    if (len == 0)
        return xopenat(w->base_fd, ".", flags);
    if (len < PATH_MAX - 1)
        return xopenat(w->base_fd, rel + 1, flags);
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
                close(cur);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(comp, p, n);
        comp[n] = 0;
        int last = q >= end;
        int fd = xopenat(cur >= 0 ? cur : w->base_fd, comp,
                         last ? flags : O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int saved = errno;
        if (cur >= 0)
            close(cur);
        if (fd < 0) {
            errno = saved;
            return -1;
        }
        cur = fd;
        p = q;
    }
    return cur;
}

/* Every 4096 records: take the GIL, report progress, let signal handlers run (so SIGINT or a
 * SIGTERM handler that raises ends the walk), and give it back. */
static void checkpoint(walker_t *w) {
    PyEval_RestoreThread(w->ts);
    if (w->progress) {
        PyObject *r = PyObject_CallFunction(w->progress, "K",
                                            (unsigned long long)(w->progress_base + w->nrec));
        if (!r)
            w->py_error = 1;
        else
            Py_DECREF(r);
    }
    if (!w->py_error && PyErr_CheckSignals() < 0)
        w->py_error = 1;
    w->ts = PyEval_SaveThread();
}

static void record(walker_t *w, const struct statx *sx, uint32_t gen, int64_t nraw) {
    int64_t m[META_COLS];
    m[0] = (int64_t)sx->stx_ino;
    m[1] = gen;
    m[2] = sx->stx_mode;
    m[3] = sx->stx_nlink;
    m[4] = sx->stx_uid;
    m[5] = sx->stx_gid;
    m[6] = (int64_t)sx->stx_size;
    m[7] = sx->stx_atime.tv_sec * 1000000000LL + sx->stx_atime.tv_nsec;
    m[8] = sx->stx_mtime.tv_sec * 1000000000LL + sx->stx_mtime.tv_nsec;
    m[9] = sx->stx_ctime.tv_sec * 1000000000LL + sx->stx_ctime.tv_nsec;
    m[10] = (sx->stx_mask & STATX_BTIME)
                ? sx->stx_btime.tv_sec * 1000000000LL + sx->stx_btime.tv_nsec
                : 0;
    if (buf_put(&w->meta, m, sizeof m) || buf_put(&w->counts, &nraw, sizeof nraw)) {
        w->oom = 1;
        return;
    }
    w->nrec++;
    if (!(w->nrec & 0xFFF))
        checkpoint(w);
}

static void link_name(walker_t *w, uint64_t parent, uint64_t ino, const char *name, size_t n) {
    if (buf_u64(&w->lpar, parent) || buf_u64(&w->lino, ino) || buf_put(&w->names, name, n) ||
        buf_u64(&w->loff, w->names.len))
        w->oom = 1;
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

/* Append the raw extents of fd to w->raw; the count, or -errno (nothing appended). */
static long fiemap(walker_t *w, int fd) {
    uint64_t start = 0;
    long total = 0;
    size_t mark = w->raw.len;
    for (;;) {
        memset(w->fm, 0, sizeof *w->fm);
        w->fm->fm_start = start;
        w->fm->fm_length = UINT64_MAX - start;
        w->fm->fm_flags = w->sync ? FIEMAP_FLAG_SYNC : 0;
        w->fm->fm_extent_count = w->batch;
        int r;
        do
            r = ioctl(fd, FS_IOC_FIEMAP, w->fm);
        while (r < 0 && errno == EINTR);
        if (r < 0) {
            int e = errno;
            w->raw.len = mark;
            return -e;
        }
        uint32_t mapped = w->fm->fm_mapped_extents;
        if (mapped == 0)
            return total;
        if (buf_put(&w->raw, w->fm->fm_extents, mapped * sizeof(struct fiemap_extent))) {
            w->oom = 1;
            w->raw.len = mark;
            return 0;
        }
        total += mapped;
        const struct fiemap_extent *last = &w->fm->fm_extents[mapped - 1];
        if (mapped < w->batch || (last->fe_flags & FIEMAP_EXTENT_LAST))
            return total;
        uint64_t next = last->fe_logical + last->fe_length;
        if (next <= start || next == UINT64_MAX)
            return total;
        start = next;
    }
}

static int fiemap_unsupported(int e) { return e == EOPNOTSUPP || e == ENOTTY || e == EINVAL; }

/* Open, check and record the directory of task t; its fd, or -1 when it is left out. */
static int open_dir(walker_t *w, const task_t *t, uint64_t *ino) {
    int fd = open_rel(w, t->rel, t->len, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        note(w, &w->skipped, t->rel, t->len, NULL, errno);
        return -1;
    }
    struct statx sx;
    if (xstatx(fd, "", AT_EMPTY_PATH, &sx) < 0) {
        note(w, &w->skipped, t->rel, t->len, NULL, errno);
        close(fd);
        return -1;
    }
    if (w->mode != MODE_RECORD && (makedev(sx.stx_dev_major, sx.stx_dev_minor) != w->dev ||
                                   is_submount(w, t->rel, t->len))) {
        note(w, &w->not_crossed, t->rel, t->len, NULL, 0);
        close(fd);
        return -1;
    }
    uint32_t gen = generation(w, fd);
    long n = 0;
    if (w->dir_fiemap) {
        n = fiemap(w, fd);
        if (n < 0) {
            if (fiemap_unsupported((int)-n))
                w->dir_fiemap = 0;
            else
                note(w, &w->no_fiemap, t->rel, t->len, NULL, (int)-n);
            n = 0;
        }
    }
    record(w, &sx, gen, n);
    if (t->has_parent) {
        const char *name = t->rel + t->len;
        while (name > t->rel && name[-1] != '/')
            name--;
        link_name(w, t->parent, sx.stx_ino, name, (size_t)(t->rel + t->len - name));
    }
    *ino = sx.stx_ino;
    return fd;
}

static void regular_file(walker_t *w, int dfd, const task_t *t, uint64_t dino, const char *name,
                         uint64_t d_ino) {
    size_t nlen = strlen(name);
    if (inoset_has(&w->seen, d_ino)) {
        link_name(w, dino, d_ino, name, nlen);
        return;
    }
    int fd = xopenat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        note(w, &w->skipped, t->rel, t->len, name, errno);
        return;
    }
    struct statx sx;
    if (xstatx(fd, "", AT_EMPTY_PATH, &sx) < 0) {
        note(w, &w->skipped, t->rel, t->len, name, errno);
        close(fd);
        return;
    }
    if (!S_ISREG(sx.stx_mode)) { /* replaced by something else since the listing */
        note(w, &w->skipped, t->rel, t->len, name, ENOENT);
        close(fd);
        return;
    }
    uint32_t gen = generation(w, fd);
    long n = 0;
    if (sx.stx_size || sx.stx_blocks) {
        n = fiemap(w, fd);
        if (n < 0) {
            int e = (int)-n;
            if (!fiemap_unsupported(e)) {
                note(w, &w->skipped, t->rel, t->len, name, e);
                close(fd);
                return;
            }
            note(w, &w->no_fiemap, t->rel, t->len, name, e);
            n = 0;
        } else {
            w->fiemap_ok++;
        }
    }
    close(fd);
    if (sx.stx_nlink > 1) {
        if (inoset_has(&w->seen, sx.stx_ino)) { /* another name was recorded meanwhile */
            w->raw.len -= (size_t)n * sizeof(struct fiemap_extent);
            link_name(w, dino, sx.stx_ino, name, nlen);
            return;
        }
        if (inoset_add(&w->seen, sx.stx_ino))
            w->oom = 1;
    }
    record(w, &sx, gen, n);
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
        if (inoset_has(&w->seen, sx.stx_ino)) {
            link_name(w, dino, sx.stx_ino, name, nlen);
            return;
        }
        if (inoset_add(&w->seen, sx.stx_ino))
            w->oom = 1;
    }
    record(w, &sx, 0, 0);
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
        w->oom = 1;
        return;
    }
    memcpy(rel, t->rel, t->len);
    rel[t->len] = '/';
    memcpy(rel + t->len + 1, name, nlen + 1);
    tasks_t *dst = w->mode == MODE_DEFER ? &w->deferred : &w->stack;
    if (tasks_push(dst, rel, t->len + 1 + nlen, dino, 1)) {
        free(rel);
        w->oom = 1;
    }
}

static int stopped(const walker_t *w) {
    return w->oom || w->py_error || (w->stop && __atomic_load_n(w->stop, __ATOMIC_RELAXED));
}

static void read_dir(walker_t *w, int dfd, const task_t *t, uint64_t dino) {
    for (;;) {
        long nread;
        do
            nread = syscall(SYS_getdents64, dfd, w->dents, DENTS_SIZE);
        while (nread < 0 && errno == EINTR);
        if (nread < 0) {
            note(w, &w->skipped, t->rel, t->len, "", errno); /* rel + "/" */
            return;
        }
        if (nread == 0)
            return;
        for (long pos = 0; pos < nread && !stopped(w);) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(w->dents + pos);
            pos += d->d_reclen;
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
                regular_file(w, dfd, t, dino, name, d->d_ino);
            else
                other_entry(w, dfd, t, dino, name, have ? &sx : NULL);
        }
        if (stopped(w))
            return;
    }
}

static void process(walker_t *w, const task_t *t) {
    uint64_t dino = 0;
    int dfd = open_dir(w, t, &dino);
    if (dfd < 0)
        return;
    if (w->mode != MODE_RECORD)
        read_dir(w, dfd, t, dino);
    close(dfd);
}

static void run(walker_t *w, tasks_t *top) {
    for (size_t i = 0; i < top->n && !stopped(w); i++) {
        process(w, &top->v[i]);
        while (w->stack.n && !stopped(w)) {
            task_t t = w->stack.v[--w->stack.n];
            process(w, &t);
            free(t.rel);
        }
    }
}

/* ---- Python glue -------------------------------------------------------------------------- */

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

static PyObject *tasks_py(const tasks_t *t) {
    PyObject *out = PyList_New((Py_ssize_t)t->n);
    if (!out)
        return NULL;
    for (size_t i = 0; i < t->n; i++) {
        PyObject *item = Py_BuildValue("(y#K)", t->v[i].rel, (Py_ssize_t)t->v[i].len,
                                       (unsigned long long)t->v[i].parent);
        if (!item) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    return out;
}

static void walker_free(walker_t *w) {
    if (w->base_fd >= 0)
        close(w->base_fd);
    free(w->subs);
    free(w->fm);
    free(w->dents);
    buf_free(&w->meta);
    buf_free(&w->counts);
    buf_free(&w->raw);
    buf_free(&w->lpar);
    buf_free(&w->lino);
    buf_free(&w->loff);
    buf_free(&w->names);
    buf_free(&w->scratch);
    pathlist_free(&w->skipped);
    pathlist_free(&w->not_crossed);
    pathlist_free(&w->no_fiemap);
    free(w->seen.slots);
    tasks_free(&w->stack);
    tasks_free(&w->deferred);
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
        if (tasks_push(out, copy, (size_t)len, par, has)) {
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

PyDoc_STRVAR(walk_doc,
             "walk(base, tasks, *, mode, dev, submounts, sync, batch, dir_fiemap, getversion,\n"
             "     progress=None, progress_base=0) -> dict\n\n"
             "Walk the directories ``tasks`` ((rel, parent inode or None) pairs, rel from the\n"
             "mount root ``base``) and return the columns described in fsage/_live.c.");

static PyObject *py_walk(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"base",  "tasks",      "mode",       "dev",      "submounts",
                             "sync",  "batch",      "dir_fiemap", "getversion", "progress",
                             "progress_base", "stop", NULL};
    PyObject *base_obj, *tasks_obj, *subs_obj = NULL, *progress = Py_None, *stop = Py_None;
    Py_buffer stop_view = {0};
    int mode = -1, sync = 0, dir_fiemap = 1, getversion = 1;
    unsigned long long dev = 0, progress_base = 0;
    unsigned int batch = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|$iKOpIppOKO", kwlist,
                                     PyUnicode_FSConverter, &base_obj, &tasks_obj, &mode, &dev,
                                     &subs_obj, &sync, &batch, &dir_fiemap, &getversion, &progress,
                                     &progress_base, &stop))
        return NULL;
    PyObject *result = NULL, *subs_fast = NULL;
    walker_t w;
    memset(&w, 0, sizeof w);
    w.base_fd = -1;
    if (mode < MODE_WALK || mode > MODE_RECORD || batch < 1 || batch > 65536) {
        PyErr_SetString(PyExc_ValueError, "bad mode or batch");
        goto out;
    }
    w.mode = mode;
    w.dev = (dev_t)dev;
    w.sync = sync;
    w.batch = batch;
    w.dir_fiemap = dir_fiemap;
    w.getversion = getversion;
    w.progress = progress == Py_None ? NULL : progress;
    w.progress_base = progress_base;
    if (stop != Py_None) {
        if (PyObject_GetBuffer(stop, &stop_view, PyBUF_WRITABLE) < 0)
            goto out;
        if (stop_view.len < 1) {
            PyErr_SetString(PyExc_ValueError, "stop must be a writable buffer of one byte or more");
            goto out;
        }
        w.stop = stop_view.buf;
    }
    if (!subs_obj) {
        PyErr_SetString(PyExc_TypeError, "walk() needs mode, dev, submounts and batch");
        goto out;
    }
    subs_fast = PySequence_Fast(subs_obj, "submounts must be a sequence of bytes");
    if (!subs_fast)
        goto out;
    w.nsubs = (size_t)PySequence_Fast_GET_SIZE(subs_fast);
    w.subs = calloc(w.nsubs + 1, sizeof *w.subs);
    w.fm = calloc(1, sizeof(struct fiemap) + (size_t)batch * sizeof(struct fiemap_extent));
    w.dents = malloc(DENTS_SIZE);
    if (!w.subs || !w.fm || !w.dents) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < w.nsubs; i++) {
        char *p;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(subs_fast, i), &p, &n) < 0)
            goto out;
        w.subs[i].p = p; /* the bytes objects stay alive in subs_fast */
        w.subs[i].len = (size_t)n;
    }
    qsort(w.subs, w.nsubs, sizeof *w.subs, cmp_span);
    tasks_t top = {0};
    if (parse_tasks(tasks_obj, &top) < 0) {
        tasks_free(&top);
        goto out;
    }
    const char *base = PyBytes_AS_STRING(base_obj);
    int base_err = 0;
    uint64_t zero = 0;
    w.ts = PyEval_SaveThread();
    w.base_fd = xopenat(AT_FDCWD, base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w.base_fd < 0)
        base_err = errno;
    else if (buf_u64(&w.loff, zero))
        w.oom = 1;
    else
        run(&w, &top);
    PyEval_RestoreThread(w.ts);
    tasks_free(&top);
    if (base_err) {
        errno = base_err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, base_obj);
        goto out;
    }
    if (w.py_error)
        goto out;
    if (w.stop && *w.stop) {
        PyErr_SetString(PyExc_InterruptedError, "the walk was stopped");
        goto out;
    }
    if (w.oom) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue(
        "{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:K,s:N,s:O,s:O}", "meta", buffer_of(&w.meta),
        "counts", buffer_of(&w.counts), "raw", buffer_of(&w.raw), "l_parent", buffer_of(&w.lpar),
        "l_ino", buffer_of(&w.lino), "name_off", buffer_of(&w.loff), "names", bytes_of(&w.names),
        "skipped", pathlist_py(&w.skipped, 1), "not_crossed", pathlist_py(&w.not_crossed, 0),
        "no_fiemap", pathlist_py(&w.no_fiemap, 1), "fiemap_ok", (unsigned long long)w.fiemap_ok,
        "deferred", tasks_py(&w.deferred), "dir_fiemap", w.dir_fiemap ? Py_True : Py_False,
        "getversion", w.getversion ? Py_True : Py_False);
out:
    walker_free(&w);
    Py_XDECREF(subs_fast);
    if (stop_view.obj)
        PyBuffer_Release(&stop_view);
    Py_DECREF(base_obj);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))py_walk, METH_VARARGS | METH_KEYWORDS, walk_doc},
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
        PyModule_AddIntConstant(m, "MODE_DEFER", MODE_DEFER) ||
        PyModule_AddIntConstant(m, "MODE_RECORD", MODE_RECORD) ||
        PyModule_AddIntConstant(m, "META_COLS", META_COLS)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
