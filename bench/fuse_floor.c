/* fuse_floor: the least a FUSE server can cost — an in-memory file system in C over libfuse3's
 * low-level API, single-threaded like fsage's mount, with the same kernel caching (names,
 * negative names and attributes for a day, keep_cache, no readdirplus, no auto_inval_data, no
 * flush handler). bench/lfs_floor.py compiles it and runs PostMark on it: what is left of the
 * time is the kernel's FUSE path, which no server can avoid.
 *
 *     fuse_floor [--writeback] [--no-open] [--max-write N] MOUNTPOINT [FUSE-OPTIONS]
 *
 * --no-open answers the first open ENOSYS: the kernel then sends no open and no release for
 * files (only create), which a server can do only if it needs no per-open state.
 * Serves in the foreground until unmounted (fusermount3 -u) or SIGINT/SIGTERM; then prints
 * one JSON line: the requests it served by kind and the connection's negotiated sizes.
 * Files, directories and their entries only (no links, no symlinks); data in malloc'd buffers.
 */
#define _GNU_SOURCE /* RENAME_NOREPLACE */
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const double TIMEOUT = 86400.0;

enum { LOOKUP, FORGET, GETATTR, SETATTR, MKDIR, UNLINK, RMDIR, RENAME, OPEN, READ, WRITE,
       RELEASE, FSYNC, OPENDIR, READDIR, RELEASEDIR, STATFS, CREATE, NKINDS };
static const char *kind_name[NKINDS] = {
    "lookup", "forget", "getattr", "setattr", "mkdir", "unlink", "rmdir", "rename", "open",
    "read", "write", "release", "fsync", "opendir", "readdir", "releasedir", "statfs", "create"};
static unsigned long counts[NKINDS];

struct entry {
    char *name;
    fuse_ino_t ino;
};

struct node {
    mode_t mode;
    nlink_t nlink;
    uid_t uid;
    gid_t gid;
    struct timespec atim, mtim, ctim;
    char *data; /* a file's bytes */
    size_t size, cap;
    struct entry *ents; /* a directory's entries */
    size_t nents, capents;
    fuse_ino_t parent;
    int open;
};

/* Inode number = index; never reused (PostMark makes a few thousand). */
static struct node **nodes;
static size_t nnodes;
static int writeback, no_open;
static unsigned max_write;
static unsigned conn_max_write, conn_max_read, conn_max_readahead, conn_writeback;

static struct node *N(fuse_ino_t ino) { return ino < nnodes ? nodes[ino] : NULL; }

static fuse_ino_t new_node(mode_t mode, fuse_ino_t parent, const struct fuse_ctx *c)
{
    if ((nnodes & (nnodes - 1)) == 0) /* grow at powers of two */
        nodes = realloc(nodes, (nnodes ? 2 * nnodes : 2) * sizeof *nodes);
    struct node *n = calloc(1, sizeof *n);
    n->mode = mode;
    n->nlink = S_ISDIR(mode) ? 2 : 1;
    n->uid = c ? c->uid : 0;
    n->gid = c ? c->gid : 0;
    clock_gettime(CLOCK_REALTIME, &n->mtim);
    n->atim = n->ctim = n->mtim;
    n->parent = parent;
    nodes[nnodes] = n;
    return nnodes++;
}

static void drop_if_unused(fuse_ino_t ino)
{
    struct node *n = N(ino);
    if (n && n->nlink == 0 && n->open == 0) {
        free(n->data);
        free(n->ents);
        free(n);
        nodes[ino] = NULL;
    }
}

static long find(struct node *d, const char *name)
{
    for (size_t i = 0; i < d->nents; i++)
        if (strcmp(d->ents[i].name, name) == 0)
            return (long)i;
    return -1;
}

static void add_entry(struct node *d, const char *name, fuse_ino_t ino)
{
    if (d->nents == d->capents) {
        d->capents = d->capents ? 2 * d->capents : 8;
        d->ents = realloc(d->ents, d->capents * sizeof *d->ents);
    }
    d->ents[d->nents].name = strdup(name);
    d->ents[d->nents++].ino = ino;
    clock_gettime(CLOCK_REALTIME, &d->mtim);
    d->ctim = d->mtim;
}

static void del_entry(struct node *d, size_t i)
{
    free(d->ents[i].name);
    d->ents[i] = d->ents[--d->nents];
    clock_gettime(CLOCK_REALTIME, &d->mtim);
    d->ctim = d->mtim;
}

static void fill(fuse_ino_t ino, struct stat *st)
{
    struct node *n = N(ino);
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_mode = n->mode;
    st->st_nlink = n->nlink;
    st->st_uid = n->uid;
    st->st_gid = n->gid;
    st->st_size = (off_t)n->size;
    st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
    st->st_blksize = 4096;
    st->st_atim = n->atim;
    st->st_mtim = n->mtim;
    st->st_ctim = n->ctim;
}

static void reply_entry(fuse_req_t req, fuse_ino_t ino)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.entry_timeout = TIMEOUT;
    if (ino) { /* else a negative entry the kernel may cache */
        e.ino = ino;
        e.attr_timeout = TIMEOUT;
        fill(ino, &e.attr);
    }
    fuse_reply_entry(req, &e);
}

static void op_init(void *u, struct fuse_conn_info *conn)
{
    (void)u;
    if (writeback && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
        conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS;
    conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
    if (max_write)
        conn->max_write = max_write;
    conn_max_write = conn->max_write;
    conn_max_read = conn->max_read;
    conn_max_readahead = conn->max_readahead;
    conn_writeback = !!(conn->want & FUSE_CAP_WRITEBACK_CACHE);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    counts[LOOKUP]++;
    struct node *d = N(parent);
    if (!d || !S_ISDIR(d->mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    long i = find(d, name);
    reply_entry(req, i < 0 ? 0 : d->ents[i].ino);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    (void)ino;
    (void)nlookup;
    counts[FORGET]++;
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    (void)forgets;
    counts[FORGET] += count;
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    counts[GETATTR]++;
    struct stat st;
    if (!N(ino)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    fill(ino, &st);
    fuse_reply_attr(req, &st, TIMEOUT);
}

static void resize(struct node *n, size_t size)
{
    if (size > n->cap) {
        n->cap = size < 4096 ? 4096 : size + size / 2;
        n->data = realloc(n->data, n->cap);
    }
    if (size > n->size)
        memset(n->data + n->size, 0, size - n->size);
    n->size = size;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *a, int set,
                       struct fuse_file_info *fi)
{
    (void)fi;
    counts[SETATTR]++;
    struct node *n = N(ino);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (!n) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (set & FUSE_SET_ATTR_MODE)
        n->mode = (n->mode & S_IFMT) | (a->st_mode & 07777);
    if (set & FUSE_SET_ATTR_UID)
        n->uid = a->st_uid;
    if (set & FUSE_SET_ATTR_GID)
        n->gid = a->st_gid;
    if (set & FUSE_SET_ATTR_SIZE)
        resize(n, (size_t)a->st_size);
    if (set & FUSE_SET_ATTR_ATIME)
        n->atim = (set & FUSE_SET_ATTR_ATIME_NOW) ? now : a->st_atim;
    if (set & FUSE_SET_ATTR_MTIME)
        n->mtim = (set & FUSE_SET_ATTR_MTIME_NOW) ? now : a->st_mtim;
    n->ctim = (set & FUSE_SET_ATTR_CTIME) ? a->st_ctim : now;
    struct stat st;
    fill(ino, &st);
    fuse_reply_attr(req, &st, TIMEOUT);
}

static void make(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                 struct fuse_file_info *fi)
{
    struct node *d = N(parent);
    if (!d || !S_ISDIR(d->mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    if (find(d, name) >= 0) {
        fuse_reply_err(req, EEXIST);
        return;
    }
    fuse_ino_t ino = new_node(mode, parent, fuse_req_ctx(req));
    d = N(parent); /* nodes may have moved */
    add_entry(d, name, ino);
    if (S_ISDIR(mode))
        d->nlink++;
    if (!fi) {
        reply_entry(req, ino);
        return;
    }
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = ino;
    e.entry_timeout = e.attr_timeout = TIMEOUT;
    fill(ino, &e.attr);
    if (!no_open) /* else no release will come */
        N(ino)->open++;
    fi->fh = ino;
    fi->keep_cache = 1;
    fuse_reply_create(req, &e, fi);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    counts[MKDIR]++;
    make(req, parent, name, S_IFDIR | (mode & 07777), NULL);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    counts[CREATE]++;
    make(req, parent, name, S_IFREG | (mode & 07777), fi);
}

static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name, int dir)
{
    struct node *d = N(parent);
    long i = d ? find(d, name) : -1;
    if (i < 0) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    fuse_ino_t ino = d->ents[i].ino;
    struct node *n = N(ino);
    if (dir && !S_ISDIR(n->mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    if (!dir && S_ISDIR(n->mode)) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if (dir && n->nents) {
        fuse_reply_err(req, ENOTEMPTY);
        return;
    }
    del_entry(d, (size_t)i);
    if (dir) {
        d->nlink--;
        n->nlink = 0;
    } else {
        n->nlink--;
        clock_gettime(CLOCK_REALTIME, &n->ctim);
    }
    drop_if_unused(ino);
    fuse_reply_err(req, 0);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    counts[UNLINK]++;
    remove_name(req, parent, name, 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    counts[RMDIR]++;
    remove_name(req, parent, name, 1);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
    counts[RENAME]++;
    struct node *d = N(parent), *nd = N(newparent);
    long i = d ? find(d, name) : -1;
    if (i < 0 || !nd) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (flags & ~(unsigned)RENAME_NOREPLACE) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    fuse_ino_t ino = d->ents[i].ino;
    long j = find(nd, newname);
    if (j >= 0) {
        fuse_ino_t victim = nd->ents[j].ino;
        struct node *v = N(victim);
        if (flags & RENAME_NOREPLACE) {
            fuse_reply_err(req, EEXIST);
            return;
        }
        if (victim == ino) {
            fuse_reply_err(req, 0);
            return;
        }
        if (S_ISDIR(v->mode) && v->nents) {
            fuse_reply_err(req, ENOTEMPTY);
            return;
        }
        if (S_ISDIR(v->mode) != S_ISDIR(N(ino)->mode)) {
            fuse_reply_err(req, S_ISDIR(v->mode) ? EISDIR : ENOTDIR);
            return;
        }
        del_entry(nd, (size_t)j);
        if (S_ISDIR(v->mode)) {
            nd->nlink--;
            v->nlink = 0;
        } else {
            v->nlink--;
        }
        drop_if_unused(victim);
        i = find(d, name); /* the swap-remove may have moved it */
    }
    del_entry(d, (size_t)i);
    add_entry(nd, newname, ino);
    if (S_ISDIR(N(ino)->mode) && d != nd) {
        d->nlink--;
        nd->nlink++;
        N(ino)->parent = newparent;
    }
    fuse_reply_err(req, 0);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    counts[OPEN]++;
    struct node *n = N(ino);
    if (no_open) { /* the kernel sends no more opens, and no releases */
        fuse_reply_err(req, ENOSYS);
        return;
    }
    if (!n) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (fi->flags & O_TRUNC)
        resize(n, 0);
    n->open++;
    fi->fh = ino;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)fi;
    counts[READ]++;
    struct node *n = N(ino);
    size_t o = (size_t)off;
    if (o >= n->size)
        fuse_reply_buf(req, NULL, 0);
    else
        fuse_reply_buf(req, n->data + o, o + size > n->size ? n->size - o : size);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    (void)fi;
    counts[WRITE]++;
    struct node *n = N(ino);
    size_t end = (size_t)off + size;
    if (end > n->size)
        resize(n, end);
    memcpy(n->data + off, buf, size);
    clock_gettime(CLOCK_REALTIME, &n->mtim);
    n->ctim = n->mtim;
    fuse_reply_write(req, size);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    counts[RELEASE]++;
    if (N(ino)->open > 0) /* after --no-open, releases come only for creates */
        N(ino)->open--;
    drop_if_unused(ino);
    fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)ino;
    (void)datasync;
    (void)fi;
    counts[FSYNC]++;
    fuse_reply_err(req, 0);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    counts[OPENDIR]++;
    fi->fh = ino;
    fuse_reply_open(req, fi);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)fi;
    counts[READDIR]++;
    struct node *d = N(ino);
    char *buf = malloc(size);
    size_t used = 0;
    struct stat st;
    memset(&st, 0, sizeof st);
    /* offsets: 0 ".", 1 "..", 2 + i the i-th entry */
    for (size_t k = (size_t)off; k < d->nents + 2; k++) {
        const char *name = k == 0 ? "." : k == 1 ? ".." : d->ents[k - 2].name;
        st.st_ino = k == 0 ? ino : k == 1 ? d->parent : d->ents[k - 2].ino;
        st.st_mode = k < 2 ? S_IFDIR : N(st.st_ino)->mode;
        size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, (off_t)k + 1);
        if (need > size - used)
            break;
        used += need;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    (void)fi;
    counts[RELEASEDIR]++;
    fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    counts[STATFS]++;
    struct statvfs v;
    memset(&v, 0, sizeof v);
    v.f_bsize = v.f_frsize = 4096;
    v.f_blocks = v.f_bfree = v.f_bavail = 1 << 20;
    v.f_files = v.f_ffree = v.f_favail = 1 << 20;
    v.f_namemax = 255;
    fuse_reply_statfs(req, &v);
}

static const struct fuse_lowlevel_ops ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .mkdir = op_mkdir,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    .release = op_release,
    .fsync = op_fsync,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .releasedir = op_releasedir,
    .statfs = op_statfs,
    .create = op_create,
};

int main(int argc, char **argv)
{
    int a = 1;
    for (; a < argc && strncmp(argv[a], "--", 2) == 0; a++) {
        if (strcmp(argv[a], "--writeback") == 0)
            writeback = 1;
        else if (strcmp(argv[a], "--no-open") == 0)
            no_open = 1;
        else if (strcmp(argv[a], "--max-write") == 0 && a + 1 < argc)
            max_write = (unsigned)strtoul(argv[++a], NULL, 0);
        else
            break;
    }
    if (a >= argc || argc - a > 2) {
        fprintf(stderr, "usage: %s [--writeback] [--no-open] [--max-write N] MOUNTPOINT [OPTS]\n",
                argv[0]);
        return 2;
    }
    const char *mountpoint = argv[a];
    char *fargv[] = {argv[0], "-o", a + 1 < argc ? argv[a + 1] : "", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(a + 1 < argc ? 3 : 1, fargv);
    new_node(0, 0, NULL); /* inode 0: none */
    new_node(S_IFDIR | 0755, 1, NULL);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_session_mount(se, mountpoint) != 0)
        return 1;
    fuse_set_signal_handlers(se);
    int rc = fuse_session_loop(se);
    fuse_remove_signal_handlers(se);
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    printf("{\"requests\": {");
    for (int k = 0, first = 1; k < NKINDS; k++)
        if (counts[k]) {
            printf("%s\"%s\": %lu", first ? "" : ", ", kind_name[k], counts[k]);
            first = 0;
        }
    printf("}, \"max_write\": %u, \"max_read\": %u, \"max_readahead\": %u, \"writeback\": %u}\n",
           conn_max_write, conn_max_read, conn_max_readahead, conn_writeback);
    return rc < 0 ? 1 : 0;
}
