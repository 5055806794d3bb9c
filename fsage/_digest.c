/* Per-file digests over Layout columns, in one pass: the C twin of
 * fsage.db.codec.file_digests_numpy, which defines the digest and checks this code in the
 * tests. A digest mixes a file's inode fields, extents, metadata blocks and names (with the
 * directories holding them) so that the store can tell changed files without comparing them.
 */
#include "_ext2fs.h"

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
 * columns: a sequence of u64 arrays of n values, the first being the inode numbers; link_file:
 * the file row of each link (u64, all ones for a link to no listed file). */
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
    Arg a[12];
    memset(a, 0, sizeof a);
    PyObject *out = NULL;
    if (!colv || ncols < 1) {
        PyErr_SetString(PyExc_ValueError, "need at least the inode-number column");
        goto done;
    }
    if (get_u64(PySequence_Fast_GET_ITEM(cols, 0), &colv[0], -1, "ino"))
        goto done;
    Py_ssize_t n = colv[0].view.len / 8;
    for (Py_ssize_t c = 1; c < ncols; c++)
        if (get_u64(PySequence_Fast_GET_ITEM(cols, c), &colv[c], n, "column"))
            goto done;
    static const char *names_of[12] = {"ext_off", "ext_l", "ext_p", "ext_n", "ext_f",
                                       "meta_off", "meta_p", "meta_k", "link_file",
                                       "link_parent", "name_off", "names"};
    for (int k = 0; k < 11; k++)
        if (get_u64(objs[k], &a[k], -1, names_of[k]))
            goto done;
    if (PyObject_GetBuffer(objs[11], &a[11].view, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    a[11].held = 1;

    const uint64_t *ext_off = a[0].view.buf, *el = a[1].view.buf, *ep = a[2].view.buf,
                   *en = a[3].view.buf, *ef = a[4].view.buf, *meta_off = a[5].view.buf,
                   *mp = a[6].view.buf, *mk = a[7].view.buf, *link_file = a[8].view.buf,
                   *parent = a[9].view.buf, *name_off = a[10].view.buf;
    const unsigned char *names = a[11].view.buf;
    Py_ssize_t n_ext = a[1].view.len / 8, n_meta = a[6].view.len / 8, n_links = a[8].view.len / 8;
    if (a[0].view.len != (n + 1) * 8 || a[5].view.len != (n + 1) * 8 ||
        a[2].view.len != n_ext * 8 || a[3].view.len != n_ext * 8 || a[4].view.len != n_ext * 8 ||
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
    for (Py_ssize_t k = 0; k < n_links; k++) {
        uint64_t f = link_file[k];
        if (f >= (uint64_t)n)
            continue;
        uint64_t s = 0, p = 1;
        for (uint64_t b = name_off[k]; b < name_off[k + 1]; b++) {
            s += (uint64_t)(names[b] + 1) * p;
            p *= NAME_PRIME;
        }
        name_sum[f] += combine(mix(s + (name_off[k + 1] - name_off[k])), parent[k]);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint64_t *ino = colv[0].view.buf;
        uint64_t x = mix(ino[i]);
        for (Py_ssize_t c = 1; c < ncols; c++)
            x = combine(x, ((const uint64_t *)colv[c].view.buf)[i]);
        uint64_t es = 0;
        for (uint64_t e = ext_off[i]; e < ext_off[i + 1] && e < (uint64_t)n_ext; e++)
            es += combine(combine(combine(mix(el[e]), ep[e]), en[e]), ef[e]);
        x = combine(x, es);
        x = combine(x, ext_off[i + 1] - ext_off[i]);
        uint64_t ms = 0;
        for (uint64_t m = meta_off[i]; m < meta_off[i + 1] && m < (uint64_t)n_meta; m++)
            ms += combine(mix(mp[m]), mk[m]);
        x = combine(x, ms);
        h[i] = combine(x, name_sum[i]);
    }
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
    Py_DECREF(cols);
    return out;
}

PyMethodDef fsage_digest_methods[] = {
    {"file_digests", file_digests, METH_VARARGS,
     "Per-file 64-bit digests over Layout columns (see fsage.db.codec.file_digests)."},
    {NULL, NULL, 0, NULL},
};
