/* fsage._fuse: libfuse3's low-level session loop in C, each request handed to a method of a
 * Python object (fsage/lfs/mount.py's LfsOperations).
 *
 * The loop runs single-threaded with the GIL released; a request takes the GIL, calls the
 * method and turns its result into the reply. A method answers an error by raising OSError
 * (its errno goes back to the kernel); any other exception is printed and answered with EIO.
 * libfuse's own SIGINT/SIGTERM/SIGHUP handlers end the loop while it runs.
 *
 * statfs answers (bsize, blocks, bfree, bavail, files, ffree, namemax).
 * Attributes travel as a tuple (ino, mode, nlink, uid, gid, size, blocks, atime_ns,
 * mtime_ns, ctime_ns, generation); blocks are 512-octet units.
 */
#define PY_SSIZE_T_CLEAN
#define FUSE_USE_VERSION 34
#include <Python.h>
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Names, negative names and attributes stay valid in the kernel for a day: only this process
 * changes the image while it is mounted, and every change it makes comes from a request the
 * kernel sent (which updates or drops what the kernel holds). */
static double entry_timeout = 86400.0;
static double attr_timeout = 86400.0;

typedef struct {
    PyObject_HEAD
    struct fuse_session *se;
    PyObject *ops;
    int mounted;
    int writeback;
} Session;

/* --------------------------------------------------------------------------- helpers */

static int fail_errno(void)
{
    /* The pending Python exception as an errno (cleared). */
    int err = EIO;
    if (PyErr_ExceptionMatches(PyExc_OSError)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *e = value ? PyObject_GetAttrString(value, "errno") : NULL;
        if (e && PyLong_Check(e)) {
            long v = PyLong_AsLong(e);
            if (v > 0 && v < 4096)
                err = (int)v;
        }
        Py_XDECREF(e);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Clear();
    } else {
        PyErr_Print();
    }
    return err;
}

static PyObject *call(fuse_req_t req, const char *name, const char *fmt, ...)
{
    Session *s = (Session *)fuse_req_userdata(req);
    PyObject *meth = PyObject_GetAttrString(s->ops, name);
    if (!meth)
        return NULL;
    va_list va;
    va_start(va, fmt);
    PyObject *args = Py_VaBuildValue(fmt, va);
    va_end(va);
    if (!args) {
        Py_DECREF(meth);
        return NULL;
    }
    if (!PyTuple_Check(args)) {
        PyObject *t = PyTuple_Pack(1, args);
        Py_DECREF(args);
        args = t;
        if (!args) {
            Py_DECREF(meth);
            return NULL;
        }
    }
    PyObject *res = PyObject_Call(meth, args, NULL);
    Py_DECREF(meth);
    Py_DECREF(args);
    return res;
}

static int to_stat(PyObject *t, struct stat *st, uint64_t *generation)
{
    unsigned long long ino, size, blocks, gen;
    unsigned int mode, uid, gid;
    unsigned long nlink;
    long long at, mt, ct;
    memset(st, 0, sizeof *st);
    if (!PyArg_ParseTuple(t, "KIkIIKKLLLK", &ino, &mode, &nlink, &uid, &gid, &size, &blocks,
                          &at, &mt, &ct, &gen))
        return -1;
    st->st_ino = ino;
    st->st_mode = mode;
    st->st_nlink = nlink;
    st->st_uid = uid;
    st->st_gid = gid;
    st->st_size = (off_t)size;
    st->st_blocks = (blkcnt_t)blocks;
    st->st_blksize = 4096;
    st->st_atim.tv_sec = at / 1000000000LL;
    st->st_atim.tv_nsec = at % 1000000000LL;
    st->st_mtim.tv_sec = mt / 1000000000LL;
    st->st_mtim.tv_nsec = mt % 1000000000LL;
    st->st_ctim.tv_sec = ct / 1000000000LL;
    st->st_ctim.tv_nsec = ct % 1000000000LL;
    if (generation)
        *generation = gen;
    return 0;
}

static void reply_entry(fuse_req_t req, PyObject *res)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.entry_timeout = entry_timeout;
    if (res == Py_None) { /* a negative entry the kernel may cache */
        fuse_reply_entry(req, &e);
        return;
    }
    if (to_stat(res, &e.attr, &e.generation) < 0) {
        fuse_reply_err(req, fail_errno());
        return;
    }
    e.ino = e.attr.st_ino;
    e.attr_timeout = attr_timeout;
    fuse_reply_entry(req, &e);
}

static void reply_attr(fuse_req_t req, PyObject *res)
{
    struct stat st;
    if (to_stat(res, &st, NULL) < 0) {
        fuse_reply_err(req, fail_errno());
        return;
    }
    fuse_reply_attr(req, &st, attr_timeout);
}

static void reply_none(fuse_req_t req, PyObject *res)
{
    (void)res;
    fuse_reply_err(req, 0);
}

/* Call, then reply with ``done`` on success or the errno on failure. */
#define HANDLE(done, name, ...)                                                               \
    do {                                                                                      \
        PyGILState_STATE g = PyGILState_Ensure();                                             \
        PyObject *res = call(req, name, __VA_ARGS__);                                         \
        if (!res)                                                                             \
            fuse_reply_err(req, fail_errno());                                                \
        else {                                                                                \
            done(req, res);                                                                   \
            Py_DECREF(res);                                                                   \
        }                                                                                     \
        PyGILState_Release(g);                                                                \
    } while (0)

/* --------------------------------------------------------------------------- operations */

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    Session *s = (Session *)userdata;
    if (s->writeback && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
        conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS;
    /* Only this process changes the files: the kernel need not ask for a file's attributes
     * before each read to find out whether its cached pages are stale. */
    conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    HANDLE(reply_entry, "lookup", "(Ky)", (unsigned long long)parent, name);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    (void)ino;
    (void)nlookup;
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    HANDLE(reply_attr, "getattr", "(K)", (unsigned long long)ino);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    long long at = (long long)attr->st_atim.tv_sec * 1000000000LL + attr->st_atim.tv_nsec;
    long long mt = (long long)attr->st_mtim.tv_sec * 1000000000LL + attr->st_mtim.tv_nsec;
    HANDLE(reply_attr, "setattr", "(KiIIIKLLL)", (unsigned long long)ino, to_set,
           (unsigned)attr->st_mode, (unsigned)attr->st_uid, (unsigned)attr->st_gid,
           (unsigned long long)attr->st_size, at, mt, fi ? (long long)fi->fh : -1LL);
}

static void reply_readlink(fuse_req_t req, PyObject *res)
{
    const char *p = PyBytes_AsString(res);
    if (!p)
        fuse_reply_err(req, fail_errno());
    else
        fuse_reply_readlink(req, p);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
    HANDLE(reply_readlink, "readlink", "(K)", (unsigned long long)ino);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                     dev_t rdev)
{
    const struct fuse_ctx *c = fuse_req_ctx(req);
    (void)rdev;
    HANDLE(reply_entry, "mknod", "(KyIII)", (unsigned long long)parent, name, (unsigned)mode,
           (unsigned)c->uid, (unsigned)c->gid);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    const struct fuse_ctx *c = fuse_req_ctx(req);
    HANDLE(reply_entry, "mkdir", "(KyIII)", (unsigned long long)parent, name, (unsigned)mode,
           (unsigned)c->uid, (unsigned)c->gid);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    HANDLE(reply_none, "unlink", "(Ky)", (unsigned long long)parent, name);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    HANDLE(reply_none, "rmdir", "(Ky)", (unsigned long long)parent, name);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    const struct fuse_ctx *c = fuse_req_ctx(req);
    HANDLE(reply_entry, "symlink", "(yKyII)", link, (unsigned long long)parent, name,
           (unsigned)c->uid, (unsigned)c->gid);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
    HANDLE(reply_none, "rename", "(KyKyI)", (unsigned long long)parent, name,
           (unsigned long long)newparent, newname, flags);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
    HANDLE(reply_entry, "link", "(KKy)", (unsigned long long)ino, (unsigned long long)newparent,
           newname);
}

/* Cached pages are kept across opens; a file opened ``direct`` (the LFS near full) is read
 * and written without the page cache, so that a write the LFS cannot store fails at once
 * instead of in a later writeback, and what was cached of it is dropped at this open. */
static void set_caching(struct fuse_file_info *fi, int direct)
{
    fi->direct_io = direct ? 1 : 0;
    fi->keep_cache = direct ? 0 : 1;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *res = call(req, "open", "(Ki)", (unsigned long long)ino, fi->flags);
    unsigned long long fh;
    int direct;
    if (!res)
        fuse_reply_err(req, fail_errno());
    else if (!PyArg_ParseTuple(res, "Kp", &fh, &direct)) {
        Py_DECREF(res);
        fuse_reply_err(req, fail_errno());
    } else {
        Py_DECREF(res);
        fi->fh = fh;
        set_caching(fi, direct);
        fuse_reply_open(req, fi);
    }
    PyGILState_Release(g);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    const struct fuse_ctx *c = fuse_req_ctx(req);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *res = call(req, "create", "(KyIiII)", (unsigned long long)parent, name,
                         (unsigned)mode, fi->flags, (unsigned)c->uid, (unsigned)c->gid);
    PyObject *attr;
    unsigned long long fh;
    int direct;
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    if (!res)
        fuse_reply_err(req, fail_errno());
    else if (!PyArg_ParseTuple(res, "KOp", &fh, &attr, &direct) ||
             to_stat(attr, &e.attr, &e.generation) < 0) {
        Py_DECREF(res);
        fuse_reply_err(req, fail_errno());
    } else {
        Py_DECREF(res);
        e.ino = e.attr.st_ino;
        e.entry_timeout = entry_timeout;
        e.attr_timeout = attr_timeout;
        fi->fh = fh;
        set_caching(fi, direct);
        fuse_reply_create(req, &e, fi);
    }
    PyGILState_Release(g);
}

static void reply_buf(fuse_req_t req, PyObject *res)
{
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(res, &p, &n) < 0)
        fuse_reply_err(req, fail_errno());
    else
        fuse_reply_buf(req, p, (size_t)n);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)ino;
    HANDLE(reply_buf, "read", "(KnL)", (unsigned long long)fi->fh, (Py_ssize_t)size,
           (long long)off);
}

static void reply_write(fuse_req_t req, PyObject *res)
{
    size_t n = PyLong_AsSize_t(res);
    if (PyErr_Occurred())
        fuse_reply_err(req, fail_errno());
    else
        fuse_reply_write(req, n);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    (void)ino;
    HANDLE(reply_write, "write", "(Ky#L)", (unsigned long long)fi->fh, buf, (Py_ssize_t)size,
           (long long)off);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    HANDLE(reply_none, "release", "(K)", (unsigned long long)fi->fh);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)ino;
    HANDLE(reply_none, "fsync", "(Ki)", (unsigned long long)fi->fh, datasync);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *res = call(req, "opendir", "(K)", (unsigned long long)ino);
    if (!res)
        fuse_reply_err(req, fail_errno());
    else {
        fi->fh = PyLong_AsUnsignedLongLong(res);
        Py_DECREF(res);
        if (PyErr_Occurred())
            fuse_reply_err(req, fail_errno());
        else
            fuse_reply_open(req, fi);
    }
    PyGILState_Release(g);
}

/* readdir: the method returns [(name: bytes, ino, mode, next offset), ...] from ``off``. */
static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)ino;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *res = call(req, "readdir", "(KL)", (unsigned long long)fi->fh, (long long)off);
    if (!res) {
        fuse_reply_err(req, fail_errno());
        PyGILState_Release(g);
        return;
    }
    char *buf = malloc(size);
    size_t used = 0;
    PyObject *seq = PySequence_Fast(res, "readdir must return a sequence");
    int err = 0;
    if (!buf || !seq)
        err = 1;
    for (Py_ssize_t i = 0; !err && seq && i < PySequence_Fast_GET_SIZE(seq); i++) {
        const char *name;
        unsigned long long eino;
        unsigned int mode;
        long long next;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "yKIL", &name, &eino, &mode,
                              &next)) {
            err = 1;
            break;
        }
        struct stat st;
        memset(&st, 0, sizeof st);
        st.st_ino = eino;
        st.st_mode = mode;
        size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, next);
        if (need > size - used)
            break;
        used += need;
    }
    if (err) {
        free(buf);
        fuse_reply_err(req, PyErr_Occurred() ? fail_errno() : ENOMEM);
    } else {
        fuse_reply_buf(req, buf, used);
        free(buf);
    }
    Py_XDECREF(seq);
    Py_DECREF(res);
    PyGILState_Release(g);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    HANDLE(reply_none, "releasedir", "(K)", (unsigned long long)fi->fh);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)ino;
    HANDLE(reply_none, "fsyncdir", "(Ki)", (unsigned long long)fi->fh, datasync);
}

static void reply_statfs(fuse_req_t req, PyObject *res)
{
    struct statvfs v;
    unsigned long bsize, namemax;
    unsigned long long blocks, bfree, bavail, files, ffree;
    memset(&v, 0, sizeof v);
    if (!PyArg_ParseTuple(res, "kKKKKKk", &bsize, &blocks, &bfree, &bavail, &files, &ffree,
                          &namemax)) {
        fuse_reply_err(req, fail_errno());
        return;
    }
    v.f_bsize = v.f_frsize = bsize;
    v.f_blocks = blocks;
    v.f_bfree = bfree;
    v.f_bavail = bavail;
    v.f_files = files;
    v.f_ffree = v.f_favail = ffree;
    v.f_namemax = namemax;
    fuse_reply_statfs(req, &v);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    HANDLE(reply_statfs, "statfs", "()");
}

static const struct fuse_lowlevel_ops lowlevel_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .readlink = op_readlink,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .symlink = op_symlink,
    .rename = op_rename,
    .link = op_link,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    /* no .flush: the first close is answered ENOSYS by libfuse and the kernel sends no more
     * (it still writes a file's dirty pages on close) */
    .release = op_release,
    .fsync = op_fsync,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .releasedir = op_releasedir,
    .fsyncdir = op_fsyncdir,
    .statfs = op_statfs,
    .create = op_create,
};

/* --------------------------------------------------------------------------- Session */

static int Session_init(Session *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ops", "mountpoint", "options", "writeback", NULL};
    PyObject *ops;
    const char *mountpoint, *options;
    int writeback = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oss|p", kwlist, &ops, &mountpoint, &options,
                                     &writeback))
        return -1;
    if (self->se) {
        PyErr_SetString(PyExc_RuntimeError, "session already made");
        return -1;
    }
    char *argv[] = {"fsage", "-o", (char *)options, NULL};
    struct fuse_args fargs = FUSE_ARGS_INIT(options[0] ? 3 : 1, argv);
    Py_INCREF(ops);
    self->ops = ops;
    self->writeback = writeback;
    self->se = fuse_session_new(&fargs, &lowlevel_ops, sizeof lowlevel_ops, self);
    fuse_opt_free_args(&fargs);
    if (!self->se) {
        PyErr_SetString(PyExc_OSError, "fuse_session_new failed (bad options?)");
        return -1;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = fuse_session_mount(self->se, mountpoint);
    Py_END_ALLOW_THREADS if (rc != 0)
    {
        fuse_session_destroy(self->se);
        self->se = NULL;
        PyErr_Format(PyExc_OSError, "cannot mount on %s", mountpoint);
        return -1;
    }
    self->mounted = 1;
    return 0;
}

static PyObject *Session_loop(Session *self, PyObject *unused)
{
    (void)unused;
    if (!self->se) {
        PyErr_SetString(PyExc_RuntimeError, "no session");
        return NULL;
    }
    int rc;
    if (fuse_set_signal_handlers(self->se) != 0) {
        PyErr_SetString(PyExc_OSError, "cannot set signal handlers");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS rc = fuse_session_loop(self->se);
    Py_END_ALLOW_THREADS fuse_remove_signal_handlers(self->se);
    return PyLong_FromLong(rc);
}

static PyObject *Session_unmount(Session *self, PyObject *unused)
{
    (void)unused;
    if (self->se && self->mounted) {
        Py_BEGIN_ALLOW_THREADS fuse_session_unmount(self->se);
        Py_END_ALLOW_THREADS self->mounted = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *Session_inval_inode(Session *self, PyObject *arg)
{
    /* Drop the kernel's cached pages and attributes of an inode. Never from a request of
     * the loop's own thread: the kernel may wait for that request's reply first. */
    unsigned long long ino = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    if (!self->se || !self->mounted)
        Py_RETURN_NONE;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = fuse_lowlevel_notify_inval_inode(self->se, (fuse_ino_t)ino, 0, 0);
    Py_END_ALLOW_THREADS if (rc != 0 && rc != -ENOENT)
    {
        errno = -rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *Session_inval_entry(Session *self, PyObject *args)
{
    /* Drop the kernel's name ``name`` in directory ``parent``: once no open file holds its
     * inode, the kernel forgets it, size included, and looks it up afresh. Not from a
     * request of the loop's own thread: a request queued behind it may hold the parent. */
    unsigned long long parent;
    const char *name;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "Ky#", &parent, &name, &len))
        return NULL;
    if (!self->se || !self->mounted)
        Py_RETURN_NONE;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        fuse_lowlevel_notify_inval_entry(self->se, (fuse_ino_t)parent, name, (size_t)len);
    Py_END_ALLOW_THREADS if (rc != 0 && rc != -ENOENT)
    {
        errno = -rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *Session_fd(Session *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLong(self->se ? fuse_session_fd(self->se) : -1);
}

static void Session_dealloc(Session *self)
{
    if (self->se) {
        if (self->mounted)
            fuse_session_unmount(self->se);
        fuse_session_destroy(self->se);
    }
    Py_XDECREF(self->ops);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Session_methods[] = {
    {"loop", (PyCFunction)Session_loop, METH_NOARGS,
     "Serve requests until unmounted or a signal; returns libfuse's status."},
    {"unmount", (PyCFunction)Session_unmount, METH_NOARGS, "Unmount (if still mounted)."},
    {"fd", (PyCFunction)Session_fd, METH_NOARGS, "The /dev/fuse descriptor."},
    {"inval_inode", (PyCFunction)Session_inval_inode, METH_O,
     "Drop the kernel's cached pages and attributes of an inode (not from a request)."},
    {"inval_entry", (PyCFunction)Session_inval_entry, METH_VARARGS,
     "inval_entry(parent, name): drop the kernel's entry of a name (and, once unused, its "
     "inode)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fsage._fuse.Session",
    .tp_basicsize = sizeof(Session),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Session_init,
    .tp_dealloc = (destructor)Session_dealloc,
    .tp_methods = Session_methods,
    .tp_doc = "Session(ops, mountpoint, options, writeback=True): a mounted FUSE session.",
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "fsage._fuse", "libfuse3 low-level loop over a Python object.", -1,
    NULL,
};

PyMODINIT_FUNC PyInit__fuse(void)
{
    if (PyType_Ready(&SessionType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&SessionType);
    PyModule_AddObject(m, "Session", (PyObject *)&SessionType);
    PyModule_AddIntConstant(m, "SET_MODE", FUSE_SET_ATTR_MODE);
    PyModule_AddIntConstant(m, "SET_UID", FUSE_SET_ATTR_UID);
    PyModule_AddIntConstant(m, "SET_GID", FUSE_SET_ATTR_GID);
    PyModule_AddIntConstant(m, "SET_SIZE", FUSE_SET_ATTR_SIZE);
    PyModule_AddIntConstant(m, "SET_ATIME", FUSE_SET_ATTR_ATIME);
    PyModule_AddIntConstant(m, "SET_MTIME", FUSE_SET_ATTR_MTIME);
    PyModule_AddIntConstant(m, "SET_ATIME_NOW", FUSE_SET_ATTR_ATIME_NOW);
    PyModule_AddIntConstant(m, "SET_MTIME_NOW", FUSE_SET_ATTR_MTIME_NOW);
    PyModule_AddIntConstant(m, "SET_CTIME", FUSE_SET_ATTR_CTIME);
    PyModule_AddIntConstant(m, "RENAME_NOREPLACE", RENAME_NOREPLACE);
    PyModule_AddIntConstant(m, "RENAME_EXCHANGE", RENAME_EXCHANGE);
    return m;
}
