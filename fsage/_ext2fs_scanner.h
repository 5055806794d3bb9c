/* Internal declarations of the read-only scanner of fsage._ext2fs (the Scanner type), shared by
 * its sources:
 *
 *   _ext2fs.c          the module, errors, column buffers, the Scanner object and its handles
 *   _ext2fs_inodes.c   scan(): the inode scan over threads, extents, block maps, checksums
 *   _ext2fs_dirs.c     links(): the directory pass
 *   _ext2fs_facts.c    facts() and free_extents(): superblock, groups, the block bitmap
 *
 * Not part of any interface: the functions here are hidden inside the module. */
#ifndef FSAGE_EXT2FS_SCANNER_H
#define FSAGE_EXT2FS_SCANNER_H

#include "_ext2fs.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SCANNER_INTERNAL __attribute__((visibility("hidden")))

/* ---------- growable column buffers ---------- */

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

/* Make room for `more` bytes past len; 0, or -1 out of memory. */
SCANNER_INTERNAL int buf_grow(Buf *b, size_t more);

static inline int buf_reserve(Buf *b, size_t more) {
    if (__builtin_expect(b->len + more <= b->cap, 1))
        return 0;
    return buf_grow(b, more);
}

static inline int buf_put(Buf *b, const void *v, size_t n) {
    if (buf_reserve(b, n))
        return -1;
    memcpy(b->data + b->len, v, n);
    b->len += n;
    return 0;
}

#define PUT(b, type, value)                                                                        \
    do {                                                                                           \
        type _v = (type)(value);                                                                   \
        if (buf_put((b), &_v, sizeof _v))                                                          \
            goto nomem;                                                                            \
    } while (0)

SCANNER_INTERNAL void buf_free(Buf *b);
SCANNER_INTERNAL PyObject *buf_bytes(Buf *b);
/* A column as a bytearray: numpy views it writable, so Python needs no copy of its own. */
SCANNER_INTERNAL PyObject *buf_column(Buf *b);

/* ---------- the scanner object ---------- */

#define MAX_JOBS 8 /* threads of the inode scan and the directory pass */

typedef struct {
    PyObject_HEAD ext2_filsys fs;
    char *path;
    ext2_filsys helpers[MAX_JOBS - 1]; /* more handles for the other threads, opened on demand */
    int scan_done;
    Buf dirs; /* u64 inode numbers of directories seen, for the directory pass */
    long io_errors; /* reads the device refused (EIO, a short read), over all handles */
} Scanner;

/* The handle of job k (0: the scanner's own), opening more handles on the file system as
 * needed (a handle is not safe to share between threads). */
SCANNER_INTERNAL errcode_t job_handle(Scanner *self, int k, ext2_filsys *out);
/* Run fn(job) for jobs 1..n-1 on threads and job 0 here; wait for all. */
SCANNER_INTERNAL void run_jobs(void *(*fn)(void *), void *jobs, size_t job_size, int n);
/* Every job's part of one column, joined in job order: a bytearray (numeric columns, viewed
 * by numpy) or, with as_bytes, a bytes object (names). */
SCANNER_INTERNAL PyObject *join_parts(Buf *const *parts, int n, int as_bytes);

/* The Scanner's methods, each in the file of its part. */
SCANNER_INTERNAL PyObject *scanner_scan(Scanner *self, PyObject *args);
SCANNER_INTERNAL PyObject *scanner_links(Scanner *self, PyObject *args);
SCANNER_INTERNAL PyObject *scanner_facts(Scanner *self, PyObject *noargs);
SCANNER_INTERNAL PyObject *scanner_free_extents(Scanner *self, PyObject *noargs);

#endif
