/*
 * fsage._live: reading one directory of the walk (see _live.c for the whole): open and check
 * it, list it with getdents64, and record each entry (openat + statx + FS_IOC_GETVERSION +
 * FS_IOC_GETFLAGS + FS_IOC_FIEMAP for a regular file, statx for anything else);
 * subdirectories are handed back to the worker (_live_workers.c) as tasks.
 */
#include "_live.h"

static void note(walker_t *w, pathlist_t *l, const char *rel, size_t rlen, const char *name,
                 int err) {
    /* Append rel (+ "/" + name) with err to l. */
    w->scratch.len = 0;
    if (buf_put(&w->scratch, rel, rlen) ||
        (name && (buf_put(&w->scratch, "/", 1) || buf_put(&w->scratch, name, strlen(name)))) ||
        pathlist_add(l, w->scratch.p ? w->scratch.p : "", w->scratch.len, err))
        fail_oom(w);
}

int cmp_span(const void *a, const void *b) {
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

static void record(walker_t *w, const struct statx *sx, uint32_t gen, uint32_t iflags,
                   size_t ext_start, long n_ext) {
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
        .iflags = iflags,
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

/* The inode flags (ext4's i_flags as FS_IOC_GETFLAGS shows them: EXTENTS_FL, INDEX_FL, ...),
 * which the offline reader records too: one more ioctl on a descriptor already open. */
static uint32_t inode_flags(walker_t *w, int fd) {
    if (!w->getflags)
        return 0;
    int v = 0; /* the kernel writes an int, whatever the request's size says */
    int r;
    do
        r = ioctl(fd, FS_IOC_GETFLAGS, &v);
    while (r < 0 && errno == EINTR);
    if (r < 0) {
        w->getflags = 0;
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
    uint32_t iflags = inode_flags(w, fd);
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
    record(w, &sx, gen, iflags, first, n);
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
    uint32_t iflags = inode_flags(w, fd);
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
    record(w, &sx, gen, iflags, first, n);
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
    record(w, &sx, 0, 0, ext_count(w), 0);
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

void process(walker_t *w, const task_t *t) {
    uint64_t dino = 0;
    int dfd = open_dir(w, t, &dino);
    if (dfd < 0)
        return;
    if (w->sh->mode != MODE_RECORD)
        read_dir(w, dfd, t, dino);
    close_pending(w);
    xclose(dfd);
}
