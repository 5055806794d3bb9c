/*
 * Internal declarations of fsage._posixexec (the mounted-directory executor's ops), shared by
 * its sources:
 *
 *   _posixexec.c         the Python module: the Executor type, apply, the cache from Python
 *   _posixexec_dirs.c    the cache of directory descriptors and the walk of a path to them
 *   _posixexec_ops.c     one op as system calls (file data, names, attributes)
 *   _posixexec_args.c    an Op read from Python, its error raised, its journal line
 *   _posixexec_worker.c  running ahead: the worker thread and its queue of ops
 *   _posixexec_undo.c    the undo of a failed overwrite (_posixexec_undo.h)
 *
 * Not part of any interface: everything declared here is hidden inside the module.
 */
#ifndef FSAGE_POSIXEXEC_H
#define FSAGE_POSIXEXEC_H

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

#include "_posixexec_sys.h"
#include "_posixexec_undo.h"


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
    /* running ahead (_posixexec_worker.c); the counters under mu */
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

typedef struct {
    enum kind kind;
    PyObject *kind_obj, *path_obj, *dest_obj, *label_obj;
    const char *path, *dest;
    Py_ssize_t plen, dlen;
    long long size, offset;
    struct attrs attrs;
    PyObject *tmp_path, *tmp_dest; /* encoded non-ASCII paths */
} OpArgs;

#define POSIXEXEC_INTERNAL __attribute__((visibility("hidden")))

/* The kinds' names, as an Op's ``op`` field spells them (_posixexec_args.c). */
POSIXEXEC_INTERNAL extern const char *const KIND_NAMES[K_OTHER];

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Interned attribute names of an Op (and of a journal), set by PyInit__posixexec. */
POSIXEXEC_INTERNAL extern PyObject *S_op, *S_path, *S_dest, *S_size, *S_offset, *S_label, *S_fd,
    *S_add, *S_mode, *S_mtime_ns;

/* _posixexec_dirs.c */
POSIXEXEC_INTERNAL int reserve(Exec *ex);
POSIXEXEC_INTERNAL void drop_all(Exec *ex);
POSIXEXEC_INTERNAL void forget(Exec *ex, const char *path, Py_ssize_t len);
POSIXEXEC_INTERNAL void raise_unsafe(Exec *ex);
POSIXEXEC_INTERNAL int dir_fd(Exec *ex, const char *key, Py_ssize_t len, int *out);
POSIXEXEC_INTERNAL int split(Exec *ex, const char *path, Py_ssize_t len, int *dfd,
                             const char **name);

/* _posixexec_ops.c (runs without the GIL) */
POSIXEXEC_INTERNAL int run_op(Exec *ex, OpArgs *a);
POSIXEXEC_INTERNAL long long op_result(OpArgs *a);

/* _posixexec_args.c */
POSIXEXEC_INTERNAL int path_bytes(PyObject *s, const char **p, Py_ssize_t *n, PyObject **tmp);
POSIXEXEC_INTERNAL int args_read(OpArgs *a, PyObject *op);
POSIXEXEC_INTERNAL void args_release(OpArgs *a);
POSIXEXEC_INTERNAL void raise_rc(Exec *ex, int rc, PyObject *kind, PyObject *path);
POSIXEXEC_INTERNAL long long apply_op(Exec *ex, PyObject *op, OpArgs *a);
POSIXEXEC_INTERNAL Py_ssize_t format_line(OpArgs *a, char *buf, Py_ssize_t cap);
POSIXEXEC_INTERNAL int write_all(int fd, const char *buf, Py_ssize_t n);
POSIXEXEC_INTERNAL int journal_fd(PyObject *journal);
POSIXEXEC_INTERNAL int journal_write(Exec *ex, PyObject *journal, PyObject *op, OpArgs *a);

/* _posixexec_worker.c */
POSIXEXEC_INTERNAL void wait_idle(Exec *ex);
POSIXEXEC_INTERNAL int drain(Exec *ex);
POSIXEXEC_INTERNAL void stop_worker(Exec *ex);
POSIXEXEC_INTERNAL PyObject *Exec_drain(Exec *ex, PyObject *ignored);
POSIXEXEC_INTERNAL PyObject *Exec_start(Exec *ex, PyObject *journal);
POSIXEXEC_INTERNAL PyObject *Exec_stop(Exec *ex, PyObject *ignored);
POSIXEXEC_INTERNAL PyObject *Exec_set_budget(Exec *ex, PyObject *const *args, Py_ssize_t nargs);
POSIXEXEC_INTERNAL PyObject *Exec_submit(Exec *ex, PyObject *const *args, Py_ssize_t nargs);

#endif
