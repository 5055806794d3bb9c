/* fsage._ext2fs: links(), the directory pass of the read-only scanner (see _ext2fs.c): every
 * entry of the directories the inode scan saw, the directories split over threads. */
#include "_ext2fs_scanner.h"

typedef struct {
    Buf parent, ino, name_len, names;
    ext2_ino_t dir;
    int oom;
} DirAcc;

static int dir_cb(ext2_ino_t dir, int entry, struct ext2_dir_entry *dirent, int offset,
                  int blocksize, char *buf, void *priv) {
    (void)dir;
    (void)offset;
    (void)blocksize;
    (void)buf;
    DirAcc *d = priv;
    if (entry == DIRENT_DOT_FILE || entry == DIRENT_DOT_DOT_FILE || entry == DIRENT_CHECKSUM)
        return 0;
    if (dirent->inode == 0)
        return 0;
    int len = ext2fs_dirent_name_len(dirent);
    /* Inline-data directories hand '..' over as an ordinary entry. */
    if ((len == 1 && dirent->name[0] == '.') ||
        (len == 2 && dirent->name[0] == '.' && dirent->name[1] == '.'))
        return 0;
    PUT(&d->parent, uint64_t, d->dir);
    PUT(&d->ino, uint64_t, dirent->inode);
    PUT(&d->name_len, uint32_t, len);
    if (buf_put(&d->names, dirent->name, (size_t)len))
        goto nomem;
    return 0;
nomem:
    d->oom = 1;
    return DIRENT_ABORT;
}

typedef struct {
    ext2_filsys fs;
    const uint64_t *dirs;
    size_t n;
    DirAcc d;
    Buf damaged;
    int oom;
} DirJob;

static void *dir_job_run(void *arg) {
    DirJob *job = arg;
    for (size_t i = 0; i < job->n && !job->d.oom && !job->oom; i++) {
        job->d.dir = (ext2_ino_t)job->dirs[i];
        errcode_t r = ext2fs_dir_iterate2(job->fs, job->d.dir, 0, NULL, dir_cb, &job->d);
        if (r && !job->d.oom && buf_put(&job->damaged, &job->dirs[i], sizeof job->dirs[i]))
            job->oom = 1;
    }
    return NULL;
}

/* links(threads) -> dict(parent, ino, name_len, names, damaged_dirs): every entry of every
 * directory seen by the inode scan, the directories split over threads. */
PyObject *scanner_links(Scanner *self, PyObject *args) {
    int threads;
    if (!PyArg_ParseTuple(args, "i", &threads))
        return NULL;
    if (!self->fs) {
        PyErr_SetString(PyExc_ValueError, "scanner is closed");
        return NULL;
    }
    if (!self->scan_done) {
        PyErr_SetString(PyExc_RuntimeError, "links() needs a finished inode scan");
        return NULL;
    }
    size_t n_dirs = self->dirs.len / sizeof(uint64_t);
    const uint64_t *dirs = (const uint64_t *)self->dirs.data;
    int n = threads < 1 ? 1 : threads > MAX_JOBS ? MAX_JOBS : threads;
    if ((size_t)n > n_dirs / 64 + 1) /* a few directories are not worth a thread */
        n = (int)(n_dirs / 64 + 1);
    DirJob jobs[MAX_JOBS];
    memset(jobs, 0, sizeof jobs);
    errcode_t err = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (int k = 0; k < n && !err; k++) {
        jobs[k].dirs = dirs + n_dirs * (size_t)k / (size_t)n;
        jobs[k].n = n_dirs * (size_t)(k + 1) / (size_t)n - n_dirs * (size_t)k / (size_t)n;
        err = job_handle(self, k, &jobs[k].fs);
    }
    if (!err)
        run_jobs(dir_job_run, jobs, sizeof(DirJob), n);
    Py_END_ALLOW_THREADS;
    PyObject *out = NULL;
    int oom = 0;
    for (int k = 0; k < n; k++)
        oom |= jobs[k].oom || jobs[k].d.oom;
    if (err) {
        fsage_raise(err, "opening the file system again for the directory pass");
    } else if (oom) {
        PyErr_NoMemory();
    } else {
        Buf *parent[MAX_JOBS], *ino[MAX_JOBS], *name_len[MAX_JOBS], *names[MAX_JOBS],
            *damaged[MAX_JOBS];
        for (int k = 0; k < n; k++) {
            parent[k] = &jobs[k].d.parent;
            ino[k] = &jobs[k].d.ino;
            name_len[k] = &jobs[k].d.name_len;
            names[k] = &jobs[k].d.names;
            damaged[k] = &jobs[k].damaged;
        }
        PyObject *names_bytes = join_parts(names, n, 1);
        PyObject *damaged_bytes = join_parts(damaged, n, 1);
        if (names_bytes && damaged_bytes)
            out = Py_BuildValue("{s:N,s:N,s:N,s:O,s:O}", "parent", join_parts(parent, n, 0), "ino",
                                join_parts(ino, n, 0), "name_len", join_parts(name_len, n, 0),
                                "names", names_bytes, "damaged_dirs", damaged_bytes);
        Py_XDECREF(names_bytes);
        Py_XDECREF(damaged_bytes);
    }
    for (int k = 0; k < n; k++) {
        buf_free(&jobs[k].d.parent);
        buf_free(&jobs[k].d.ino);
        buf_free(&jobs[k].d.name_len);
        buf_free(&jobs[k].d.names);
        buf_free(&jobs[k].damaged);
    }
    return out;
}
