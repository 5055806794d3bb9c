/*
 * The executor's side that speaks to Python (fsage._posixexec): an Op's fields read into
 * OpArgs, an op run on the calling thread, its failure raised as posix.py's exception, and
 * its line appended to the journal.
 */
#include "_posixexec.h"

const char *const KIND_NAMES[K_OTHER] = {"create",    "append", "overwrite", "truncate",
                                         "punch",     "fallocate", "mkdir",  "delete",
                                         "rename",    "link",   "setattr"};

static enum kind classify(PyObject *s) {
    Py_ssize_t n;
    const char *k = PyUnicode_AsUTF8AndSize(s, &n);
    if (k == NULL) {
        PyErr_Clear();
        return K_OTHER;
    }
    for (int i = 0; i < K_OTHER; i++)
        if (strcmp(k, KIND_NAMES[i]) == 0 && (Py_ssize_t)strlen(k) == n) return (enum kind)i;
    return K_OTHER;
}

/* The bytes of a path as os functions pass them (UTF-8 with surrogateescape). */
int path_bytes(PyObject *s, const char **p, Py_ssize_t *n, PyObject **tmp) {
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "op paths must be str");
        return -1;
    }
    if (PyUnicode_IS_ASCII(s)) {
        *p = PyUnicode_AsUTF8AndSize(s, n);
        if (*p == NULL) return -1;
    } else {
        *tmp = PyUnicode_EncodeFSDefault(s);
        if (*tmp == NULL) return -1;
        *p = PyBytes_AS_STRING(*tmp);
        *n = PyBytes_GET_SIZE(*tmp);
    }
    if ((Py_ssize_t)strlen(*p) != *n) {
        PyErr_SetString(PyExc_ValueError, "embedded null byte");
        return -1;
    }
    return 0;
}

void args_release(OpArgs *a) {
    Py_XDECREF(a->kind_obj);
    Py_XDECREF(a->path_obj);
    Py_XDECREF(a->dest_obj);
    Py_XDECREF(a->label_obj);
    Py_XDECREF(a->tmp_path);
    Py_XDECREF(a->tmp_dest);
}

PyObject *S_op, *S_path, *S_dest, *S_size, *S_offset, *S_label, *S_fd, *S_add, *S_mode,
    *S_mtime_ns;

/* An optional integer attribute (None: not set); -1 with an exception on error. */
static int get_optional(PyObject *op, PyObject *attr, int *has, long long *out) {
    PyObject *v = PyObject_GetAttr(op, attr);
    if (v == NULL) return -1;
    *has = v != Py_None;
    if (*has) {
        *out = PyLong_AsLongLong(v);
        if (*out == -1 && PyErr_Occurred()) {
            Py_DECREF(v);
            return -1;
        }
    }
    Py_DECREF(v);
    return 0;
}

static long long get_ll(PyObject *op, PyObject *attr, int *bad) {
    PyObject *v = PyObject_GetAttr(op, attr);
    if (v == NULL) {
        *bad = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) *bad = 1;
    return x;
}

int args_read(OpArgs *a, PyObject *op) {
    memset(a, 0, sizeof(*a));
    a->kind_obj = PyObject_GetAttr(op, S_op);
    if (a->kind_obj == NULL) return -1;
    a->kind = PyUnicode_Check(a->kind_obj) ? classify(a->kind_obj) : K_OTHER;
    if (a->kind == K_OTHER) return 0;
    a->path_obj = PyObject_GetAttr(op, S_path);
    a->dest_obj = PyObject_GetAttr(op, S_dest);
    a->label_obj = PyObject_GetAttr(op, S_label);
    if (a->path_obj == NULL || a->dest_obj == NULL || a->label_obj == NULL) return -1;
    int bad = 0;
    a->size = get_ll(op, S_size, &bad);
    if (!bad) a->offset = get_ll(op, S_offset, &bad);
    if (bad) return -1;
    if (path_bytes(a->path_obj, &a->path, &a->plen, &a->tmp_path) < 0) return -1;
    if (a->kind == K_RENAME || a->kind == K_LINK)
        if (path_bytes(a->dest_obj, &a->dest, &a->dlen, &a->tmp_dest) < 0) return -1;
    if (a->kind == K_SETATTR
        && (get_optional(op, S_mode, &a->attrs.has_mode, &a->attrs.mode) < 0
            || get_optional(op, S_mtime_ns, &a->attrs.has_mtime, &a->attrs.mtime_ns) < 0))
        return -1;
    return 0;
}

/* The exception of an op that failed with ``rc`` (see ERR_*), as posix.py reports it. */
void raise_rc(Exec *ex, int rc, PyObject *kind, PyObject *path) {
    if (rc == ERR_UNSAFE) raise_unsafe(ex);
    else if (rc == ERR_NOTREG) PyErr_Format(ex->failed_exc, "%R is not a regular file", path);
    else if (rc == ERR_NOMEM) PyErr_NoMemory();
    else if (is_nospace(ex->err)) {
        enum kind k = classify(kind);
        if ((k == K_CREATE || k == K_MKDIR) && ex->inode_check != NULL) {
            /* Out of inodes rather than blocks: the check raises its own error. */
            PyObject *r = PyObject_CallFunctionObjArgs(ex->inode_check, kind, path, NULL);
            if (r == NULL) return;
            Py_DECREF(r);
        }
        PyErr_Format(ex->nospace_exc, "%U %U: no space left", kind, path);
    }
    else PyErr_Format(ex->failed_exc, "%U %R: %s", kind, path, strerror(ex->err));
}

/* Run ``op`` on the calling thread; the bytes of file data written, or -1 with an exception
 * set. */
long long apply_op(Exec *ex, PyObject *op, OpArgs *a) {
    ex->gen++; /* descriptors pinned by the last op are free to go */
    if (args_read(a, op) < 0) return -1;
    double t0 = now_s();
    if (a->kind == K_OTHER) {
        if (ex->fallback == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "executor not initialised");
            return -1;
        }
        PyObject *r = PyObject_CallOneArg(ex->fallback, op);
        ex->busy_main += now_s() - t0;
        if (r == NULL) return -1;
        long long n = PyLong_AsLongLong(r);
        Py_DECREF(r);
        return n;
    }
    int rc;
    /* Other Python threads (a replay's look-ahead) run during the system calls. */
    Py_BEGIN_ALLOW_THREADS
    rc = run_op(ex, a);
    Py_END_ALLOW_THREADS
    ex->busy_main += now_s() - t0;
    if (rc) {
        raise_rc(ex, rc, a->kind_obj, a->path_obj);
        return -1;
    }
    return op_result(a);
}

/* ------------------------------------------------------------------ the journal line */

/* Printable ASCII without quote or backslash: JSON writes it as is between quotes. */
static int plain(PyObject *s) {
    if (!PyUnicode_Check(s) || !PyUnicode_IS_ASCII(s)) return 0;
    const unsigned char *p = PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e || p[i] == '"' || p[i] == '\\') return 0;
    return 1;
}

static int append_str(char **w, char *end, const char *s, Py_ssize_t n) {
    if (end - *w < n) return -1;
    memcpy(*w, s, (size_t)n);
    *w += n;
    return 0;
}

/* ``op.to_json() + "\n"`` into buf when the op is plain (C kind, plain strings, no label);
 * its length, or -1 (not plain, or it does not fit). */
Py_ssize_t format_line(OpArgs *a, char *buf, Py_ssize_t cap) {
    if (a->kind == K_OTHER || !plain(a->kind_obj) || !plain(a->path_obj) || !plain(a->dest_obj)
        || !PyUnicode_Check(a->label_obj) || PyUnicode_GET_LENGTH(a->label_obj) != 0)
        return -1;
    char *w = buf, *end = buf + cap;
    char num[48];
    const char *kind = KIND_NAMES[a->kind];
    if (append_str(&w, end, "{\"op\":\"", 7) || append_str(&w, end, kind, (Py_ssize_t)strlen(kind))
        || append_str(&w, end, "\"", 1))
        return -1;
    Py_ssize_t plen = PyUnicode_GET_LENGTH(a->path_obj);
    if (plen && (append_str(&w, end, ",\"path\":\"", 9)
                 || append_str(&w, end, PyUnicode_DATA(a->path_obj), plen)
                 || append_str(&w, end, "\"", 1)))
        return -1;
    if (a->size) {
        int n = snprintf(num, sizeof num, ",\"size\":%lld", a->size);
        if (append_str(&w, end, num, n)) return -1;
    }
    if (a->offset) {
        int n = snprintf(num, sizeof num, ",\"offset\":%lld", a->offset);
        if (append_str(&w, end, num, n)) return -1;
    }
    Py_ssize_t dlen = PyUnicode_GET_LENGTH(a->dest_obj);
    if (dlen && (append_str(&w, end, ",\"dest\":\"", 9)
                 || append_str(&w, end, PyUnicode_DATA(a->dest_obj), dlen)
                 || append_str(&w, end, "\"", 1)))
        return -1;
    if (a->attrs.has_mode) {
        int n = snprintf(num, sizeof num, ",\"mode\":%lld", a->attrs.mode);
        if (append_str(&w, end, num, n)) return -1;
    }
    if (a->attrs.has_mtime) {
        int n = snprintf(num, sizeof num, ",\"mtime_ns\":%lld", a->attrs.mtime_ns);
        if (append_str(&w, end, num, n)) return -1;
    }
    if (append_str(&w, end, "}\n", 2)) return -1;
    return w - buf;
}

/* write() all of buf; 0, or an errno. */
int write_all(int fd, const char *buf, Py_ssize_t n) {
    Py_ssize_t done = 0;
    while (done < n) {
        long w = RETRY(write(fd, buf + done, (size_t)(n - done)));
        if (w <= 0) return w < 0 ? errno : ENOSPC;
        done += w;
    }
    return 0;
}

static void raise_journal(Exec *ex, PyObject *journal, int err) {
    PyObject *path = PyObject_GetAttrString(journal, "path");
    if (path == NULL) return;
    PyErr_Format(ex->fsage_exc, "cannot write the journal %S: %s", path, strerror(err));
    Py_DECREF(path);
}

int journal_fd(PyObject *journal) {
    PyObject *fdo = PyObject_GetAttr(journal, S_fd);
    if (fdo == NULL) return -2;
    long fd = PyLong_AsLong(fdo);
    Py_DECREF(fdo);
    if (fd == -1 && PyErr_Occurred()) return -2;
    return (int)fd;
}

/* Append op's line to the journal (plain ops formatted here, others by journal.add). */
int journal_write(Exec *ex, PyObject *journal, PyObject *op, OpArgs *a) {
    char buf[4096];
    Py_ssize_t n = format_line(a, buf, sizeof buf);
    if (n < 0) {
        PyObject *r = PyObject_CallMethodOneArg(journal, S_add, op);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    int fd = journal_fd(journal);
    if (fd == -2) return -1;
    int err = write_all(fd, buf, n);
    if (err) {
        raise_journal(ex, journal, err);
        return -1;
    }
    return 0;
}
