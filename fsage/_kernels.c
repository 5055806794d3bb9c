/* Loops numpy has no single call for: the text rows of `fsage show` (fsage.listing), sorting
 * names by group (the walk of fsage.analyzer.dynamic) and CSR gathers (``ranges``).
 *
 * The text rows (fsage.listing.write_text) are formatted in one pass.
 * A row is the path padded to its column, then the inode number, size and blocks right-aligned
 * in theirs, then the file's extents as logical:physical+length separated by spaces ("-" for
 * none), each column two spaces from the next. Python's `%` over 700k rows costs about a
 * second; this writes the same characters straight into one UTF-8 buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int reserve(Buf *b, size_t more) {
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + more)
        cap *= 2;
    char *p = PyMem_Realloc(b->data, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

/* v in decimal at p, right-aligned in width (wider values are written whole, as % does). */
static char *put_u64(char *p, uint64_t v, Py_ssize_t width) {
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (Py_ssize_t k = n; k < width; k++)
        *p++ = ' ';
    while (n)
        *p++ = tmp[--n];
    return p;
}

typedef struct {
    Py_buffer view;
    int held;
} Array;

static int get_array(PyObject *obj, Array *a, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    a->held = 1;
    if (a->view.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: %zd-byte items expected", what, itemsize);
        return -1;
    }
    return 0;
}

#define N_ARRAYS 8

static PyObject *text_rows(PyObject *self, PyObject *args) {
    PyObject *paths, *objs[N_ARRAYS];
    Py_ssize_t widths[4];
    int path_right;
    if (!PyArg_ParseTuple(args, "O!(nnnn)pOOOOOOOO", &PyList_Type, &paths, &widths[0], &widths[1],
                          &widths[2], &widths[3], &path_right, &objs[0], &objs[1], &objs[2],
                          &objs[3], &objs[4], &objs[5], &objs[6], &objs[7]))
        return NULL;
    static const char *names[N_ARRAYS] = {"ino",      "size",    "blocks",   "ext_start",
                                          "ext_count", "logical", "physical", "length"};
    Array arr[N_ARRAYS];
    memset(arr, 0, sizeof arr);
    Buf out = {NULL, 0, 0};
    PyObject *result = NULL;
    for (int i = 0; i < N_ARRAYS; i++)
        if (get_array(objs[i], &arr[i], 8, names[i]) < 0)
            goto done;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    for (int i = 0; i < 5; i++)
        if (arr[i].view.len / 8 != n) {
            PyErr_Format(PyExc_ValueError, "%s: one value per path expected", names[i]);
            goto done;
        }
    const uint64_t *ino = arr[0].view.buf, *size = arr[1].view.buf, *blocks = arr[2].view.buf;
    const int64_t *ext_start = arr[3].view.buf, *ext_count = arr[4].view.buf;
    const uint64_t *logical = arr[5].view.buf, *physical = arr[6].view.buf,
                   *length = arr[7].view.buf;
    Py_ssize_t n_ext = arr[5].view.len / 8;
    if (arr[6].view.len / 8 != n_ext || arr[7].view.len / 8 != n_ext) {
        PyErr_SetString(PyExc_ValueError, "extent columns of different lengths");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *path = PyList_GET_ITEM(paths, i);
        if (!PyUnicode_Check(path)) {
            PyErr_SetString(PyExc_TypeError, "paths must be str");
            goto done;
        }
        Py_ssize_t nbytes;
        const char *utf8 = PyUnicode_AsUTF8AndSize(path, &nbytes);
        if (utf8 == NULL)
            goto done;
        Py_ssize_t chars = PyUnicode_GET_LENGTH(path);
        Py_ssize_t pad = widths[0] > chars ? widths[0] - chars : 0;
        int64_t a = ext_start[i], c = ext_count[i];
        if (c < 0 || a < 0 || a + c > n_ext) {
            PyErr_SetString(PyExc_IndexError, "extent range out of bounds");
            goto done;
        }
        /* path, 3 numbers of up to 20 digits and their gaps, 62 bytes an extent, newline */
        size_t need = (size_t)(nbytes + pad) + 3 * (2 + 20) + (size_t)widths[1] + widths[2] +
                      widths[3] + 2 + (size_t)(c ? c : 1) * 63 + 1;
        if (reserve(&out, need) < 0)
            goto done;
        char *p = out.data + out.len;
        if (path_right) {
            memset(p, ' ', (size_t)pad);
            p += pad;
        }
        memcpy(p, utf8, (size_t)nbytes);
        p += nbytes;
        if (!path_right) {
            memset(p, ' ', (size_t)pad);
            p += pad;
        }
        const uint64_t cols[3] = {ino[i], size[i], blocks[i]};
        for (int k = 0; k < 3; k++) {
            *p++ = ' ';
            *p++ = ' ';
            p = put_u64(p, cols[k], widths[k + 1]);
        }
        *p++ = ' ';
        *p++ = ' ';
        if (c == 0)
            *p++ = '-';
        for (int64_t e = a; e < a + c; e++) {
            if (e > a)
                *p++ = ' ';
            p = put_u64(p, logical[e], 0);
            *p++ = ':';
            p = put_u64(p, physical[e], 0);
            *p++ = '+';
            p = put_u64(p, length[e], 0);
        }
        *p++ = '\n';
        out.len = (size_t)(p - out.data);
    }
    result = PyUnicode_DecodeUTF8(out.data ? out.data : "", (Py_ssize_t)out.len, "strict");
done:
    for (int i = 0; i < N_ARRAYS; i++)
        if (arr[i].held)
            PyBuffer_Release(&arr[i].view);
    PyMem_Free(out.data);
    return result;
}

/* ---------- sorting byte strings ---------- */

typedef struct {
    int64_t group;
    const unsigned char *p;
    Py_ssize_t len;
    Py_ssize_t index;
} Key;

/* By group, then the bytes (a prefix first), then position: a stable sort's order. */
static int key_cmp(const void *x, const void *y) {
    const Key *a = x, *b = y;
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    Py_ssize_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->p, b->p, (size_t)n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->index < b->index ? -1 : (a->index > b->index);
}

static PyObject *sorted_order(Key *keys, Py_ssize_t n) {
    qsort(keys, (size_t)n, sizeof(Key), key_cmp);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL)
        return NULL;
    int64_t *o = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++)
        o[i] = keys[i].index;
    return out;
}

static PyObject *argsort_names(PyObject *self, PyObject *args) {
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3]))
        return NULL;
    static const char *what[4] = {"group", "names", "name_off", "which"};
    static const Py_ssize_t sizes[4] = {8, 1, 8, 8};
    Array arr[4];
    memset(arr, 0, sizeof arr);
    Key *keys = NULL;
    PyObject *result = NULL;
    for (int i = 0; i < 4; i++)
        if (get_array(objs[i], &arr[i], sizes[i], what[i]) < 0)
            goto done;
    Py_ssize_t n = arr[0].view.len / 8, n_names = arr[2].view.len / 8 - 1;
    if (arr[3].view.len / 8 != n || n_names < 0) {
        PyErr_SetString(PyExc_ValueError, "group and which differ in length");
        goto done;
    }
    const int64_t *group = arr[0].view.buf, *which = arr[3].view.buf;
    const uint64_t *off = arr[2].view.buf;
    const unsigned char *names = arr[1].view.buf;
    keys = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Key));
    if (keys == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t w = which[i];
        if (w < 0 || w >= n_names || off[w] > off[w + 1] ||
            off[w + 1] > (uint64_t)arr[1].view.len) {
            PyErr_SetString(PyExc_IndexError, "name out of bounds");
            goto done;
        }
        keys[i] = (Key){group[i], names + off[w], (Py_ssize_t)(off[w + 1] - off[w]), i};
    }
    result = sorted_order(keys, n);
done:
    for (int i = 0; i < 4; i++)
        if (arr[i].held)
            PyBuffer_Release(&arr[i].view);
    PyMem_Free(keys);
    return result;
}

/* ---------- CSR gathers ---------- */

static PyObject *ranges(PyObject *self, PyObject *args) {
    PyObject *lo_obj, *hi_obj;
    if (!PyArg_ParseTuple(args, "OO", &lo_obj, &hi_obj))
        return NULL;
    Array arr[2];
    memset(arr, 0, sizeof arr);
    PyObject *result = NULL;
    if (get_array(lo_obj, &arr[0], 8, "lo") < 0 || get_array(hi_obj, &arr[1], 8, "hi") < 0)
        goto done;
    Py_ssize_t n = arr[0].view.len / 8;
    if (arr[1].view.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "lo and hi differ in length");
        goto done;
    }
    const int64_t *lo = arr[0].view.buf, *hi = arr[1].view.buf;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (hi[i] > lo[i])
            total += hi[i] - lo[i];
    result = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(total * 8));
    if (result == NULL)
        goto done;
    int64_t *out = (int64_t *)PyByteArray_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++)
        for (int64_t v = lo[i]; v < hi[i]; v++)
            *out++ = v;
done:
    for (int i = 0; i < 2; i++)
        if (arr[i].held)
            PyBuffer_Release(&arr[i].view);
    return result;
}

static PyMethodDef methods[] = {
    {"ranges", ranges, METH_VARARGS,
     "ranges(lo, hi) -> bytearray of int64: lo[0]..hi[0]-1, lo[1]..hi[1]-1, ... (int64 arrays;\n"
     "an empty range where hi <= lo)."},
    {"argsort_names", argsort_names, METH_VARARGS,
     "argsort_names(group, names, name_off, which) -> bytes of int64: the stable order of\n"
     "(group[i], the bytes of name which[i]), names being names[name_off[k]:name_off[k+1]]."},
    {"text_rows", text_rows, METH_VARARGS,
     "text_rows(paths, (path_width, ino_width, size_width, blocks_width), path_right, ino, size,\n"
     "blocks, ext_start, ext_count, logical, physical, length) -> str: one line a path (8-byte\n"
     "integer arrays; ext_start/ext_count index the extent columns)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fsage._kernels", "Loops numpy has no single call for.", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
