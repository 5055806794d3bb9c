/* Narrow column encoding for the store's version chunks (fsage.db.codec).
 *
 * Each integer column is stored as its values minus their minimum, in as few little-endian
 * bytes as the largest difference needs (0 to 8), optionally after taking differences of
 * consecutive values (for nearly sorted columns such as inode numbers). Most columns of a
 * file system need one to four bytes a value instead of eight, so a snapshot writes (and
 * SQLite copies, checkpoints and syncs) about half the bytes. One pass to find the range, one
 * to write: numpy would need several passes and temporaries per column.
 *
 * A column on the wire: u64 count, i64 first (the first value, delta columns only), i64 base,
 * u8 width, u8 flags (bit 0: delta), then count * width bytes.
 */
#include "_ext2fs.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define HEADER_BYTES 26
#define SLACK 8 /* room past the end for the last value's 8-byte store */
#define FLAG_DELTA 1u

typedef struct {
    Py_buffer view;
    int held;
    int is_signed;
} Column;

/* Per element type: the range of the (delta) values, then their narrowed bytes. Typed loops
 * let the compiler keep the element type out of the inner loop. */
#define KERNELS(T)                                                                                 \
    static void range_##T(const T *v, Py_ssize_t n, int delta, int64_t *lo, int64_t *hi) {         \
        if (n == 0) {                                                                              \
            *lo = *hi = 0;                                                                         \
            return;                                                                                \
        }                                                                                          \
        if (!delta) { /* a plain min/max the compiler can vectorise */                             \
            int64_t a = (int64_t)v[0], b = a;                                                      \
            for (Py_ssize_t i = 1; i < n; i++) {                                                   \
                int64_t x = (int64_t)v[i];                                                         \
                a = x < a ? x : a;                                                                 \
                b = x > b ? x : b;                                                                 \
            }                                                                                      \
            *lo = a;                                                                               \
            *hi = b;                                                                               \
            return;                                                                                \
        }                                                                                          \
        int64_t a = 0, b = 0; /* the first difference is 0 */                                      \
        for (Py_ssize_t i = 1; i < n; i++) {                                                       \
            int64_t y = (int64_t)((uint64_t)(int64_t)v[i] - (uint64_t)(int64_t)v[i - 1]);          \
            a = y < a ? y : a;                                                                     \
            b = y > b ? y : b;                                                                     \
        }                                                                                          \
        *lo = a;                                                                                   \
        *hi = b;                                                                                   \
    }                                                                                              \
    static unsigned char *write_##T(const T *v, Py_ssize_t n, int delta, uint64_t first,           \
                                    uint64_t base, int w, unsigned char *p) {                      \
        if (w == 0)                                                                                \
            return p;                                                                              \
        uint64_t prev = first;                                                                     \
        for (Py_ssize_t i = 0; i < n; i++) {                                                       \
            uint64_t x = (uint64_t)(int64_t)v[i];                                                  \
            uint64_t y = (delta ? x - prev : x) - base;                                            \
            prev = x;                                                                              \
            memcpy(p, &y, 8); /* the next value overwrites the bytes past w; see SLACK */          \
            p += w;                                                                                \
        }                                                                                          \
        return p;                                                                                  \
    }

KERNELS(int8_t)
KERNELS(uint8_t)
KERNELS(int16_t)
KERNELS(uint16_t)
KERNELS(int32_t)
KERNELS(uint32_t)
KERNELS(uint64_t)

/* Dispatch on a column's element type (8-byte columns need no sign extension). */
#define BY_TYPE(c, call)                                                                           \
    switch ((c)->view.itemsize * 2 + (c)->is_signed) {                                             \
    case 2:                                                                                        \
        call(uint8_t);                                                                             \
        break;                                                                                     \
    case 3:                                                                                        \
        call(int8_t);                                                                              \
        break;                                                                                     \
    case 4:                                                                                        \
        call(uint16_t);                                                                            \
        break;                                                                                     \
    case 5:                                                                                        \
        call(int16_t);                                                                             \
        break;                                                                                     \
    case 8:                                                                                        \
        call(uint32_t);                                                                            \
        break;                                                                                     \
    case 9:                                                                                        \
        call(int32_t);                                                                             \
        break;                                                                                     \
    default:                                                                                       \
        call(uint64_t);                                                                            \
    }

static int column_open(PyObject *obj, Column *c) {
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    c->held = 1;
    const char *f = c->view.format ? c->view.format : "B";
    while (*f == '<' || *f == '=' || *f == '@')
        f++;
    Py_ssize_t size = c->view.itemsize;
    if (strlen(f) != 1 || !strchr("?bBhHiIlLqQ", *f) || (size != 1 && size != 2 && size != 4 &&
                                                          size != 8)) {
        PyErr_Format(PyExc_TypeError, "pack_columns: unsupported column format '%s'", f);
        return -1;
    }
    c->is_signed = strchr("bhilq", *f) != NULL;
    return 0;
}

static int width_of(uint64_t range) {
    int w = 0;
    while (range) {
        w++;
        range >>= 8;
    }
    return w;
}

/* What pack_columns works on; the column passes share it between two threads. */
typedef struct {
    const Column *cols;
    Py_ssize_t ncols;
    const int *delta;
    uint64_t *first, *base;
    int *width;
    size_t *at;         /* where each column's values start in out (write pass) */
    unsigned char *out; /* NULL in the range pass */
    Py_ssize_t next;    /* the next column to take (atomic) */
} PackJob;

static void pack_range(PackJob *j, Py_ssize_t k) {
    const Column *c = &j->cols[k];
    Py_ssize_t n = c->view.len / c->view.itemsize;
    int64_t lo = 0, hi = 0;
#define RANGE(T)                                                                                   \
    do {                                                                                           \
        const T *v = c->view.buf;                                                                  \
        j->first[k] = j->delta[k] && n ? (uint64_t)(int64_t)v[0] : 0;                              \
        range_##T(v, n, j->delta[k], &lo, &hi);                                                    \
    } while (0)
    BY_TYPE(c, RANGE);
#undef RANGE
    j->base[k] = (uint64_t)lo;
    j->width[k] = width_of((uint64_t)hi - (uint64_t)lo);
}

static void pack_write(PackJob *j, Py_ssize_t k) {
    const Column *c = &j->cols[k];
    Py_ssize_t n = c->view.len / c->view.itemsize;
    unsigned char *p = j->out + j->at[k];
#define WRITE(T) write_##T(c->view.buf, n, j->delta[k], j->first[k], j->base[k], j->width[k], p)
    BY_TYPE(c, WRITE);
#undef WRITE
}

/* Take columns until none is left (the range pass, or the write pass when out is set). */
static void *pack_worker(void *arg) {
    PackJob *j = arg;
    for (;;) {
        Py_ssize_t k = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (k >= j->ncols)
            return NULL;
        if (j->out)
            pack_write(j, k);
        else
            pack_range(j, k);
    }
}

/* A column pass on this thread and, for large inputs, one more. */
#define PARALLEL_VALUES (1 << 16)
static void pack_pass(PackJob *j, size_t values) {
    j->next = 0;
    pthread_t helper;
    int helped = values >= PARALLEL_VALUES && j->ncols > 1 &&
                 pthread_create(&helper, NULL, pack_worker, j) == 0;
    pack_worker(j);
    if (helped)
        pthread_join(helper, NULL);
}

/* pack_columns([(array, delta), ...]) -> bytes */
static PyObject *pack_columns(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *seq = PySequence_Fast(arg, "pack_columns needs a sequence of (array, delta)");
    if (!seq)
        return NULL;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    Column *cols = calloc((size_t)ncols + 1, sizeof(Column));
    int *delta = calloc((size_t)ncols + 1, sizeof(int));
    uint64_t *first = calloc((size_t)ncols + 1, sizeof(uint64_t));
    uint64_t *base = calloc((size_t)ncols + 1, sizeof(uint64_t));
    int *width = calloc((size_t)ncols + 1, sizeof(int));
    size_t *at = calloc((size_t)ncols + 1, sizeof(size_t));
    PyObject *out = NULL;
    if (!cols || !delta || !first || !base || !width || !at) {
        PyErr_NoMemory();
        goto done;
    }
    size_t values = 0;
    for (Py_ssize_t k = 0; k < ncols; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        PyObject *arr;
        if (!PyArg_ParseTuple(item, "Op", &arr, &delta[k]))
            goto done;
        if (column_open(arr, &cols[k]))
            goto done;
        values += (size_t)(cols[k].view.len / cols[k].view.itemsize);
    }
    PackJob job = {cols, ncols, delta, first, base, width, at, NULL, 0};
    Py_BEGIN_ALLOW_THREADS;
    pack_pass(&job, values);
    Py_END_ALLOW_THREADS;
    size_t total = 0;
    for (Py_ssize_t k = 0; k < ncols; k++) {
        Py_ssize_t n = cols[k].view.len / cols[k].view.itemsize;
        at[k] = total + HEADER_BYTES;
        total += HEADER_BYTES + (size_t)n * (size_t)width[k];
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total + SLACK));
    if (!out)
        goto done;
    job.out = (unsigned char *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS;
    pack_pass(&job, values);
    /* The headers last: each column's last 8-byte store spills into the next header. */
    for (Py_ssize_t k = 0; k < ncols; k++) {
        unsigned char *p = job.out + at[k] - HEADER_BYTES;
        uint64_t n = (uint64_t)(cols[k].view.len / cols[k].view.itemsize);
        memcpy(p, &n, 8); /* the wire is little-endian, as is every machine fsage builds on */
        memcpy(p + 8, &first[k], 8);
        memcpy(p + 16, &base[k], 8);
        p[24] = (unsigned char)width[k];
        p[25] = delta[k] ? FLAG_DELTA : 0;
    }
    Py_END_ALLOW_THREADS;
    if (_PyBytes_Resize(&out, (Py_ssize_t)total) < 0) /* drop the slack; out is NULL on error */
        goto done;
done:
    if (cols)
        for (Py_ssize_t k = 0; k < ncols; k++)
            if (cols[k].held)
                PyBuffer_Release(&cols[k].view);
    free(cols);
    free(delta);
    free(first);
    free(base);
    free(width);
    free(at);
    Py_DECREF(seq);
    return out;
}

/* One column's values into items of type T (the low bytes of each, little-endian). Typed
 * loops, 8-byte loads while 8 bytes remain, and the delta test outside the loop let the
 * compiler keep the per-value work to a load, a mask, an add and a store. */
#define UNPACK(T)                                                                                  \
    static void unpack_##T(const unsigned char *p, const unsigned char *end, uint64_t n, int w,    \
                           uint64_t base, uint64_t first, int is_delta, unsigned char *out) {     \
        T *q = (T *)out;                                                                           \
        uint64_t mask = w == 8 ? ~0ULL : (1ULL << (8 * w)) - 1;                                    \
        uint64_t fast = 0; /* values whose 8-byte load stays inside the blob */                   \
        if (w && end - p >= 8)                                                                     \
            fast = ((uint64_t)(end - p) - 8) / (uint64_t)w + 1;                                    \
        if (w == 0)                                                                                \
            fast = n;                                                                              \
        if (fast > n)                                                                              \
            fast = n;                                                                              \
        uint64_t prev = first, i = 0;                                                              \
        if (!is_delta && w) {                                                                      \
            for (; i < fast; i++) {                                                                \
                uint64_t y;                                                                        \
                memcpy(&y, p + i * (uint64_t)w, 8);                                                \
                q[i] = (T)((y & mask) + base);                                                     \
            }                                                                                      \
        }                                                                                          \
        for (; i < fast; i++) {                                                                    \
            uint64_t y = 0;                                                                        \
            if (w)                                                                                 \
                memcpy(&y, p + i * (uint64_t)w, 8);                                                \
            uint64_t x = (y & mask) + base;                                                        \
            if (is_delta) {                                                                        \
                x = i ? prev + x : first;                                                          \
                prev = x;                                                                          \
            }                                                                                      \
            q[i] = (T)x;                                                                           \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            const unsigned char *v = p + i * (uint64_t)w;                                          \
            uint64_t y = 0;                                                                        \
            for (int b = 0; b < w; b++)                                                            \
                y |= (uint64_t)v[b] << (8 * b);                                                    \
            uint64_t x = y + base;                                                                 \
            if (is_delta) {                                                                        \
                x = i ? prev + x : first;                                                          \
                prev = x;                                                                          \
            }                                                                                      \
            q[i] = (T)x;                                                                           \
        }                                                                                          \
    }
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
UNPACK(u8)
UNPACK(u16)
UNPACK(u32)
UNPACK(u64)

/* unpack_columns(blob, itemsizes) -> [bytearray, ...]: the columns of a blob from
 * pack_columns, each written as little-endian values of the given byte size (1, 2, 4 or 8). */
static PyObject *unpack_columns(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer blob;
    PyObject *sizes_obj;
    if (!PyArg_ParseTuple(args, "y*O", &blob, &sizes_obj))
        return NULL;
    PyObject *sizes = PySequence_Fast(sizes_obj, "itemsizes must be a sequence");
    PyObject *out = NULL;
    if (!sizes)
        goto fail;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(sizes);
    out = PyList_New(ncols);
    if (!out)
        goto fail;
    const unsigned char *p = blob.buf, *end = p + blob.len;
    for (Py_ssize_t k = 0; k < ncols; k++) {
        long size = PyLong_AsLong(PySequence_Fast_GET_ITEM(sizes, k));
        if (size != 1 && size != 2 && size != 4 && size != 8) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "itemsizes must be 1, 2, 4 or 8");
            goto fail;
        }
        if (end - p < HEADER_BYTES)
            goto corrupt;
        uint64_t n, first, base;
        memcpy(&n, p, 8);
        memcpy(&first, p + 8, 8);
        memcpy(&base, p + 16, 8);
        int w = p[24], is_delta = p[25] & FLAG_DELTA;
        p += HEADER_BYTES;
        if (w > 8 || (w && n > (uint64_t)(end - p) / (uint64_t)w) || n > (uint64_t)PY_SSIZE_T_MAX / 8)
            goto corrupt;
        PyObject *col = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * (uint64_t)size));
        if (!col)
            goto fail;
        PyList_SET_ITEM(out, k, col);
        unsigned char *q = (unsigned char *)PyByteArray_AS_STRING(col);
        Py_BEGIN_ALLOW_THREADS;
        switch (size) {
        case 1:
            unpack_u8(p, end, n, w, base, first, is_delta, q);
            break;
        case 2:
            unpack_u16(p, end, n, w, base, first, is_delta, q);
            break;
        case 4:
            unpack_u32(p, end, n, w, base, first, is_delta, q);
            break;
        default:
            unpack_u64(p, end, n, w, base, first, is_delta, q);
        }
        p += n * (uint64_t)w;
        Py_END_ALLOW_THREADS;
    }
    if (p != end)
        goto corrupt;
    Py_DECREF(sizes);
    PyBuffer_Release(&blob);
    return out;
corrupt:
    PyErr_SetString(PyExc_ValueError, "corrupt column blob");
fail:
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    PyBuffer_Release(&blob);
    return NULL;
}

PyMethodDef fsage_columns_methods[] = {
    {"pack_columns", pack_columns, METH_O,
     "pack_columns([(array, delta), ...]) -> bytes: integer columns, narrowed."},
    {"unpack_columns", unpack_columns, METH_VARARGS,
     "unpack_columns(blob, itemsizes) -> [bytearray]: the columns of a pack_columns blob."},
    {NULL, NULL, 0, NULL},
};
