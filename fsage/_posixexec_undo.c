/*
 * The undo of a failed overwrite: see _posixexec_undo.h. Runs without the GIL (on the
 * executor's worker thread too): system calls and memory only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "_posixexec_sys.h"
#include "_posixexec_undo.h"


/* Old bytes of an overwrite up to this size go to the UndoBuf, kept for the next; larger ones
 * to anonymous memory of their own (touched only where the range holds data). */
#define SAVE_KEEP ((size_t)64 << 20)

void undo_buf_free(UndoBuf *ub) {
    free(ub->buf);
    ub->buf = NULL;
    ub->cap = 0;
}

void undo_free(Saved *sv) {
    if (sv->buf != NULL && sv->own) munmap(sv->buf, (size_t)(sv->hi - sv->lo));
    free(sv->data);
    if (sv->clone_fd >= 0) close(sv->clone_fd);
    sv->buf = NULL;
    sv->data = NULL;
    sv->clone_fd = -1;
}

#define BTRFS_MAGIC 0x9123683E

/* On btrfs a rewrite of the old bytes is copy-on-write too, and a full file system has no
 * room for it: the range's old extents are shared with an unnamed file in the directory
 * instead (a clone takes no data space), and cloned back on failure. Not elsewhere: on xfs a
 * shared extent would turn the overwrite itself into copy-on-write, changing the layout. */
static int save_clone(int dfd, int fd, long long lo, long long hi, long long size, Saved *sv) {
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0 || (unsigned long)sf.f_type != BTRFS_MAGIC) return 0;
    long long bs = sf.f_bsize > 0 ? sf.f_bsize : 4096;
    long long alo = lo / bs * bs, ahi = (hi + bs - 1) / bs * bs;
    int t = (int)RETRY(openat(dfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (t < 0) return 0;
    struct file_clone_range r = {.src_fd = fd,
                                 .src_offset = (unsigned long long)alo,
                                 .src_length = ahi >= size ? 0 : (unsigned long long)(ahi - alo),
                                 .dest_offset = (unsigned long long)alo};
    if (ioctl(t, FICLONERANGE, &r) != 0) {
        close(t);
        return 0;
    }
    sv->clone_fd = t;
    sv->back = r;
    sv->back.src_fd = t;
    return 1;
}

/* Whether an overwrite of [lo, hi) could run out of space half way: on btrfs always
 * (copy-on-write), elsewhere when the free space is within twice the range, a sixteenth of
 * the file system and 64 MiB of the end (an overwrite in place of written blocks needs no
 * new ones; holes, unwritten extents and metadata may). Far from full the old bytes are not
 * read: that would cost each overwrite a read of its range. */
static int may_run_out(int fd, long long lo, long long hi, long long *block) {
    struct statfs sf;
    *block = 4096;
    if (fstatfs(fd, &sf) != 0) return 1;
    long long bs = sf.f_frsize > 0 ? sf.f_frsize : sf.f_bsize;
    if (bs > 0) *block = bs;
    if ((unsigned long)sf.f_type == BTRFS_MAGIC) return 1;
    long long avail = (long long)sf.f_bavail * bs, total = (long long)sf.f_blocks * bs;
    return avail < 2 * (hi - lo) + total / 16 + (64LL << 20);
}

int undo_save(UndoBuf *ub, int dfd, int fd, long long lo, long long hi, long long size,
              Saved *sv) {
    memset(sv, 0, sizeof *sv);
    sv->clone_fd = -1;
    sv->lo = lo;
    sv->hi = hi;
    sv->size = size;
    long long bs;
    if (hi <= lo || !may_run_out(fd, lo, hi, &bs)) {
        sv->hi = sv->lo; /* nothing kept: nothing to put back */
        return 0;
    }
    /* Whole blocks: a block the overwrite fills in part, in a hole, is punched whole again. */
    lo = lo / bs * bs;
    hi = (hi + bs - 1) / bs * bs < size ? (hi + bs - 1) / bs * bs : size;
    sv->lo = lo;
    sv->hi = hi;
    if (save_clone(dfd, fd, lo, hi, size, sv)) return 0;
    size_t need = (size_t)(hi - lo);
    if (need <= SAVE_KEEP) {
        if (ub->cap < need) {
            free(ub->buf);
            ub->cap = 0;
            ub->buf = malloc(need);
            if (ub->buf == NULL) return ENOMEM;
            ub->cap = need;
        }
        sv->buf = ub->buf;
    } else {
        void *m = mmap(NULL, need, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return ENOMEM;
        sv->buf = m;
        sv->own = 1;
    }
    long long pos = lo;
    while (pos < hi) {
        off_t d = lseek(fd, pos, SEEK_DATA), h;
        if (d < 0 && errno == ENXIO) break; /* only a hole from here on */
        if (d < 0) d = pos;                 /* no SEEK_DATA here: all of it is data */
        if (d >= hi) break;
        h = lseek(fd, d, SEEK_HOLE);
        if (h < 0 || h > hi) h = hi;
        if (sv->ndata == sv->cap) {
            int cap = sv->cap ? 2 * sv->cap : 8;
            void *n = realloc(sv->data, (size_t)cap * sizeof *sv->data);
            if (n == NULL) return ENOMEM;
            sv->data = n;
            sv->cap = cap;
        }
        sv->data[sv->ndata][0] = d;
        sv->data[sv->ndata][1] = h;
        sv->ndata++;
        for (long long at = d; at < h;) {
            long r = RETRY(pread(fd, sv->buf + (at - lo), (size_t)(h - at), at));
            if (r < 0) return errno;
            if (r == 0) break; /* cannot be: [lo, hi) is inside the file */
            at += r;
        }
        pos = h;
    }
    return 0;
}

/* Put back what ``undo_save`` kept: the holes first (they give back what the overwrite
 * took of the free space), then the data, in place. ``whole``: the data's range is punched
 * too before it is written again, which drops what the failed overwrite still holds of the
 * free space (its dirty pages' reservation on btrfs), at the cost of new blocks. */
static int restore_once(int fd, const Saved *sv, int whole) {
    long long pos = sv->lo;
    int err = 0;
    for (int i = 0; i <= sv->ndata; i++) {
        long long end = i < sv->ndata && !whole ? sv->data[i][0] : sv->hi;
        if (end > pos &&
            RETRY(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, pos, end - pos)) != 0 &&
            errno != EOPNOTSUPP && !err)
            err = errno;
        if (whole) break;
        if (i < sv->ndata) pos = sv->data[i][1];
    }
    for (int i = 0; i < sv->ndata; i++)
        for (long long at = sv->data[i][0]; at < sv->data[i][1];) {
            long w = RETRY(pwrite(fd, sv->buf + (at - sv->lo), (size_t)(sv->data[i][1] - at), at));
            if (w <= 0) {
                if (!err) err = w < 0 ? errno : ENOSPC;
                break;
            }
            at += w;
        }
    return err;
}

/* What the overwrite added past the old end goes first (its room freed; and a clone may not
 * put an unaligned end-of-file block in the middle of a file); then the range, from the
 * clone, or in place first and, where copy-on-write needs room the failed overwrite holds,
 * whole. */
int undo_restore(int fd, const Saved *sv) {
    struct stat st;
    if (sv->hi <= sv->lo) return 0;
    if (fstat(fd, &st) == 0 && st.st_size > sv->size && RETRY(ftruncate(fd, sv->size)) != 0)
        return errno;
    if (sv->clone_fd >= 0) return ioctl(fd, FICLONERANGE, &sv->back) == 0 ? 0 : errno;
    int err = restore_once(fd, sv, 0);
    if (is_nospace(err)) err = restore_once(fd, sv, 1);
    return err;
}

