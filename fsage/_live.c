/*
 * fsage._live: the tree walk of the live reader (fsage/snapshotter/live.py) in C.
 *
 * walk() reads a mounted tree relative to directory file descriptors: getdents64 on each
 * directory, openat + statx + FS_IOC_GETVERSION + FS_IOC_GETFLAGS + FS_IOC_FIEMAP on each regular file, statx on
 * everything else. It runs on its own worker threads (without the GIL), which share one stack
 * of pending directories, so a wide or lopsided tree keeps every thread busy. Each worker
 * unshares its file-descriptor table: the kernel then neither locks a shared table on every
 * open and close nor takes a reference on every ioctl, which is what lets two threads run
 * almost twice as fast as one. The calling thread only reports progress and watches for
 * signals.
 *
 * Adjacent FIEMAP extents are merged as they are read; at the end the records of all workers
 * are sorted by inode number (radix sort) and handed to Python as the columns of a FileTable
 * (fsage/layout.py), each a Buffer that numpy wraps without a copy:
 *
 *   ino u64, generation u32, mode u32, nlink u32, uid u32, gid u32, size u64,
 *   atime, mtime, ctime, crtime i64 (ns; crtime from statx's btime, 0 where missing),
 *   flags u32 (FS_IOC_GETFLAGS on the files opened: regular files and directories; else 0),
 *   ext_off u64[n+1], ext_logical, ext_physical, ext_length u64 (blocks), ext_flags u32
 *   l_parent, l_ino u64[m], name_off u64[m+1], names bytes: the link table
 *
 * Walk rules, hard-link handling and what is skipped are those of the Python walk in live.py,
 * so both give the same Layout (the link table's order aside).
 *
 * This file is the Python module (walk()'s arguments and result); _live.h says where the
 * rest lives: reading a directory (_live_scan.c), the threads (_live_workers.c), the join
 * (_live_join.c).
 */
#include "_live.h"

static const char *const col_names[N_COLS] = {
    "ino", "generation", "mode", "nlink", "uid", "gid", "size", "atime", "mtime", "ctime",
    "crtime", "flags", "ext_off", "ext_logical", "ext_physical", "ext_length", "ext_flags",
    "l_parent", "l_ino", "name_off",
};

static PyObject *bytes_of(buf_t *b) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len);
}

/* A writable buffer that owns a buf_t's memory: numpy.frombuffer wraps it without a copy. */
typedef struct {
    PyObject_HEAD
    char *p;
    Py_ssize_t len;
    Py_ssize_t exports;
} BufferObject;

static void Buffer_dealloc(BufferObject *self) {
    free(self->p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Buffer_getbuffer(BufferObject *self, Py_buffer *view, int flags) {
    int r = PyBuffer_FillInfo(view, (PyObject *)self, self->p ? self->p : (void *)"",
                              self->len, 0, flags);
    if (r == 0)
        self->exports++;
    return r;
}

static void Buffer_releasebuffer(BufferObject *self, Py_buffer *view) {
    (void)view;
    self->exports--;
}

static Py_ssize_t Buffer_length(BufferObject *self) { return self->len; }

static PyBufferProcs Buffer_as_buffer = {
    (getbufferproc)Buffer_getbuffer,
    (releasebufferproc)Buffer_releasebuffer,
};

static PySequenceMethods Buffer_as_sequence = {.sq_length = (lenfunc)Buffer_length};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fsage._live.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_as_sequence = &Buffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory filled by walk(), exported through the buffer protocol.",
};

/* Hand b's memory to a new Buffer (b is left empty). */
static PyObject *buffer_of(buf_t *b) {
    BufferObject *o = PyObject_New(BufferObject, &BufferType);
    if (!o)
        return NULL;
    if (b->p && b->len < b->cap) {
        char *p = realloc(b->p, b->len ? b->len : 1);
        if (p)
            b->p = p;
    }
    o->p = b->p;
    o->len = (Py_ssize_t)b->len;
    o->exports = 0;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

static PyObject *pathlist_py(const pathlist_t *l, int with_err) {
    PyObject *out = PyList_New((Py_ssize_t)l->n);
    if (!out)
        return NULL;
    const uint64_t *off = (const uint64_t *)l->off.p;
    const int32_t *err = (const int32_t *)l->err.p;
    for (size_t i = 0; i < l->n; i++) {
        uint64_t a = off[i], b = i + 1 < l->n ? off[i + 1] : l->paths.len;
        PyObject *p = PyBytes_FromStringAndSize(l->paths.p + a, (Py_ssize_t)(b - a));
        PyObject *item = p && with_err ? Py_BuildValue("(Ni)", p, (int)err[i]) : p;
        if (!item) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    return out;
}

static int parse_tasks(PyObject *seq, tasks_t *out) {
    PyObject *fast = PySequence_Fast(seq, "tasks must be a sequence");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        const char *rel;
        Py_ssize_t len;
        PyObject *parent;
        if (!PyArg_ParseTuple(item, "y#O", &rel, &len, &parent))
            goto fail;
        if (len && rel[0] != '/') {
            PyErr_SetString(PyExc_ValueError, "a task's path must be empty or start with '/'");
            goto fail;
        }
        uint64_t par = 0;
        int has = parent != Py_None;
        if (has) {
            par = PyLong_AsUnsignedLongLong(parent);
            if (PyErr_Occurred())
                goto fail;
        }
        char *copy = malloc((size_t)len + 1);
        if (!copy) {
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(copy, rel, (size_t)len);
        copy[len] = 0;
        if (tasks_push(out, copy, (size_t)len, par, has, (long)i)) {
            free(copy);
            PyErr_NoMemory();
            goto fail;
        }
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

/* The (path, errno) lists of every worker, as one Python list. */
static PyObject *pathlists_py(walker_t *ws, int nw, size_t member, int with_err) {
    PyObject *out = PyList_New(0);
    for (int k = 0; out && k < nw; k++) {
        PyObject *part = pathlist_py((const pathlist_t *)((const char *)&ws[k] + member), with_err);
        if (!part || PyList_SetSlice(out, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, part) < 0)
            Py_CLEAR(out);
        Py_XDECREF(part);
    }
    return out;
}

static PyObject *top_inos_py(const int64_t *top, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *v = top[i] < 0 ? Py_NewRef(Py_None)
                                 : PyLong_FromUnsignedLongLong((unsigned long long)top[i]);
        if (!v)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    return out;
}

static PyObject *result_py(joined_t *j, walker_t *ws, int nw, const shared_t *sh, size_t ntop) {
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    for (int c = 0; c < N_COLS; c++) {
        PyObject *b = buffer_of(&j->col[c]);
        if (!b || PyDict_SetItemString(d, col_names[c], b) < 0) {
            Py_XDECREF(b);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(b);
    }
    uint64_t fiemap_ok = 0;
    int dir_fiemap = 1, getversion = 1;
    for (int k = 0; k < nw; k++) {
        fiemap_ok += ws[k].fiemap_ok;
        dir_fiemap &= ws[k].dir_fiemap;
        getversion &= ws[k].getversion;
    }
    struct {
        const char *key;
        PyObject *value;
    } items[] = {
        {"names", bytes_of(&j->names)},
        {"skipped", pathlists_py(ws, nw, offsetof(walker_t, skipped), 1)},
        {"not_crossed", pathlists_py(ws, nw, offsetof(walker_t, not_crossed), 0)},
        {"no_fiemap", pathlists_py(ws, nw, offsetof(walker_t, no_fiemap), 1)},
        {"fiemap_ok", PyLong_FromUnsignedLongLong(fiemap_ok)},
        {"dir_fiemap", PyBool_FromLong(dir_fiemap)},
        {"getversion", PyBool_FromLong(getversion)},
        {"top_ino", top_inos_py(sh->top_ino, ntop)},
    };
    int err = 0;
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        if (!err && (!items[i].value || PyDict_SetItemString(d, items[i].key, items[i].value) < 0))
            err = 1;
        Py_XDECREF(items[i].value);
    }
    if (err) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

PyDoc_STRVAR(walk_doc,
             "walk(base, tasks, *, mode, dev, submounts, sync, batch, dir_fiemap, getversion,\n"
             "     block_size, threads=1, expect=0, progress=None, progress_base=0) -> dict\n\n"
             "Walk the directories ``tasks`` ((rel, parent inode or None) pairs, rel from the\n"
             "mount root ``base``) on ``threads`` worker threads and return the columns\n"
             "described in fsage/_live.c. ``expect`` (an estimate of the records) sizes the\n"
             "buffers; ``progress`` is called with the number of records read every 4096.");

static PyObject *py_walk(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"base",       "tasks",      "mode",     "dev",        "submounts",
                             "sync",       "batch",      "dir_fiemap", "getversion", "block_size",
                             "threads",    "expect",     "progress", "progress_base", NULL};
    PyObject *base_obj, *tasks_obj, *subs_obj = NULL, *progress = Py_None;
    int mode = -1, sync = 0, dir_fiemap = 1, getversion = 1, threads = 1;
    unsigned long long dev = 0, progress_base = 0, block_size = 0, expect = 0;
    unsigned int batch = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|$iKOpIppKiKOK", kwlist,
                                     PyUnicode_FSConverter, &base_obj, &tasks_obj, &mode, &dev,
                                     &subs_obj, &sync, &batch, &dir_fiemap, &getversion,
                                     &block_size, &threads, &expect, &progress, &progress_base))
        return NULL;
    PyObject *result = NULL, *subs_fast = NULL;
    shared_t sh;
    memset(&sh, 0, sizeof sh);
    sh.base_fd = -1;
    pthread_mutex_init(&sh.mu, NULL);
    pthread_mutex_init(&sh.seen_mu, NULL);
    pthread_cond_init(&sh.work, NULL);
    pthread_cond_init(&sh.main, NULL);
    pthread_cond_init(&sh.resume, NULL);
    walker_t *ws = NULL;
    int nw = 0;
    joined_t joined;
    memset(&joined, 0, sizeof joined);
    tasks_t top = {0};
    if ((mode != MODE_WALK && mode != MODE_RECORD) || batch < 1 || batch > 65536) {
        PyErr_SetString(PyExc_ValueError, "bad mode or batch");
        goto out;
    }
    if (!subs_obj || !block_size) {
        PyErr_SetString(PyExc_TypeError, "walk() needs mode, dev, submounts, batch, block_size");
        goto out;
    }
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be between 1 and %d", MAX_THREADS);
        goto out;
    }
    sh.mode = mode;
    sh.dev = (dev_t)dev;
    sh.sync = sync;
    sh.batch = batch;
    sh.want_progress = progress != Py_None;
    sh.next_checkpoint = PROGRESS_EVERY;
    subs_fast = PySequence_Fast(subs_obj, "submounts must be a sequence of bytes");
    if (!subs_fast)
        goto out;
    sh.nsubs = (size_t)PySequence_Fast_GET_SIZE(subs_fast);
    sh.subs = calloc(sh.nsubs + 1, sizeof *sh.subs);
    if (!sh.subs) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < sh.nsubs; i++) {
        char *p;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(subs_fast, i), &p, &n) < 0)
            goto out;
        sh.subs[i].p = p; /* the bytes objects stay alive in subs_fast */
        sh.subs[i].len = (size_t)n;
    }
    qsort(sh.subs, sh.nsubs, sizeof *sh.subs, cmp_span);
    if (parse_tasks(tasks_obj, &top) < 0)
        goto out;
    sh.top_ino = malloc((top.n ? top.n : 1) * sizeof *sh.top_ino);
    if (!sh.top_ino) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < top.n; i++) /* the first task is read first */
        sh.top_ino[i] = -1;
    for (size_t i = top.n; i-- > 0;) {
        if (tasks_push(&sh.stack, top.v[i].rel, top.v[i].len, top.v[i].parent,
                       top.v[i].has_parent, top.v[i].top)) {
            PyErr_NoMemory();
            goto out;
        }
        top.v[i].rel = NULL; /* now owned by the stack */
    }
    if (mode == MODE_RECORD || top.n == 0)
        threads = 1;
    if (expect > (1ULL << 22))
        expect = 1ULL << 22;
    ws = calloc((size_t)threads, sizeof *ws);
    if (!ws) {
        PyErr_NoMemory();
        goto out;
    }
    pthread_t tids[MAX_THREADS];
    int base_err = 0, oom = 0, py_error = 0;
    const char *base = PyBytes_AS_STRING(base_obj);
    PyThreadState *ts = PyEval_SaveThread();
    sh.base_fd = xopenat(AT_FDCWD, base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sh.base_fd < 0)
        base_err = errno;
    for (int k = 0; !base_err && k < threads; k++) {
        if (walker_init(&ws[k], &sh, (size_t)expect / (size_t)threads + 64, dir_fiemap,
                        getversion) ||
            pthread_create(&tids[k], NULL, worker_main, &ws[k])) {
            walker_free(&ws[k]);
            if (k == 0)
                oom = 1;
            break;
        }
        nw = k + 1;
    }
    sh.nthreads = nw;
    if (nw)
        py_error = supervise(&sh, progress == Py_None ? NULL : progress, progress_base, &ts);
    for (int k = 0; k < nw; k++) {
        pthread_join(tids[k], NULL);
        oom |= ws[k].oom;
    }
    if (!base_err && !oom && !py_error)
        oom = join_workers(ws, nw, block_size, sh.claimed_failed, &joined) < 0;
    PyEval_RestoreThread(ts);
    if (py_error)
        goto out;
    if (base_err) {
        errno = base_err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, base_obj);
        goto out;
    }
    if (oom) {
        PyErr_NoMemory();
        goto out;
    }
    result = result_py(&joined, ws, nw, &sh, top.n);
out:
    for (int k = 0; k < nw; k++)
        walker_free(&ws[k]);
    free(ws);
    joined_free(&joined);
    tasks_free(&top);
    tasks_free(&sh.stack);
    free(sh.top_ino);
    free(sh.subs);
    free(sh.seen.slots);
    if (sh.base_fd >= 0)
        close(sh.base_fd);
    pthread_mutex_destroy(&sh.mu);
    pthread_mutex_destroy(&sh.seen_mu);
    pthread_cond_destroy(&sh.work);
    pthread_cond_destroy(&sh.main);
    pthread_cond_destroy(&sh.resume);
    Py_XDECREF(subs_fast);
    Py_DECREF(base_obj);
    return result;
}

PyDoc_STRVAR(sort_unique_doc,
             "sort_unique(inos, use_table) -> bytes\n\n"
             "The join's sort on its own, for the tests: the uint32 positions of the first\n"
             "occurrence of each value of the uint64 buffer ``inos``, in increasing value.");

static PyObject *py_sort_unique(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    int use_table;
    if (!PyArg_ParseTuple(args, "y*p", &view, &use_table))
        return NULL;
    size_t n = (size_t)view.len / sizeof(uint64_t);
    sortkey_t *keys = malloc((n ? n : 1) * sizeof *keys), *tmp = malloc((n ? n : 1) * sizeof *tmp);
    PyObject *out = NULL;
    if (keys && tmp) {
        const uint64_t *v = view.buf;
        for (size_t i = 0; i < n; i++)
            keys[i] = (sortkey_t){v[i], 0, (uint32_t)i};
        size_t kept = sort_unique(keys, tmp, n, use_table);
        uint32_t *pos = (uint32_t *)tmp; /* the keys are in keys now */
        for (size_t i = 0; i < kept; i++)
            pos[i] = keys[i].index;
        out = PyBytes_FromStringAndSize((const char *)pos, (Py_ssize_t)(kept * sizeof *pos));
    } else
        PyErr_NoMemory();
    free(keys);
    free(tmp);
    PyBuffer_Release(&view);
    return out;
}

/* glibc's mallopt, for fsage.heap: here so that `fsage snapshot` need not import ctypes (a few
 * ms of CPU) before its walk starts. */
PyDoc_STRVAR(mallopt_doc, "mallopt(param, value) -> int: glibc's mallopt (1 on success).");

static PyObject *py_mallopt(PyObject *self, PyObject *args) {
    (void)self;
    int param, value;
    if (!PyArg_ParseTuple(args, "ii", &param, &value))
        return NULL;
    return PyLong_FromLong(mallopt(param, value));
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))py_walk, METH_VARARGS | METH_KEYWORDS, walk_doc},
    {"sort_unique", py_sort_unique, METH_VARARGS, sort_unique_doc},
    {"mallopt", py_mallopt, METH_VARARGS, mallopt_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fsage._live", "The live reader's tree walk in C (see live.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__live(void) {
    if (PyType_Ready(&BufferType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&BufferType);
    if (PyModule_AddObject(m, "Buffer", (PyObject *)&BufferType) < 0) {
        Py_DECREF(&BufferType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MODE_WALK", MODE_WALK) ||
        PyModule_AddIntConstant(m, "MODE_RECORD", MODE_RECORD) ||
        PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS) ||
        PyModule_AddIntConstant(m, "EXTENT_UNWRITTEN", EXTENT_UNWRITTEN) ||
        PyModule_AddIntConstant(m, "EXTENT_DELALLOC", EXTENT_DELALLOC) ||
        PyModule_AddIntConstant(m, "EXTENT_INLINE", EXTENT_INLINE) ||
        PyModule_AddIntConstant(m, "EXTENT_SHARED", EXTENT_SHARED) ||
        PyModule_AddIntConstant(m, "EXTENT_ENCODED", EXTENT_ENCODED)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
