/* Per-file digests over Layout columns, in one pass: the C twin of
 * fsage.db.codec.file_digests_numpy, which defines the digest and checks this code in the
 * tests. A digest mixes a file's inode fields, extents, metadata blocks and names (with the
 * directories holding them) so that the store can tell changed files without comparing them.
 */
#include "_ext2fs.h"

#include <pthread.h>
#include <stdint.h>

static inline uint64_t mix(uint64_t x) { /* splitmix64's finaliser */
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static inline uint64_t combine(uint64_t h, uint64_t v) { return mix(h * 0x9E3779B97F4A7C15ULL + v); }

#define NAME_PRIME 1099511628211ULL

typedef struct {
    Py_buffer view;
    int held;
} Arg;

/* An inode column: 8-byte values, or 4-byte ones (widened as numpy's astype(uint64) would:
 * signed ones sign-extended), which spares the caller a widened copy of each. */
typedef struct {
    const void *v;
    int wide, is_signed;
} Col;

static inline uint64_t col_at(const Col *c, Py_ssize_t i) {
    if (c->wide)
        return ((const uint64_t *)c->v)[i];
    if (c->is_signed)
        return (uint64_t)(int64_t)((const int32_t *)c->v)[i];
    return ((const uint32_t *)c->v)[i];
}

static int get_col(PyObject *obj, Arg *a, Col *c, Py_ssize_t want, const char *what) {
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    a->held = 1;
    Py_ssize_t size = a->view.itemsize;
    const char *f = a->view.format ? a->view.format : "B";
    while (*f == '<' || *f == '=' || *f == '@')
        f++;
    if ((size != 4 && size != 8) || a->view.len != want * size) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd values of 4 or 8 bytes", what, want);
        return -1;
    }
    c->v = a->view.buf;
    c->wide = size == 8;
    c->is_signed = strchr("bhilq", *f) != NULL;
    return 0;
}

static int get_u64(PyObject *obj, Arg *a, Py_ssize_t want, const char *what) {
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    a->held = 1;
    if (want >= 0 && a->view.len != want * 8) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd u64 values", what, want);
        return -1;
    }
    if (a->view.len % 8) {
        PyErr_Format(PyExc_ValueError, "%s: not a u64 array", what);
        return -1;
    }
    return 0;
}

/* file_digests(columns, ext_off, ext_l, ext_p, ext_n, ext_f, meta_off, meta_p, meta_k,
 *              link_file, link_parent, name_off, names) -> bytes of n u64
 * columns: a sequence of arrays of n values, the first being the inode numbers (u64), the
 * others of 4 or 8 bytes; ext_f likewise 4 or 8 bytes; link_file: the file row of each link
 * (u64, all ones for a link to no listed file). */

/* The names of each file, summed (the links in any order); a thread of its own when large. */
typedef struct {
    const uint64_t *link_file, *parent, *name_off;
    const unsigned char *names;
    Py_ssize_t n, n_links;
    uint64_t *name_sum;
} NameJob;

static void *sum_names(void *arg) {
    const NameJob *j = arg;
    for (Py_ssize_t k = 0; k < j->n_links; k++) {
        uint64_t f = j->link_file[k];
        if (f >= (uint64_t)j->n)
            continue;
        uint64_t s = 0, p = 1;
        for (uint64_t b = j->name_off[k]; b < j->name_off[k + 1]; b++) {
            s += (uint64_t)(j->names[b] + 1) * p;
            p *= NAME_PRIME;
        }
        j->name_sum[f] += combine(mix(s + (j->name_off[k + 1] - j->name_off[k])), j->parent[k]);
    }
    return NULL;
}

#define PARALLEL_FILES (1 << 16)
static PyObject *file_digests(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cols_obj, *objs[12];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOO", &cols_obj, &objs[0], &objs[1], &objs[2],
                          &objs[3], &objs[4], &objs[5], &objs[6], &objs[7], &objs[8], &objs[9],
                          &objs[10], &objs[11]))
        return NULL;
    PyObject *cols = PySequence_Fast(cols_obj, "columns must be a sequence");
    if (!cols)
        return NULL;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(cols);
    Arg *colv = calloc((size_t)ncols + 1, sizeof(Arg));
    Col *colp = calloc((size_t)ncols + 1, sizeof(Col));
    Arg a[12];
    memset(a, 0, sizeof a);
    PyObject *out = NULL;
    if (!colv || !colp || ncols < 1) {
        PyErr_SetString(PyExc_ValueError, "need at least the inode-number column");
        goto done;
    }
    if (get_u64(PySequence_Fast_GET_ITEM(cols, 0), &colv[0], -1, "ino"))
        goto done;
    Py_ssize_t n = colv[0].view.len / 8;
    for (Py_ssize_t c = 1; c < ncols; c++)
        if (get_col(PySequence_Fast_GET_ITEM(cols, c), &colv[c], &colp[c], n, "column"))
            goto done;
    static const char *names_of[12] = {"ext_off", "ext_l", "ext_p", "ext_n", "ext_f",
                                       "meta_off", "meta_p", "meta_k", "link_file",
                                       "link_parent", "name_off", "names"};
    for (int k = 0; k < 11; k++)
        if (k != 4 && get_u64(objs[k], &a[k], -1, names_of[k]))
            goto done;
    Py_ssize_t n_ext = a[1].view.len / 8, n_meta = a[6].view.len / 8, n_links = a[8].view.len / 8;
    Col ef;
    if (get_col(objs[4], &a[4], &ef, n_ext, "ext_f"))
        goto done;
    if (PyObject_GetBuffer(objs[11], &a[11].view, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    a[11].held = 1;

    const uint64_t *ext_off = a[0].view.buf, *el = a[1].view.buf, *ep = a[2].view.buf,
                   *en = a[3].view.buf, *meta_off = a[5].view.buf, *mp = a[6].view.buf,
                   *mk = a[7].view.buf, *link_file = a[8].view.buf, *parent = a[9].view.buf,
                   *name_off = a[10].view.buf;
    const unsigned char *names = a[11].view.buf;
    if (a[0].view.len != (n + 1) * 8 || a[5].view.len != (n + 1) * 8 ||
        a[2].view.len != n_ext * 8 || a[3].view.len != n_ext * 8 ||
        a[7].view.len != n_meta * 8 || a[9].view.len != n_links * 8 ||
        a[10].view.len != (n_links + 1) * 8 || (n > 0 && ext_off[n] > (uint64_t)n_ext) ||
        (n > 0 && meta_off[n] > (uint64_t)n_meta) ||
        name_off[n_links] > (uint64_t)a[11].view.len) {
        PyErr_SetString(PyExc_ValueError, "file_digests: inconsistent array lengths");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!out)
        goto done;
    uint64_t *h = (uint64_t *)PyBytes_AS_STRING(out);
    uint64_t *name_sum = calloc((size_t)n + 1, sizeof(uint64_t));
    if (!name_sum) {
        Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    /* The names on a second thread while this one does the rest; they meet at the end. */
    NameJob names_job = {link_file, parent, name_off, names, n, n_links, name_sum};
    pthread_t helper;
    int helped = n >= PARALLEL_FILES && pthread_create(&helper, NULL, sum_names, &names_job) == 0;
    if (!helped)
        sum_names(&names_job);
    const uint64_t *ino = colv[0].view.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        h[i] = mix(ino[i]);
    for (Py_ssize_t c = 1; c < ncols; c++) /* column by column: one stream each */
        for (Py_ssize_t i = 0; i < n; i++)
            h[i] = combine(h[i], col_at(&colp[c], i));
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t x = h[i];
        uint64_t es = 0;
        for (uint64_t e = ext_off[i]; e < ext_off[i + 1] && e < (uint64_t)n_ext; e++)
            es += combine(combine(combine(mix(el[e]), ep[e]), en[e]), col_at(&ef, (Py_ssize_t)e));
        x = combine(x, es);
        x = combine(x, ext_off[i + 1] - ext_off[i]);
        uint64_t ms = 0;
        for (uint64_t m = meta_off[i]; m < meta_off[i + 1] && m < (uint64_t)n_meta; m++)
            ms += combine(mix(mp[m]), mk[m]);
        h[i] = combine(x, ms);
    }
    if (helped)
        pthread_join(helper, NULL);
    for (Py_ssize_t i = 0; i < n; i++)
        h[i] = combine(h[i], name_sum[i]);
    Py_END_ALLOW_THREADS;
    free(name_sum);
done:
    for (Py_ssize_t c = 0; colv && c < ncols; c++)
        if (colv[c].held)
            PyBuffer_Release(&colv[c].view);
    for (int k = 0; k < 12; k++)
        if (a[k].held)
            PyBuffer_Release(&a[k].view);
    free(colv);
    free(colp);
    Py_DECREF(cols);
    return out;
}

PyMethodDef fsage_digest_methods[] = {
    {"file_digests", file_digests, METH_VARARGS,
     "Per-file 64-bit digests over Layout columns (see fsage.db.codec.file_digests)."},
    {NULL, NULL, 0, NULL},
};
