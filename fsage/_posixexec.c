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
#include "_posixexec.h"

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
