/*
 * fsage._posixexec: the per-op work of the mounted-directory executor (fsage/ager/posix.py)
 * in C, so that an op costs its system calls and little else.
 *
 * Executor.apply(op) runs create, append, overwrite, truncate, punch, fallocate, mkdir,
 * delete, rename, link and setattr with openat/fallocate/write/unlinkat/renameat/linkat/
 * fchmodat/utimensat relative to directory descriptors; any other kind goes to the Python ``fallback(op)``. The semantics are
 * posix.py's (see its module doc): every path is walked one component at a time from the
 * target's root with O_NOFOLLOW, a create that runs out of space removes the file it made,
 * an append that does truncates the file back, an overwrite that fails puts the old bytes
 * (and holes) of its range back, and errors become the exceptions given at
 * construction: (NoSpaceError, OpFailedError, UnsafeTargetError, FsageError).
 *
 * Directory descriptors are cached by relative path (least recently used evicted beyond
 * ``max_fds``). Every descriptor handed out during an op is pinned until the next op starts,
 * so an op that resolves two directories (rename, link) never sees the first closed by the
 * second lookup. A removed or renamed directory's entries, and those below it, are closed.
 *
 * Executor.apply_logged(journal, op) runs the op and then, only if it took effect, appends
 * its JSON line to ``journal.fd`` (a plain-ASCII op is formatted here, byte for byte as
 * Op.to_json writes it; any other goes through ``journal.add(op)``).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "_posixexec_undo.h"

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define NEW_FLAGS (O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC)
#define FILE_FLAGS (O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
#define CHUNK (1 << 20)

/* Return codes of the internal functions (which run without the GIL on the worker): 0 done;
 * ERR_ERRNO failed with ex->err set (an OSError of the op); ERR_UNSAFE a directory on the way
 * is a symlink or not a directory (ex->bad_key); ERR_NOTREG the op's path is not a regular
 * file; ERR_NOMEM out of memory. raise_rc turns them into the op's exception. */
#define ERR_ERRNO (-1)
#define ERR_UNSAFE (-2)
#define ERR_NOTREG (-3)
#define ERR_NOMEM (-4)

#define RETRY(call)                                                                            \
    ({                                                                                         \
        long r_;                                                                               \
        do r_ = (long)(call);                                                                  \
        while (r_ < 0 && errno == EINTR);                                                      \
        r_;                                                                                    \
    })

enum kind {
    K_CREATE,
    K_APPEND,
    K_OVERWRITE,
    K_TRUNCATE,
    K_PUNCH,
    K_FALLOCATE,
    K_MKDIR,
    K_DELETE,
    K_RENAME,
    K_LINK,
    K_SETATTR,
    K_OTHER
};
static const char *const KIND_NAMES[] = {"create",    "append", "overwrite", "truncate",
                                         "punch",     "fallocate", "mkdir",  "delete",
                                         "rename",    "link",   "setattr"};

typedef struct {
    char *key; /* relative path of the directory, not NUL-terminated */
    Py_ssize_t len;
    uint64_t hash;
    int fd;
    int prev, next; /* LRU list: prev toward the least recently used; -1 ends */
    uint64_t pin;   /* the op generation that last handed it out */
} Entry;

/* Ops queued for the worker; the Python side probes space at least every 32 ops. */
#define RING 64
/* The sleeping worker is woken when this many ops wait (or by a drain): a wake-up per op
 * would cost a context switch per op. */
#define WAKE_AT 8
/* Space an op may take beyond its data (directory, extent and inode blocks), in bytes. */
#define METADATA_COST (16 * 4096)
#define ERR_JOURNAL (-5)

/* What a setattr op sets: permission bits and/or the modification time (ns since the epoch). */
struct attrs {
    int has_mode, has_mtime;
    long long mode, mtime_ns;
};

typedef struct {
    PyObject *op; /* the Op; released by the calling thread once run */
    enum kind kind;
    long long size, offset, bytes;
    struct attrs attrs;
    char *buf; /* path NUL dest NUL journal line */
    size_t cap;
    Py_ssize_t plen, dlen, llen;
    int jfd;
} Slot;

typedef struct {
    PyObject_HEAD
    int root_fd;
    int allocate_only;
    int fsync;
    int max_fds;
    PyObject *data; /* bytes: the pseudo-random data written */
    PyObject *fallback;
    PyObject *inode_check; /* (kind, path): raises when the inodes ran out */
    PyObject *nospace_exc, *failed_exc, *unsafe_exc, *fsage_exc, *inflight_exc;
    int err;
    char *bad_key;
    Py_ssize_t bad_len;
    /* the cache */
    Entry *ents;
    int cap, count, free_head, lru, mru;
    int32_t *table; /* open addressing, linear probing: entry index or -1 */
    uint32_t tmask;
    uint64_t gen;
    /* running ahead (see "running ahead" below); the counters under mu */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    int running;
    _Atomic int stopping, idle, waiting;
    _Atomic uint64_t submitted, completed; /* each written by one thread only */
    _Atomic int failed;
    int failed_slot, failed_rc, failed_err;
    uint64_t lost_ops;
    long long lost_bytes;
    long long budget_bytes, budget_inodes;
    double busy_main, busy_worker; /* seconds spent running ops, by each thread */
    UndoBuf undo; /* an overwrite's old bytes (one op runs at a time) */
    PyObject *journal;
    Slot ring[RING];
} Exec;

/* ------------------------------------------------------------------ the cache */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

static int table_find(Exec *ex, const char *key, Py_ssize_t len, uint64_t h) {
    uint32_t i = (uint32_t)h & ex->tmask;
    for (;;) {
        int e = ex->table[i];
        if (e < 0) return -1;
        Entry *en = &ex->ents[e];
        if (en->hash == h && en->len == len && memcmp(en->key, key, (size_t)len) == 0) return e;
        i = (i + 1) & ex->tmask;
    }
}

static void table_put(Exec *ex, int e) {
    uint32_t i = (uint32_t)ex->ents[e].hash & ex->tmask;
    while (ex->table[i] >= 0) i = (i + 1) & ex->tmask;
    ex->table[i] = e;
}

static void table_remove(Exec *ex, int e) {
    uint32_t i = (uint32_t)ex->ents[e].hash & ex->tmask;
    while (ex->table[i] != e) i = (i + 1) & ex->tmask;
    /* Backward-shift deletion: move later entries of the run into the hole. */
    uint32_t hole = i;
    for (;;) {
        i = (i + 1) & ex->tmask;
        int f = ex->table[i];
        if (f < 0) break;
        uint32_t home = (uint32_t)ex->ents[f].hash & ex->tmask;
        if (((i - home) & ex->tmask) >= ((i - hole) & ex->tmask)) {
            ex->table[hole] = f;
            hole = i;
        }
    }
    ex->table[hole] = -1;
}

static void lru_unlink(Exec *ex, int e) {
    Entry *en = &ex->ents[e];
    if (en->prev >= 0) ex->ents[en->prev].next = en->next;
    else ex->lru = en->next;
    if (en->next >= 0) ex->ents[en->next].prev = en->prev;
    else ex->mru = en->prev;
    en->prev = en->next = -1;
}

static void lru_push(Exec *ex, int e) {
    Entry *en = &ex->ents[e];
    en->prev = ex->mru;
    en->next = -1;
    if (ex->mru >= 0) ex->ents[ex->mru].next = e;
    else ex->lru = e;
    ex->mru = e;
}

static void close_entry(Exec *ex, int e) {
    Entry *en = &ex->ents[e];
    close(en->fd);
    table_remove(ex, e);
    lru_unlink(ex, e);
    free(en->key);
    en->key = NULL;
    en->fd = -1;
    en->next = ex->free_head; /* the free list reuses next */
    ex->free_head = e;
    ex->count--;
}

/* Room for one more entry: grow the arrays (the table stays under half full). */
static int reserve(Exec *ex) {
    if (ex->free_head >= 0) return 0;
    int ncap = ex->cap ? ex->cap * 2 : 64;
    Entry *ne = realloc(ex->ents, sizeof(Entry) * (size_t)ncap);
    if (ne == NULL) return -1;
    ex->ents = ne;
    for (int i = ncap - 1; i >= ex->cap; i--) {
        ne[i].key = NULL;
        ne[i].fd = -1;
        ne[i].next = ex->free_head;
        ex->free_head = i;
    }
    uint32_t tsize = (uint32_t)ncap * 4;
    int32_t *nt = malloc(sizeof(int32_t) * tsize);
    if (nt == NULL) return -1;
    free(ex->table);
    ex->table = nt;
    ex->tmask = tsize - 1;
    for (uint32_t i = 0; i < tsize; i++) nt[i] = -1;
    for (int i = 0; i < ex->cap; i++)
        if (ne[i].key != NULL) table_put(ex, i);
    ex->cap = ncap;
    return 0;
}

/* Close the least recently used unpinned descriptors until at most ``keep`` remain. */
static void evict(Exec *ex, int keep) {
    int e = ex->lru;
    while (ex->count > keep && e >= 0) {
        int next = ex->ents[e].next;
        if (ex->ents[e].pin != ex->gen) close_entry(ex, e);
        e = next;
    }
}

static void drop_all(Exec *ex) {
    while (ex->lru >= 0) close_entry(ex, ex->lru);
}

/* Close the entries of directory ``path`` and of everything below it. */
static void forget(Exec *ex, const char *path, Py_ssize_t len) {
    if (ex->count == 0) return;
    for (int e = 0; e < ex->cap; e++) {
        Entry *en = &ex->ents[e];
        if (en->key == NULL || en->len < len || memcmp(en->key, path, (size_t)len) != 0) continue;
        if (en->len == len || en->key[len] == '/') close_entry(ex, e);
    }
}

static int note_unsafe(Exec *ex, const char *key, Py_ssize_t len) {
    char *copy = malloc((size_t)len + 1);
    if (copy == NULL) return ERR_NOMEM;
    memcpy(copy, key, (size_t)len);
    free(ex->bad_key);
    ex->bad_key = copy;
    ex->bad_len = len;
    return ERR_UNSAFE;
}

static void raise_unsafe(Exec *ex) {
    PyObject *s = PyUnicode_DecodeFSDefaultAndSize(ex->bad_key, ex->bad_len);
    if (s == NULL) return;
    PyObject *msg = PyUnicode_FromFormat("%R is not a directory inside the target (symlink?)", s);
    Py_DECREF(s);
    if (msg == NULL) return;
    PyErr_SetObject(ex->unsafe_exc, msg);
    Py_DECREF(msg);
}

/* Descriptor of directory ``key`` (relative, "" = the root), walked without following
 * symlinks; cached and pinned for the current op. */
static int dir_fd(Exec *ex, const char *key, Py_ssize_t len, int *out) {
    if (len == 0) {
        *out = ex->root_fd;
        return 0;
    }
    uint64_t h = hash_bytes(key, len);
    int e = table_find(ex, key, len, h);
    if (e >= 0) {
        Entry *en = &ex->ents[e];
        if (ex->mru != e) {
            lru_unlink(ex, e);
            lru_push(ex, e);
        }
        en->pin = ex->gen;
        *out = en->fd;
        return 0;
    }
    Py_ssize_t slash = len - 1;
    while (slash >= 0 && key[slash] != '/') slash--;
    int base;
    int rc = dir_fd(ex, key, slash < 0 ? 0 : slash, &base);
    if (rc) return rc;
    char name[NAME_MAX + 1];
    Py_ssize_t nlen = len - slash - 1;
    if (nlen > NAME_MAX) {
        ex->err = ENAMETOOLONG;
        return ERR_ERRNO;
    }
    memcpy(name, key + slash + 1, (size_t)nlen);
    name[nlen] = '\0';
    int fd = (int)RETRY(openat(base, name, DIR_FLAGS));
    if (fd < 0) {
        if (errno == ELOOP || errno == ENOTDIR) return note_unsafe(ex, key, len);
        ex->err = errno;
        return ERR_ERRNO;
    }
    evict(ex, ex->max_fds - 1);
    if (reserve(ex) < 0) {
        close(fd);
        return ERR_NOMEM;
    }
    e = ex->free_head;
    Entry *en = &ex->ents[e];
    ex->free_head = en->next;
    en->key = malloc((size_t)len);
    if (en->key == NULL) {
        en->next = ex->free_head;
        ex->free_head = e;
        close(fd);
        return ERR_NOMEM;
    }
    memcpy(en->key, key, (size_t)len);
    en->len = len;
    en->hash = h;
    en->fd = fd;
    en->pin = ex->gen;
    table_put(ex, e);
    lru_push(ex, e);
    ex->count++;
    *out = fd;
    return 0;
}

/* The directory descriptor and the last component of ``path`` (a NUL-terminated suffix). */
static int split(Exec *ex, const char *path, Py_ssize_t len, int *dfd, const char **name) {
    Py_ssize_t slash = len - 1;
    while (slash >= 0 && path[slash] != '/') slash--;
    *name = path + slash + 1;
    return dir_fd(ex, path, slash < 0 ? 0 : slash, dfd);
}

/* ------------------------------------------------------------------ data */

static int errno_fail(Exec *ex) {
    ex->err = errno;
    return ERR_ERRNO;
}

/* Write ``size`` bytes of data at ``offset`` (-1: at the file position), or allocate them. */
static int put_data(Exec *ex, int fd, long long size, long long offset) {
    if (ex->allocate_only) {
        if (size && RETRY(fallocate(fd, 0, offset < 0 ? 0 : offset, size)) != 0)
            return errno_fail(ex);
        return 0;
    }
    const char *buf = PyBytes_AS_STRING(ex->data);
    long long done = 0;
    while (done < size) {
        size_t n = (size_t)(size - done < CHUNK ? size - done : CHUNK);
        long w = offset < 0 ? RETRY(write(fd, buf, n)) : RETRY(pwrite(fd, buf, n, offset + done));
        if (w < 0) return errno_fail(ex);
        if (w == 0) {
            ex->err = ENOSPC;
            return ERR_ERRNO;
        }
        done += w;
    }
    return 0;
}

static int is_nospace(int err) { return err == ENOSPC || err == EDQUOT; }

/* Open the regular file at ``path``; anything else (a FIFO, a device...) is refused. */
static int open_file(Exec *ex, const char *path, Py_ssize_t len, int flags, int *out,
                     struct stat *st) {
    int dfd;
    const char *name;
    int rc = split(ex, path, len, &dfd, &name);
    if (rc) return rc;
    int fd = (int)RETRY(openat(dfd, name, flags | FILE_FLAGS, 0644));
    if (fd < 0) return errno_fail(ex);
    if (fstat(fd, st) != 0) {
        rc = errno_fail(ex);
        close(fd);
        return rc;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return ERR_NOTREG;
    }
    *out = fd;
    return 0;
}

static int close_checked(Exec *ex, int fd, int rc) {
    if (close(fd) != 0 && rc == 0) return errno_fail(ex);
    return rc;
}

/* ------------------------------------------------------------------ ops */

typedef struct {
    enum kind kind;
    PyObject *kind_obj, *path_obj, *dest_obj, *label_obj;
    const char *path, *dest;
    Py_ssize_t plen, dlen;
    long long size, offset;
    struct attrs attrs;
    PyObject *tmp_path, *tmp_dest; /* encoded non-ASCII paths */
} OpArgs;

static enum kind classify(PyObject *s) {
    Py_ssize_t n;
    const char *k = PyUnicode_AsUTF8AndSize(s, &n);
    if (k == NULL) {
        PyErr_Clear();
        return K_OTHER;
    }
    for (int i = 0; i < K_OTHER; i++)
        if (strcmp(k, KIND_NAMES[i]) == 0 && (Py_ssize_t)strlen(k) == n) return (enum kind)i;
    return K_OTHER;
}

/* The bytes of a path as os functions pass them (UTF-8 with surrogateescape). */
static int path_bytes(PyObject *s, const char **p, Py_ssize_t *n, PyObject **tmp) {
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "op paths must be str");
        return -1;
    }
    if (PyUnicode_IS_ASCII(s)) {
        *p = PyUnicode_AsUTF8AndSize(s, n);
        if (*p == NULL) return -1;
    } else {
        *tmp = PyUnicode_EncodeFSDefault(s);
        if (*tmp == NULL) return -1;
        *p = PyBytes_AS_STRING(*tmp);
        *n = PyBytes_GET_SIZE(*tmp);
    }
    if ((Py_ssize_t)strlen(*p) != *n) {
        PyErr_SetString(PyExc_ValueError, "embedded null byte");
        return -1;
    }
    return 0;
}

static int run_create(Exec *ex, OpArgs *a) {
    int dfd, fd;
    const char *name;
    struct stat st;
    int rc = split(ex, a->path, a->plen, &dfd, &name);
    if (rc) return rc;
    fd = (int)RETRY(openat(dfd, name, NEW_FLAGS, 0644));
    if (fd < 0) {
        if (errno != EEXIST) return errno_fail(ex);
        rc = open_file(ex, a->path, a->plen, O_WRONLY | O_CREAT | O_TRUNC, &fd, &st);
        if (rc) return rc;
    }
    rc = put_data(ex, fd, a->size, ex->allocate_only ? 0 : -1);
    if (rc == 0 && ex->fsync && RETRY(fsync(fd)) != 0) rc = errno_fail(ex);
    if (rc == 0) {
        /* A file system that caches writes (FUSE's writeback cache, NFS) may report the
         * full disk only when the data is written back at close: the same failure. */
        int closed = close(fd);
        fd = -1;
        if (closed == 0) return 0;
        rc = errno_fail(ex);
        if (!is_nospace(ex->err)) return rc;
    }
    if (rc == ERR_ERRNO && is_nospace(ex->err)) {
        if (fd >= 0) close(fd);
        /* Remove what was made: a full disk leaves no half-written file behind. */
        int rc2 = split(ex, a->path, a->plen, &dfd, &name);
        if (rc2) return rc2;
        if (unlinkat(dfd, name, 0) != 0) return errno_fail(ex);
        return rc;
    }
    return close_checked(ex, fd, rc);
}

static int run_resize(Exec *ex, OpArgs *a) {
    int fd;
    struct stat st;
    int over = a->kind == K_OVERWRITE && !ex->allocate_only, dfd;
    const char *name;
    int rc = open_file(ex, a->path, a->plen, over ? O_RDWR : O_WRONLY, &fd, &st);
    int readable = over;
    if (rc == ERR_ERRNO && over && ex->err == EACCES) { /* write-only to us: nothing kept */
        readable = 0;
        rc = open_file(ex, a->path, a->plen, O_WRONLY, &fd, &st);
    }
    if (rc) return rc;
    long long old = st.st_size;
    Saved sv = UNDO_NONE;
    if (readable) {
        long long hi = a->offset + a->size < old ? a->offset + a->size : old;
        rc = split(ex, a->path, a->plen, &dfd, &name);
        if (rc == 0) {
            int e = undo_save(&ex->undo, dfd, fd, a->offset, hi, old, &sv);
            if (e) rc = e == ENOMEM ? ERR_NOMEM : (ex->err = e, ERR_ERRNO);
        }
        if (rc) {
            undo_free(&sv);
            close(fd);
            return rc;
        }
    }
    if (a->kind == K_APPEND) rc = put_data(ex, fd, a->size, old);
    else if (a->kind == K_OVERWRITE) {
        if (over) rc = put_data(ex, fd, a->size, a->offset);
    } else if (RETRY(ftruncate(fd, a->size)) != 0) rc = errno_fail(ex);
    if (rc == 0 && ex->fsync && RETRY(fsync(fd)) != 0) rc = errno_fail(ex);
    /* An op that failed leaves the file as it was: an overwrite's old bytes put back, and an
     * append or an overwrite past the end refused for lack of space leaves the file its old
     * size. The ager's model and journal take the op as never run. A failure to undo leaves
     * the first error as the one reported. */
    int grows = a->kind == K_APPEND || (a->kind == K_OVERWRITE && a->offset + a->size > old);
    if (rc == ERR_ERRNO && over) {
        (void)undo_restore(fd, &sv);
        if (!grows && ex->fsync) (void)RETRY(fsync(fd));
    }
    if (rc == ERR_ERRNO && (is_nospace(ex->err) || over) && grows) {
        if (RETRY(ftruncate(fd, old)) != 0) rc = errno_fail(ex);
        else if (over && ex->fsync) (void)RETRY(fsync(fd));
    }
    int failed_before = rc != 0;
    rc = close_checked(ex, fd, rc);
    if (rc == ERR_ERRNO && !failed_before && is_nospace(ex->err) && (grows || over)) {
        /* Refused only at close (written back then: FUSE's writeback cache, NFS): part of
         * the data may be stored. Put it back through a new descriptor; the close's error
         * stays the one reported. */
        int err = ex->err, fd2;
        struct stat st2;
        if (open_file(ex, a->path, a->plen, O_WRONLY, &fd2, &st2) == 0) {
            if (over) (void)undo_restore(fd2, &sv);
            if (grows && st2.st_size != old) (void)RETRY(ftruncate(fd2, old));
            close(fd2);
        }
        ex->err = err;
    }
    undo_free(&sv);
    return rc;
}

static int run_space(Exec *ex, OpArgs *a) {
    int fd;
    struct stat st;
    int rc = open_file(ex, a->path, a->plen, O_WRONLY, &fd, &st);
    if (rc) return rc;
    long long old = st.st_size;
    int punch = a->kind == K_PUNCH;
    int mode = punch ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE : 0;
    if (a->size && RETRY(fallocate(fd, mode, a->offset, a->size)) != 0) rc = errno_fail(ex);
    if (rc == 0 && ex->fsync && RETRY(fsync(fd)) != 0) rc = errno_fail(ex);
    if (rc == ERR_ERRNO && is_nospace(ex->err) && !punch) {
        /* Undo what was allocated; a failure here leaves the first error as the one shown. */
        if (RETRY(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, a->offset,
                            a->size)) == 0)
            (void)RETRY(ftruncate(fd, old));
    }
    return close_checked(ex, fd, rc);
}

static int run_delete(Exec *ex, OpArgs *a) {
    int dfd;
    const char *name;
    int rc = split(ex, a->path, a->plen, &dfd, &name);
    if (rc) return rc;
    if (unlinkat(dfd, name, 0) == 0) return 0;
    int e = errno;
    if (e == EPERM || e == EACCES) {
        /* Linux reports EPERM (not EISDIR) for unlink of a directory on some fs. */
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno_fail(ex);
        if (!S_ISDIR(st.st_mode)) {
            ex->err = e;
            return ERR_ERRNO;
        }
    } else if (e != EISDIR) {
        ex->err = e;
        return ERR_ERRNO;
    }
    if (unlinkat(dfd, name, AT_REMOVEDIR) != 0) return errno_fail(ex);
    forget(ex, a->path, a->plen);
    return 0;
}

static int run_pair(Exec *ex, OpArgs *a) {
    int sfd, dfd;
    const char *sname, *dname;
    int rc = split(ex, a->path, a->plen, &sfd, &sname);
    if (rc) return rc;
    rc = split(ex, a->dest, a->dlen, &dfd, &dname);
    if (rc) return rc;
    if (a->kind == K_LINK) {
        if (linkat(sfd, sname, dfd, dname, 0) != 0) return errno_fail(ex);
        return 0;
    }
    if (renameat(sfd, sname, dfd, dname) != 0) return errno_fail(ex);
    /* A directory renamed (or replaced by the rename) changes what cached paths name. */
    forget(ex, a->path, a->plen);
    forget(ex, a->dest, a->dlen);
    return 0;
}

/* chmod and/or utimens of ``path``, never through a symlink: a symlink's own time is set, its
 * mode left (Linux has none to set); atime is left as it is. */
static int run_setattr(Exec *ex, OpArgs *a) {
    int dfd;
    const char *name;
    int rc = split(ex, a->path, a->plen, &dfd, &name);
    if (rc) return rc;
    if (a->attrs.has_mode) {
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno_fail(ex);
        if (!S_ISLNK(st.st_mode) && fchmodat(dfd, name, (mode_t)a->attrs.mode, 0) != 0)
            return errno_fail(ex);
    }
    if (a->attrs.has_mtime) {
        long long ns = a->attrs.mtime_ns, sec = ns / 1000000000LL, frac = ns % 1000000000LL;
        if (frac < 0) { /* before 1970: tv_nsec must stay in [0, 1e9) */
            sec -= 1;
            frac += 1000000000LL;
        }
        struct timespec ts[2] = {{.tv_sec = 0, .tv_nsec = UTIME_OMIT},
                                 {.tv_sec = (time_t)sec, .tv_nsec = (long)frac}};
        if (utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW) != 0) return errno_fail(ex);
    }
    return 0;
}

static int run_op(Exec *ex, OpArgs *a) {
    switch (a->kind) {
    case K_CREATE:
        return run_create(ex, a);
    case K_APPEND:
    case K_OVERWRITE:
    case K_TRUNCATE:
        return run_resize(ex, a);
    case K_PUNCH:
    case K_FALLOCATE:
        return run_space(ex, a);
    case K_MKDIR: {
        int dfd;
        const char *name;
        int rc = split(ex, a->path, a->plen, &dfd, &name);
        if (rc) return rc;
        if (mkdirat(dfd, name, 0755) != 0) return errno_fail(ex);
        return 0;
    }
    case K_DELETE:
        return run_delete(ex, a);
    case K_RENAME:
    case K_LINK:
        return run_pair(ex, a);
    case K_SETATTR:
        return run_setattr(ex, a);
    default:
        return 0;
    }
}

static long long op_result(OpArgs *a) {
    switch (a->kind) {
    case K_CREATE:
    case K_APPEND:
    case K_OVERWRITE:
        return a->size;
    default:
        return 0;
    }
}

static void args_release(OpArgs *a) {
    Py_XDECREF(a->kind_obj);
    Py_XDECREF(a->path_obj);
    Py_XDECREF(a->dest_obj);
    Py_XDECREF(a->label_obj);
    Py_XDECREF(a->tmp_path);
    Py_XDECREF(a->tmp_dest);
}

static PyObject *S_op, *S_path, *S_dest, *S_size, *S_offset, *S_label, *S_fd, *S_add, *S_mode,
    *S_mtime_ns;

/* An optional integer attribute (None: not set); -1 with an exception on error. */
static int get_optional(PyObject *op, PyObject *attr, int *has, long long *out) {
    PyObject *v = PyObject_GetAttr(op, attr);
    if (v == NULL) return -1;
    *has = v != Py_None;
    if (*has) {
        *out = PyLong_AsLongLong(v);
        if (*out == -1 && PyErr_Occurred()) {
            Py_DECREF(v);
            return -1;
        }
    }
    Py_DECREF(v);
    return 0;
}

static long long get_ll(PyObject *op, PyObject *attr, int *bad) {
    PyObject *v = PyObject_GetAttr(op, attr);
    if (v == NULL) {
        *bad = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) *bad = 1;
    return x;
}

static int args_read(OpArgs *a, PyObject *op) {
    memset(a, 0, sizeof(*a));
    a->kind_obj = PyObject_GetAttr(op, S_op);
    if (a->kind_obj == NULL) return -1;
    a->kind = PyUnicode_Check(a->kind_obj) ? classify(a->kind_obj) : K_OTHER;
    if (a->kind == K_OTHER) return 0;
    a->path_obj = PyObject_GetAttr(op, S_path);
    a->dest_obj = PyObject_GetAttr(op, S_dest);
    a->label_obj = PyObject_GetAttr(op, S_label);
    if (a->path_obj == NULL || a->dest_obj == NULL || a->label_obj == NULL) return -1;
    int bad = 0;
    a->size = get_ll(op, S_size, &bad);
    if (!bad) a->offset = get_ll(op, S_offset, &bad);
    if (bad) return -1;
    if (path_bytes(a->path_obj, &a->path, &a->plen, &a->tmp_path) < 0) return -1;
    if (a->kind == K_RENAME || a->kind == K_LINK)
        if (path_bytes(a->dest_obj, &a->dest, &a->dlen, &a->tmp_dest) < 0) return -1;
    if (a->kind == K_SETATTR
        && (get_optional(op, S_mode, &a->attrs.has_mode, &a->attrs.mode) < 0
            || get_optional(op, S_mtime_ns, &a->attrs.has_mtime, &a->attrs.mtime_ns) < 0))
        return -1;
    return 0;
}

/* The exception of an op that failed with ``rc`` (see ERR_*), as posix.py reports it. */
static void raise_rc(Exec *ex, int rc, PyObject *kind, PyObject *path) {
    if (rc == ERR_UNSAFE) raise_unsafe(ex);
    else if (rc == ERR_NOTREG) PyErr_Format(ex->failed_exc, "%R is not a regular file", path);
    else if (rc == ERR_NOMEM) PyErr_NoMemory();
    else if (is_nospace(ex->err)) {
        enum kind k = classify(kind);
        if ((k == K_CREATE || k == K_MKDIR) && ex->inode_check != NULL) {
            /* Out of inodes rather than blocks: the check raises its own error. */
            PyObject *r = PyObject_CallFunctionObjArgs(ex->inode_check, kind, path, NULL);
            if (r == NULL) return;
            Py_DECREF(r);
        }
        PyErr_Format(ex->nospace_exc, "%U %U: no space left", kind, path);
    }
    else PyErr_Format(ex->failed_exc, "%U %R: %s", kind, path, strerror(ex->err));
}

/* Run ``op`` on the calling thread; the bytes of file data written, or -1 with an exception
 * set. */
static long long apply_op(Exec *ex, PyObject *op, OpArgs *a) {
    ex->gen++; /* descriptors pinned by the last op are free to go */
    if (args_read(a, op) < 0) return -1;
    double t0 = now_s();
    if (a->kind == K_OTHER) {
        if (ex->fallback == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "executor not initialised");
            return -1;
        }
        PyObject *r = PyObject_CallOneArg(ex->fallback, op);
        ex->busy_main += now_s() - t0;
        if (r == NULL) return -1;
        long long n = PyLong_AsLongLong(r);
        Py_DECREF(r);
        return n;
    }
    int rc;
    /* Other Python threads (a replay's look-ahead) run during the system calls. */
    Py_BEGIN_ALLOW_THREADS
    rc = run_op(ex, a);
    Py_END_ALLOW_THREADS
    ex->busy_main += now_s() - t0;
    if (rc) {
        raise_rc(ex, rc, a->kind_obj, a->path_obj);
        return -1;
    }
    return op_result(a);
}

/* ------------------------------------------------------------------ the journal line */

/* Printable ASCII without quote or backslash: JSON writes it as is between quotes. */
static int plain(PyObject *s) {
    if (!PyUnicode_Check(s) || !PyUnicode_IS_ASCII(s)) return 0;
    const unsigned char *p = PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e || p[i] == '"' || p[i] == '\\') return 0;
    return 1;
}

static int append_str(char **w, char *end, const char *s, Py_ssize_t n) {
    if (end - *w < n) return -1;
    memcpy(*w, s, (size_t)n);
    *w += n;
    return 0;
}

/* ``op.to_json() + "\n"`` into buf when the op is plain (C kind, plain strings, no label);
 * its length, or -1 (not plain, or it does not fit). */
static Py_ssize_t format_line(OpArgs *a, char *buf, Py_ssize_t cap) {
    if (a->kind == K_OTHER || !plain(a->kind_obj) || !plain(a->path_obj) || !plain(a->dest_obj)
        || !PyUnicode_Check(a->label_obj) || PyUnicode_GET_LENGTH(a->label_obj) != 0)
        return -1;
    char *w = buf, *end = buf + cap;
    char num[48];
    const char *kind = KIND_NAMES[a->kind];
    if (append_str(&w, end, "{\"op\":\"", 7) || append_str(&w, end, kind, (Py_ssize_t)strlen(kind))
        || append_str(&w, end, "\"", 1))
        return -1;
    Py_ssize_t plen = PyUnicode_GET_LENGTH(a->path_obj);
    if (plen && (append_str(&w, end, ",\"path\":\"", 9)
                 || append_str(&w, end, PyUnicode_DATA(a->path_obj), plen)
                 || append_str(&w, end, "\"", 1)))
        return -1;
    if (a->size) {
        int n = snprintf(num, sizeof num, ",\"size\":%lld", a->size);
        if (append_str(&w, end, num, n)) return -1;
    }
    if (a->offset) {
        int n = snprintf(num, sizeof num, ",\"offset\":%lld", a->offset);
        if (append_str(&w, end, num, n)) return -1;
    }
    Py_ssize_t dlen = PyUnicode_GET_LENGTH(a->dest_obj);
    if (dlen && (append_str(&w, end, ",\"dest\":\"", 9)
                 || append_str(&w, end, PyUnicode_DATA(a->dest_obj), dlen)
                 || append_str(&w, end, "\"", 1)))
        return -1;
    if (a->attrs.has_mode) {
        int n = snprintf(num, sizeof num, ",\"mode\":%lld", a->attrs.mode);
        if (append_str(&w, end, num, n)) return -1;
    }
    if (a->attrs.has_mtime) {
        int n = snprintf(num, sizeof num, ",\"mtime_ns\":%lld", a->attrs.mtime_ns);
        if (append_str(&w, end, num, n)) return -1;
    }
    if (append_str(&w, end, "}\n", 2)) return -1;
    return w - buf;
}

/* write() all of buf; 0, or an errno. */
static int write_all(int fd, const char *buf, Py_ssize_t n) {
    Py_ssize_t done = 0;
    while (done < n) {
        long w = RETRY(write(fd, buf + done, (size_t)(n - done)));
        if (w <= 0) return w < 0 ? errno : ENOSPC;
        done += w;
    }
    return 0;
}

static void raise_journal(Exec *ex, PyObject *journal, int err) {
    PyObject *path = PyObject_GetAttrString(journal, "path");
    if (path == NULL) return;
    PyErr_Format(ex->fsage_exc, "cannot write the journal %S: %s", path, strerror(err));
    Py_DECREF(path);
}

static int journal_fd(PyObject *journal) {
    PyObject *fdo = PyObject_GetAttr(journal, S_fd);
    if (fdo == NULL) return -2;
    long fd = PyLong_AsLong(fdo);
    Py_DECREF(fdo);
    if (fd == -1 && PyErr_Occurred()) return -2;
    return (int)fd;
}

/* Append op's line to the journal (plain ops formatted here, others by journal.add). */
static int journal_write(Exec *ex, PyObject *journal, PyObject *op, OpArgs *a) {
    char buf[4096];
    Py_ssize_t n = format_line(a, buf, sizeof buf);
    if (n < 0) {
        PyObject *r = PyObject_CallMethodOneArg(journal, S_add, op);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    int fd = journal_fd(journal);
    if (fd == -2) return -1;
    int err = write_all(fd, buf, n);
    if (err) {
        raise_journal(ex, journal, err);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ running ahead */

/* The worker thread runs queued ops in order, without the GIL, while the caller goes on
 * generating. Only plain ops whose worst-case use of space and inodes fits in the budget
 * the caller set from its last statvfs are queued (an op that could run out of space runs on
 * the calling thread, after the queue is drained, so the generator hears of it at once).
 * The first op that fails stops the queue: it and every op queued after it are not run, and
 * drain() raises its error as InFlightError (lost_ops, lost_bytes: what the caller counted
 * for them). */

static void slot_clear(Slot *sl) {
    Py_CLEAR(sl->op);
}

/* Wait, without the GIL, until the worker has finished ``target`` ops. The counters are
 * atomics (no lock per op); the mutex and condition variables only put a thread to sleep and
 * wake it: each side publishes its flag (idle, waiting) before it checks the other's counter,
 * so a wake-up is never lost. */
static void wait_done(Exec *ex, uint64_t target) {
    if (atomic_load(&ex->completed) >= target) return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&ex->mu);
    atomic_store(&ex->waiting, 1);
    if (atomic_load(&ex->idle)) pthread_cond_signal(&ex->cv_work);
    while (atomic_load(&ex->completed) < target) pthread_cond_wait(&ex->cv_done, &ex->mu);
    atomic_store(&ex->waiting, 0);
    pthread_mutex_unlock(&ex->mu);
    Py_END_ALLOW_THREADS
}

static void wait_idle(Exec *ex) {
    if (ex->running) wait_done(ex, atomic_load(&ex->submitted));
}

static void *worker_main(void *arg) {
    Exec *ex = arg;
    for (;;) {
        uint64_t c = atomic_load_explicit(&ex->completed, memory_order_relaxed);
        if (atomic_load(&ex->submitted) == c) {
            if (atomic_load(&ex->stopping)) break;
            pthread_mutex_lock(&ex->mu);
            atomic_store(&ex->idle, 1);
            while (atomic_load(&ex->submitted) == c && !atomic_load(&ex->stopping))
                pthread_cond_wait(&ex->cv_work, &ex->mu);
            atomic_store(&ex->idle, 0);
            pthread_mutex_unlock(&ex->mu);
            continue;
        }
        Slot *sl = &ex->ring[c % RING];
        int rc = 0, err = 0;
        double t0 = now_s();
        if (!atomic_load_explicit(&ex->failed, memory_order_relaxed)) {
            OpArgs a;
            memset(&a, 0, sizeof a);
            a.kind = sl->kind;
            a.path = sl->buf;
            a.plen = sl->plen;
            a.dest = sl->buf + sl->plen + 1;
            a.dlen = sl->dlen;
            a.size = sl->size;
            a.offset = sl->offset;
            a.attrs = sl->attrs;
            ex->gen++;
            rc = run_op(ex, &a);
            err = ex->err;
            if (rc == 0) {
                err = write_all(sl->jfd, sl->buf + sl->plen + sl->dlen + 2, sl->llen);
                if (err) rc = ERR_JOURNAL;
            }
            if (rc) {
                ex->failed_slot = (int)(c % RING);
                ex->failed_rc = rc;
                ex->failed_err = err;
                atomic_store(&ex->failed, 1);
            }
        }
        ex->busy_worker += now_s() - t0;
        if (atomic_load_explicit(&ex->failed, memory_order_relaxed)) {
            ex->lost_ops++;
            ex->lost_bytes += sl->bytes;
        }
        atomic_store(&ex->completed, c + 1);
        if (atomic_load(&ex->waiting)) {
            pthread_mutex_lock(&ex->mu);
            pthread_cond_signal(&ex->cv_done);
            pthread_mutex_unlock(&ex->mu);
        }
    }
    return NULL;
}

/* After the queue is idle: release the queued ops and raise the first failure, if any. */
static int settle(Exec *ex) {
    int rc = 0;
    if (ex->failed) {
        Slot *sl = &ex->ring[ex->failed_slot];
        PyObject *kind = PyObject_GetAttr(sl->op, S_op);
        PyObject *path = kind ? PyObject_GetAttr(sl->op, S_path) : NULL;
        PyObject *jpath = NULL;
        if (path != NULL) {
            ex->err = ex->failed_err;
            if (ex->failed_rc == ERR_JOURNAL) {
                jpath = PyObject_GetAttrString(ex->journal, "path");
                if (jpath != NULL)
                    PyErr_Format(ex->fsage_exc, "cannot write the journal %S: %s", jpath,
                                 strerror(ex->failed_err));
            } else {
                raise_rc(ex, ex->failed_rc, kind, path);
            }
        }
        Py_XDECREF(kind);
        Py_XDECREF(path);
        Py_XDECREF(jpath);
        /* The same message, as InFlightError carrying what was not run. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *msg = value ? PyObject_Str(value) : NULL;
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (msg != NULL) {
            PyObject *exc = PyObject_CallOneArg(ex->inflight_exc, msg);
            Py_DECREF(msg);
            if (exc != NULL) {
                PyObject *lo = PyLong_FromUnsignedLongLong(ex->lost_ops);
                PyObject *lb = PyLong_FromLongLong(ex->lost_bytes);
                if (lo && lb) {
                    PyObject_SetAttrString(exc, "lost_ops", lo);
                    PyObject_SetAttrString(exc, "lost_bytes", lb);
                }
                Py_XDECREF(lo);
                Py_XDECREF(lb);
                PyErr_SetObject(ex->inflight_exc, exc);
                Py_DECREF(exc);
            }
        }
        atomic_store(&ex->failed, 0);
        ex->lost_ops = 0;
        ex->lost_bytes = 0;
        rc = -1;
    }
    for (int i = 0; i < RING; i++) slot_clear(&ex->ring[i]);
    return rc;
}

static int drain(Exec *ex) {
    if (!ex->running) return 0;
    wait_idle(ex);
    return settle(ex);
}

static PyObject *Exec_drain(Exec *ex, PyObject *Py_UNUSED(ignored)) {
    if (drain(ex) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Exec_start(Exec *ex, PyObject *journal) {
    if (ex->running) {
        if (drain(ex) < 0) return NULL;
    } else {
        atomic_store(&ex->stopping, 0);
        atomic_store(&ex->submitted, 0);
        atomic_store(&ex->completed, 0);
        /* Signals (Ctrl-C) go to the calling thread, which Python handles them on: the
         * worker starts with all of them blocked. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        int e = pthread_create(&ex->thread, NULL, worker_main, ex);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e) {
            errno = e;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        ex->running = 1;
    }
    Py_INCREF(journal);
    Py_XSETREF(ex->journal, journal);
    Py_RETURN_NONE;
}

/* Stop the worker after the ops queued (errors are dropped: see drain). */
static void stop_worker(Exec *ex) {
    if (!ex->running) return;
    pthread_mutex_lock(&ex->mu);
    atomic_store(&ex->stopping, 1);
    pthread_cond_signal(&ex->cv_work);
    pthread_mutex_unlock(&ex->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(ex->thread, NULL);
    Py_END_ALLOW_THREADS
    ex->running = 0;
    atomic_store(&ex->failed, 0);
    ex->lost_ops = 0;
    ex->lost_bytes = 0;
    for (int i = 0; i < RING; i++) slot_clear(&ex->ring[i]);
}

static PyObject *Exec_stop(Exec *ex, PyObject *Py_UNUSED(ignored)) {
    stop_worker(ex);
    Py_RETURN_NONE;
}

static PyObject *Exec_set_budget(Exec *ex, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_budget(bytes, inodes)");
        return NULL;
    }
    long long b = PyLong_AsLongLong(args[0]), i = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    ex->budget_bytes = b;
    ex->budget_inodes = i;
    Py_RETURN_NONE;
}

/* The most space an op can take: its data rounded up to 4 KiB blocks, plus metadata. */
static long long op_cost(OpArgs *a) {
    long long data = 0;
    if (a->kind == K_CREATE || a->kind == K_APPEND || a->kind == K_OVERWRITE
        || a->kind == K_FALLOCATE)
        data = (a->size + 4095) / 4096 * 4096;
    return data + METADATA_COST;
}

/* Queue ``op`` (or, when it cannot run ahead, drain the queue and run it here); returns the
 * bytes of file data it writes, as apply does. */
static PyObject *Exec_submit(Exec *ex, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "submit(journal, op)");
        return NULL;
    }
    PyObject *journal = args[0], *op = args[1];
    OpArgs a;
    PyObject *res = NULL;
    if (args_read(&a, op) < 0) goto done;
    char line[4096];
    Py_ssize_t llen = ex->running ? format_line(&a, line, sizeof line) : -1;
    long long cost = llen >= 0 ? op_cost(&a) : 0;
    long long inodes = a.kind == K_CREATE || a.kind == K_MKDIR;
    if (llen < 0 || cost > ex->budget_bytes || inodes > ex->budget_inodes) {
        args_release(&a);
        if (drain(ex) < 0) return NULL;
        long long n = apply_op(ex, op, &a);
        if (!(n == -1 && PyErr_Occurred()) && journal_write(ex, journal, op, &a) == 0)
            res = PyLong_FromLongLong(n);
        goto done;
    }
    int jfd = journal_fd(journal);
    if (jfd == -2) goto done;
    uint64_t sub = atomic_load_explicit(&ex->submitted, memory_order_relaxed);
    if (sub - atomic_load(&ex->completed) >= RING) wait_done(ex, sub - RING + 1);
    if (atomic_load(&ex->failed)) { /* nothing more runs: report it */
        if (drain(ex) < 0) goto done;
        sub = atomic_load_explicit(&ex->submitted, memory_order_relaxed);
    }
    Slot *sl = &ex->ring[sub % RING];
    /* The slot's previous op is finished: the worker no longer reads it. */
    size_t need = (size_t)(a.plen + a.dlen + 2 + llen);
    if (need > sl->cap) {
        char *nb = realloc(sl->buf, need);
        if (nb == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        sl->buf = nb;
        sl->cap = need;
    }
    memcpy(sl->buf, a.path, (size_t)a.plen);
    sl->buf[a.plen] = '\0';
    if (a.dlen) memcpy(sl->buf + a.plen + 1, a.dest, (size_t)a.dlen);
    sl->buf[a.plen + 1 + a.dlen] = '\0';
    memcpy(sl->buf + a.plen + a.dlen + 2, line, (size_t)llen);
    sl->plen = a.plen;
    sl->dlen = a.dlen;
    sl->llen = llen;
    sl->kind = a.kind;
    sl->size = a.size;
    sl->offset = a.offset;
    sl->attrs = a.attrs;
    sl->jfd = jfd;
    sl->bytes = op_result(&a);
    Py_INCREF(op);
    Py_XSETREF(sl->op, op);
    ex->budget_bytes -= cost;
    ex->budget_inodes -= inodes;
    atomic_store(&ex->submitted, sub + 1);
    if (atomic_load(&ex->idle) && sub + 1 - atomic_load(&ex->completed) >= WAKE_AT) {
        pthread_mutex_lock(&ex->mu);
        pthread_cond_signal(&ex->cv_work);
        pthread_mutex_unlock(&ex->mu);
    }
    res = PyLong_FromLongLong(sl->bytes);
done:
    args_release(&a);
    return res;
}

static PyObject *Exec_apply(Exec *ex, PyObject *op) {
    if (drain(ex) < 0) return NULL;
    OpArgs a;
    long long n = apply_op(ex, op, &a);
    args_release(&a);
    if (n == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(n);
}

static PyObject *Exec_apply_logged(Exec *ex, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "apply_logged(journal, op)");
        return NULL;
    }
    if (drain(ex) < 0) return NULL;
    OpArgs a;
    long long n = apply_op(ex, args[1], &a);
    PyObject *res = NULL;
    if (!(n == -1 && PyErr_Occurred()) && journal_write(ex, args[0], args[1], &a) == 0)
        res = PyLong_FromLongLong(n);
    args_release(&a);
    return res;
}

/* ------------------------------------------------------------------ the cache from Python */

static PyObject *Exec_dir_fd(Exec *ex, PyObject *arg) {
    const char *p;
    Py_ssize_t n;
    PyObject *tmp = NULL;
    wait_idle(ex);
    if (path_bytes(arg, &p, &n, &tmp) < 0) return NULL;
    int fd = -1;
    int rc = dir_fd(ex, p, n, &fd);
    Py_XDECREF(tmp);
    if (rc == ERR_ERRNO) {
        errno = ex->err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (rc == ERR_UNSAFE) raise_unsafe(ex);
    else if (rc) PyErr_NoMemory();
    if (rc) return NULL;
    return PyLong_FromLong(fd);
}

static PyObject *Exec_forget(Exec *ex, PyObject *arg) {
    const char *p;
    Py_ssize_t n;
    PyObject *tmp = NULL;
    wait_idle(ex);
    if (path_bytes(arg, &p, &n, &tmp) < 0) return NULL;
    forget(ex, p, n);
    Py_XDECREF(tmp);
    Py_RETURN_NONE;
}

static PyObject *Exec_cached(Exec *ex, PyObject *Py_UNUSED(ignored)) {
    wait_idle(ex);
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (int e = ex->lru; e >= 0; e = ex->ents[e].next) {
        PyObject *s = PyUnicode_DecodeFSDefaultAndSize(ex->ents[e].key, ex->ents[e].len);
        if (s == NULL || PyList_Append(out, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(s);
    }
    return out;
}

static PyObject *Exec_drop(Exec *ex, PyObject *Py_UNUSED(ignored)) {
    wait_idle(ex);
    drop_all(ex);
    Py_RETURN_NONE;
}

static PyObject *Exec_get_busy(Exec *ex, void *Py_UNUSED(closure)) {
    wait_idle(ex);
    return PyFloat_FromDouble(ex->busy_main + ex->busy_worker);
}

/* ------------------------------------------------------------------ the type */

static int Exec_init(Exec *ex, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"root_fd", "data",   "allocate_only", "fsync", "max_fds",
                         "fallback", "errors", "inode_check",   NULL};
    int root_fd, allocate_only, do_fsync, max_fds;
    PyObject *data, *fallback, *errors, *inode_check = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iO!ppiOO!|O", kw, &root_fd, &PyBytes_Type,
                                     &data, &allocate_only, &do_fsync, &max_fds, &fallback,
                                     &PyTuple_Type, &errors, &inode_check))
        return -1;
    if (PyBytes_GET_SIZE(data) < CHUNK) {
        PyErr_SetString(PyExc_ValueError, "data must hold at least 1 MiB");
        return -1;
    }
    if (PyTuple_GET_SIZE(errors) != 5) {
        PyErr_SetString(PyExc_ValueError, "errors: (NoSpaceError, OpFailedError, "
                                          "UnsafeTargetError, FsageError, InFlightError)");
        return -1;
    }
    if (ex->running) {
        PyErr_SetString(PyExc_RuntimeError, "executor already running");
        return -1;
    }
    if (max_fds < 1) max_fds = 1;
    drop_all(ex);
    if (ex->table == NULL && reserve(ex) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    ex->root_fd = root_fd;
    ex->allocate_only = allocate_only;
    ex->fsync = do_fsync;
    ex->max_fds = max_fds;
    Py_INCREF(data);
    Py_XSETREF(ex->data, data);
    Py_INCREF(fallback);
    Py_XSETREF(ex->fallback, fallback);
    Py_XINCREF(inode_check);
    Py_XSETREF(ex->inode_check, inode_check);
    PyObject **slots[] = {&ex->nospace_exc, &ex->failed_exc, &ex->unsafe_exc, &ex->fsage_exc,
                          &ex->inflight_exc};
    for (int i = 0; i < 5; i++) {
        PyObject *c = PyTuple_GET_ITEM(errors, i);
        Py_INCREF(c);
        Py_XSETREF(*slots[i], c);
    }
    return 0;
}

static PyObject *Exec_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Exec *ex = (Exec *)type->tp_alloc(type, 0);
    if (ex == NULL) return NULL;
    ex->root_fd = -1;
    ex->free_head = ex->lru = ex->mru = -1;
    pthread_mutex_init(&ex->mu, NULL);
    pthread_cond_init(&ex->cv_work, NULL);
    pthread_cond_init(&ex->cv_done, NULL);
    return (PyObject *)ex;
}

static int Exec_traverse(Exec *ex, visitproc visit, void *arg) {
    Py_VISIT(ex->fallback);
    Py_VISIT(ex->inode_check);
    Py_VISIT(ex->journal);
    return 0;
}

static int Exec_clear(Exec *ex) {
    Py_CLEAR(ex->fallback);
    Py_CLEAR(ex->inode_check);
    Py_CLEAR(ex->journal);
    return 0;
}

static void Exec_dealloc(Exec *ex) {
    PyObject_GC_UnTrack(ex);
    stop_worker(ex);
    for (int i = 0; i < RING; i++) free(ex->ring[i].buf);
    undo_buf_free(&ex->undo);
    if (ex->ents != NULL) drop_all(ex);
    free(ex->ents);
    free(ex->table);
    free(ex->bad_key);
    Exec_clear(ex);
    Py_XDECREF(ex->data);
    Py_XDECREF(ex->nospace_exc);
    Py_XDECREF(ex->failed_exc);
    Py_XDECREF(ex->unsafe_exc);
    Py_XDECREF(ex->fsage_exc);
    Py_XDECREF(ex->inflight_exc);
    pthread_mutex_destroy(&ex->mu);
    pthread_cond_destroy(&ex->cv_work);
    pthread_cond_destroy(&ex->cv_done);
    Py_TYPE(ex)->tp_free((PyObject *)ex);
}

static PyMethodDef Exec_methods[] = {
    {"apply", (PyCFunction)Exec_apply, METH_O, "Run one op; the bytes of file data written."},
    {"apply_logged", (PyCFunction)(void (*)(void))Exec_apply_logged, METH_FASTCALL,
     "apply_logged(journal, op): run the op, then append its line to the journal."},
    {"start", (PyCFunction)Exec_start, METH_O,
     "start(journal): start the worker that runs submitted ops ahead."},
    {"submit", (PyCFunction)(void (*)(void))Exec_submit, METH_FASTCALL,
     "submit(journal, op): queue the op for the worker (or run it here); its bytes."},
    {"drain", (PyCFunction)Exec_drain, METH_NOARGS,
     "Wait for the queued ops; raise the first failure as InFlightError."},
    {"stop", (PyCFunction)Exec_stop, METH_NOARGS, "Run what is queued, then stop the worker."},
    {"set_budget", (PyCFunction)(void (*)(void))Exec_set_budget, METH_FASTCALL,
     "set_budget(bytes, inodes): what queued ops may use before ops run here."},
    {"dir_fd", (PyCFunction)Exec_dir_fd, METH_O,
     "Descriptor of a directory (relative path), cached and pinned for the current op."},
    {"forget", (PyCFunction)Exec_forget, METH_O,
     "Close the cached descriptors of a directory and of everything below it."},
    {"cached", (PyCFunction)Exec_cached, METH_NOARGS,
     "The cached directories, least recently used first."},
    {"drop", (PyCFunction)Exec_drop, METH_NOARGS, "Close every cached descriptor."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Exec_getset[] = {
    {"busy_s", (getter)Exec_get_busy, NULL, "Seconds spent running ops (waits for the queue).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ExecType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fsage._posixexec.Executor",
    .tp_basicsize = sizeof(Exec),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Runs ops below a directory descriptor (see fsage/_posixexec.c).",
    .tp_new = Exec_new,
    .tp_init = (initproc)Exec_init,
    .tp_dealloc = (destructor)Exec_dealloc,
    .tp_traverse = (traverseproc)Exec_traverse,
    .tp_clear = (inquiry)Exec_clear,
    .tp_methods = Exec_methods,
    .tp_getset = Exec_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fsage._posixexec",
    "The mounted-directory executor's ops in C (see fsage/ager/posix.py).", -1, NULL};

PyMODINIT_FUNC PyInit__posixexec(void) {
    const char *names[] = {"op", "path", "dest", "size", "offset", "label", "fd", "add", "mode",
                           "mtime_ns"};
    PyObject **slots[] = {&S_op,    &S_path, &S_dest, &S_size, &S_offset,
                          &S_label, &S_fd,   &S_add,  &S_mode, &S_mtime_ns};
    for (int i = 0; i < 10; i++) {
        *slots[i] = PyUnicode_InternFromString(names[i]);
        if (*slots[i] == NULL) return NULL;
    }
    if (PyType_Ready(&ExecType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ExecType);
    if (PyModule_AddObject(m, "Executor", (PyObject *)&ExecType) < 0) {
        Py_DECREF(&ExecType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "RING", RING) < 0
        || PyModule_AddIntConstant(m, "METADATA_COST", METADATA_COST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
