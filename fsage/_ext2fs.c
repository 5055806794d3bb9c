/* fsage._ext2fs: a read-only scanner of ext2/3/4 images and devices over libext2fs.
 *
 * The per-inode loop hands Python columnar batches as bytes objects (the Python side views
 * them with numpy.frombuffer), so no Python object is made per inode or per block. Damage
 * found while scanning (bad checksums, broken extent trees, blocks out of range) is recorded
 * per inode as a bit set and the scan goes on.
 *
 * This file is the module (its error type, the writer's, digests' and columns' functions
 * added at init) and the Scanner object: opening, its extra handles for threads, closing. Its
 * methods live in _ext2fs_inodes.c (scan), _ext2fs_dirs.c (links) and _ext2fs_facts.c (facts,
 * free_extents); _ext2fs_scanner.h holds what they share.
 */
#include "_ext2fs_scanner.h"

#include <pthread.h>

PyObject *fsage_Ext2fsError;

PyObject *fsage_raise(errcode_t err, const char *what) {
    PyObject *args = Py_BuildValue("(Lss)", (long long)err, what, error_message(err));
    if (args) {
        PyErr_SetObject(fsage_Ext2fsError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* ---------- growable column buffers ---------- */

int buf_grow(Buf *b, size_t more) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

void buf_free(Buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

PyObject *buf_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

/* A column as a bytearray: numpy views it writable, so Python needs no copy of its own. */
PyObject *buf_column(Buf *b) {
    return PyByteArray_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

/* ---------- the scanner object ---------- */

/* Every failed read of a handle of a scanner is counted in the scanner (the channel's
 * app_data), so that a device that fails under the scan is not taken for a damaged file
 * system; the error still goes back to libext2fs, which records the damage as before. */
static errcode_t count_read_error(io_channel channel, unsigned long block, int count, void *data,
                                  size_t size, int actual, errcode_t error) {
    (void)block;
    (void)count;
    (void)data;
    (void)size;
    (void)actual;
    long *counter = channel->app_data;
    if (counter)
        __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    return error;
}

static void watch_reads(Scanner *self, ext2_filsys fs) {
    fs->io->app_data = &self->io_errors;
    fs->io->read_error = count_read_error;
}

/* libext2fs reports some problems itself through com_err, on stderr ("Illegal block number
 * passed to ext2fs_mark_block_bitmap ..."); fsage records them as damage or an error of its
 * own, so they are dropped here rather than printed ahead of fsage's output. */
static void quiet_com_err(const char *whoami, errcode_t code, const char *fmt, va_list args) {
    (void)whoami;
    (void)code;
    (void)fmt;
    (void)args;
}

/* A second handle on the same file system for another thread: what the scan and the
 * directory pass read (superblock, group descriptors, inode bitmap). */
static errcode_t open_helper(Scanner *self, ext2_filsys *out) {
    int flags = EXT2_FLAG_64BITS | EXT2_FLAG_IGNORE_CSUM_ERRORS | EXT2_FLAG_SOFTSUPP_FEATURES;
    errcode_t r = ext2fs_open2(self->path, NULL, flags, 0, 0, unix_io_manager, out);
    if (!r) {
        watch_reads(self, *out);
        r = ext2fs_read_inode_bitmap(*out);
        if (r)
            ext2fs_close_free(out);
        else
            (*out)->flags &= ~EXT2_FLAG_IGNORE_CSUM_ERRORS;
    }
    return r;
}

/* The handle of job k (0: the scanner's own), opening helpers as needed. */
errcode_t job_handle(Scanner *self, int k, ext2_filsys *out) {
    if (k == 0) {
        *out = self->fs;
        return 0;
    }
    if (!self->helpers[k - 1]) {
        errcode_t r = open_helper(self, &self->helpers[k - 1]);
        if (r)
            return r;
    }
    *out = self->helpers[k - 1];
    return 0;
}

/* Run fn(job) for jobs 1..n-1 on threads and job 0 here; wait for all. */
void run_jobs(void *(*fn)(void *), void *jobs, size_t job_size, int n) {
    pthread_t tids[MAX_JOBS];
    int started[MAX_JOBS] = {0};
    for (int k = 1; k < n; k++)
        started[k] = pthread_create(&tids[k], NULL, fn, (char *)jobs + k * job_size) == 0;
    fn(jobs);
    for (int k = 1; k < n; k++) {
        if (started[k])
            pthread_join(tids[k], NULL);
        else
            fn((char *)jobs + k * job_size); /* no thread to be had: run it here */
    }
}

/* Every job's part of one column, joined in job order: a bytearray (numeric columns, viewed
 * by numpy) or, with as_bytes, a bytes object (names). */
PyObject *join_parts(Buf *const *parts, int n, int as_bytes) {
    size_t total = 0;
    for (int k = 0; k < n; k++)
        total += parts[k]->len;
    PyObject *out = as_bytes ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total)
                             : PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!out)
        return NULL;
    char *p = as_bytes ? PyBytes_AS_STRING(out) : PyByteArray_AS_STRING(out);
    for (int k = 0; k < n; k++) {
        if (parts[k]->len)
            memcpy(p, parts[k]->data, parts[k]->len);
        p += parts[k]->len;
    }
    return out;
}

/* ---------- object plumbing ---------- */

static int scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"path", NULL};
    PyObject *path_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&", kwlist, PyUnicode_FSConverter, &path_obj))
        return -1;
    const char *path = PyBytes_AS_STRING(path_obj);
    ext2_filsys fs = NULL;
    errcode_t r;
    /* Read-only; checksum errors are recorded per inode rather than refusing the image. */
    int flags = EXT2_FLAG_64BITS | EXT2_FLAG_IGNORE_CSUM_ERRORS | EXT2_FLAG_SOFTSUPP_FEATURES;
    Py_BEGIN_ALLOW_THREADS;
    r = ext2fs_open2(path, NULL, flags, 0, 0, unix_io_manager, &fs);
    if (!r) {
        watch_reads(self, fs);
        /* Group descriptors whose bitmaps or inode table lie outside their group (or overlap
         * other metadata) would have the scan read inodes from the wrong place: refuse the
         * file system, as e2fsck does before it uses them. */
        r = ext2fs_check_desc(fs);
        if (!r)
            r = ext2fs_read_bitmaps(fs);
        if (r) {
            ext2fs_close_free(&fs);
        } else {
            /* Opened despite checksum errors; from here on verify them, so that the scan can
             * flag each damaged inode instead of reading it silently. */
            fs->flags &= ~EXT2_FLAG_IGNORE_CSUM_ERRORS;
        }
    }
    Py_END_ALLOW_THREADS;
    if (r) {
        PyObject *msg = PyUnicode_FromFormat("opening %s", path);
        Py_DECREF(path_obj);
        if (msg) {
            fsage_raise(r, PyUnicode_AsUTF8(msg));
            Py_DECREF(msg);
        }
        return -1;
    }
    self->fs = fs;
    self->path = strdup(path);
    Py_DECREF(path_obj);
    if (!self->path) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *scanner_io_errors(Scanner *self, PyObject *noargs) {
    (void)noargs;
    return PyLong_FromLong(__atomic_load_n(&self->io_errors, __ATOMIC_RELAXED));
}

static PyObject *scanner_close(Scanner *self, PyObject *noargs) {
    (void)noargs;
    if (self->fs)
        ext2fs_close_free(&self->fs);
    for (int k = 0; k < MAX_JOBS - 1; k++)
        if (self->helpers[k])
            ext2fs_close_free(&self->helpers[k]);
    free(self->path);
    self->path = NULL;
    buf_free(&self->dirs);
    Py_RETURN_NONE;
}

static void scanner_dealloc(Scanner *self) {
    PyObject *r = scanner_close(self, NULL);
    Py_XDECREF(r);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef scanner_methods[] = {
    {"facts", (PyCFunction)scanner_facts, METH_NOARGS,
     "facts() -> dict: superblock facts, features and the group table (columns as bytes)."},
    {"scan", (PyCFunction)scanner_scan, METH_VARARGS,
     "scan(threads, progress=None) -> dict of column bytearrays for every inode in use;\n"
     "progress(done, total) is called every 0.1 s while it runs."},
    {"links", (PyCFunction)scanner_links, METH_VARARGS,
     "links(threads) -> dict: every directory entry of the directories the scan saw."},
    {"free_extents", (PyCFunction)scanner_free_extents, METH_NOARGS,
     "free_extents() -> (start, length) u64 bytes from the block bitmap."},
    {"io_errors", (PyCFunction)scanner_io_errors, METH_NOARGS,
     "io_errors() -> int: reads the device or image refused so far (all handles)."},
    {"close", (PyCFunction)scanner_close, METH_NOARGS, "Release the file system."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fsage._ext2fs.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(path): read-only scan of an ext2/3/4 image or device.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "fsage._ext2fs",
    "Read (and, offline, write) ext2/3/4 file systems through libext2fs.", -1, NULL,
};

PyMODINIT_FUNC PyInit__ext2fs(void) {
    initialize_ext2_error_table();
    set_com_err_hook(quiet_com_err);
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    fsage_Ext2fsError = PyErr_NewException("fsage._ext2fs.Ext2fsError", PyExc_Exception, NULL);
    if (!fsage_Ext2fsError || PyModule_AddObjectRef(m, "Ext2fsError", fsage_Ext2fsError) < 0 ||
        PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0 ||
        PyModule_AddFunctions(m, fsage_writer_methods) < 0 ||
        PyModule_AddFunctions(m, fsage_digest_methods) < 0 ||
        PyModule_AddFunctions(m, fsage_columns_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
