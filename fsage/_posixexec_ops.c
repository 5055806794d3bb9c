/*
 * One op of the executor (fsage._posixexec) as system calls relative to directory descriptors,
 * without the GIL: the file data ops, names (mkdir, delete, rename, link) and setattr. An op
 * that fails leaves the target as it was (see _posixexec.c).
 */
#include "_posixexec.h"

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

int run_op(Exec *ex, OpArgs *a) {
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

long long op_result(OpArgs *a) {
    switch (a->kind) {
    case K_CREATE:
    case K_APPEND:
    case K_OVERWRITE:
        return a->size;
    default:
        return 0;
    }
}
