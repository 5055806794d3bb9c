/*
 * The executor's worker thread (fsage._posixexec): ops queued by submit() run ahead, in
 * order and without the GIL, while the caller goes on generating.
 */
#include "_posixexec.h"

/* ------------------------------------------------------------------ running ahead */

/* The worker thread runs queued ops in order, without the GIL, while the caller goes on
 * generating. Only plain ops whose worst-case use of space and inodes fits in the budget
 * the caller set from its last statvfs are queued (an op that could run out of space runs on
 * the calling thread, after the queue is drained, so the generator hears of it at once).
 * The first op that fails stops the queue: it and every op queued after it are not run, and
 * drain() raises its error as InFlightError (lost_ops, lost_bytes: what the caller counted
 * for them). */

static void slot_clear(Slot *sl) {
    Py_CLEAR(sl->op);
}

/* Wait, without the GIL, until the worker has finished ``target`` ops. The counters are
 * atomics (no lock per op); the mutex and condition variables only put a thread to sleep and
 * wake it: each side publishes its flag (idle, waiting) before it checks the other's counter,
 * so a wake-up is never lost. */
static void wait_done(Exec *ex, uint64_t target) {
    if (atomic_load(&ex->completed) >= target) return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&ex->mu);
    atomic_store(&ex->waiting, 1);
    if (atomic_load(&ex->idle)) pthread_cond_signal(&ex->cv_work);
    while (atomic_load(&ex->completed) < target) pthread_cond_wait(&ex->cv_done, &ex->mu);
    atomic_store(&ex->waiting, 0);
    pthread_mutex_unlock(&ex->mu);
    Py_END_ALLOW_THREADS
}

void wait_idle(Exec *ex) {
    if (ex->running) wait_done(ex, atomic_load(&ex->submitted));
}

static void *worker_main(void *arg) {
    Exec *ex = arg;
    for (;;) {
        uint64_t c = atomic_load_explicit(&ex->completed, memory_order_relaxed);
        if (atomic_load(&ex->submitted) == c) {
            if (atomic_load(&ex->stopping)) break;
            pthread_mutex_lock(&ex->mu);
            atomic_store(&ex->idle, 1);
            while (atomic_load(&ex->submitted) == c && !atomic_load(&ex->stopping))
                pthread_cond_wait(&ex->cv_work, &ex->mu);
            atomic_store(&ex->idle, 0);
            pthread_mutex_unlock(&ex->mu);
            continue;
        }
        Slot *sl = &ex->ring[c % RING];
        int rc = 0, err = 0;
        double t0 = now_s();
        if (!atomic_load_explicit(&ex->failed, memory_order_relaxed)) {
            OpArgs a;
            memset(&a, 0, sizeof a);
            a.kind = sl->kind;
            a.path = sl->buf;
            a.plen = sl->plen;
            a.dest = sl->buf + sl->plen + 1;
            a.dlen = sl->dlen;
            a.size = sl->size;
            a.offset = sl->offset;
            a.attrs = sl->attrs;
            ex->gen++;
            rc = run_op(ex, &a);
            err = ex->err;
            if (rc == 0) {
                err = write_all(sl->jfd, sl->buf + sl->plen + sl->dlen + 2, sl->llen);
                if (err) rc = ERR_JOURNAL;
            }
            if (rc) {
                ex->failed_slot = (int)(c % RING);
                ex->failed_rc = rc;
                ex->failed_err = err;
                atomic_store(&ex->failed, 1);
            }
        }
        ex->busy_worker += now_s() - t0;
        if (atomic_load_explicit(&ex->failed, memory_order_relaxed)) {
            ex->lost_ops++;
            ex->lost_bytes += sl->bytes;
        }
        atomic_store(&ex->completed, c + 1);
        if (atomic_load(&ex->waiting)) {
            pthread_mutex_lock(&ex->mu);
            pthread_cond_signal(&ex->cv_done);
            pthread_mutex_unlock(&ex->mu);
        }
    }
    return NULL;
}

/* After the queue is idle: release the queued ops and raise the first failure, if any. */
static int settle(Exec *ex) {
    int rc = 0;
    if (ex->failed) {
        Slot *sl = &ex->ring[ex->failed_slot];
        PyObject *kind = PyObject_GetAttr(sl->op, S_op);
        PyObject *path = kind ? PyObject_GetAttr(sl->op, S_path) : NULL;
        PyObject *jpath = NULL;
        if (path != NULL) {
            ex->err = ex->failed_err;
            if (ex->failed_rc == ERR_JOURNAL) {
                jpath = PyObject_GetAttrString(ex->journal, "path");
                if (jpath != NULL)
                    PyErr_Format(ex->fsage_exc, "cannot write the journal %S: %s", jpath,
                                 strerror(ex->failed_err));
            } else {
                raise_rc(ex, ex->failed_rc, kind, path);
            }
        }
        Py_XDECREF(kind);
        Py_XDECREF(path);
        Py_XDECREF(jpath);
        /* The same message, as InFlightError carrying what was not run. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *msg = value ? PyObject_Str(value) : NULL;
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (msg != NULL) {
            PyObject *exc = PyObject_CallOneArg(ex->inflight_exc, msg);
            Py_DECREF(msg);
            if (exc != NULL) {
                PyObject *lo = PyLong_FromUnsignedLongLong(ex->lost_ops);
                PyObject *lb = PyLong_FromLongLong(ex->lost_bytes);
                if (lo && lb) {
                    PyObject_SetAttrString(exc, "lost_ops", lo);
                    PyObject_SetAttrString(exc, "lost_bytes", lb);
                }
                Py_XDECREF(lo);
                Py_XDECREF(lb);
                PyErr_SetObject(ex->inflight_exc, exc);
                Py_DECREF(exc);
            }
        }
        atomic_store(&ex->failed, 0);
        ex->lost_ops = 0;
        ex->lost_bytes = 0;
        rc = -1;
    }
    for (int i = 0; i < RING; i++) slot_clear(&ex->ring[i]);
    return rc;
}

int drain(Exec *ex) {
    if (!ex->running) return 0;
    wait_idle(ex);
    return settle(ex);
}

PyObject *Exec_drain(Exec *ex, PyObject *Py_UNUSED(ignored)) {
    if (drain(ex) < 0) return NULL;
    Py_RETURN_NONE;
}

PyObject *Exec_start(Exec *ex, PyObject *journal) {
    if (ex->running) {
        if (drain(ex) < 0) return NULL;
    } else {
        atomic_store(&ex->stopping, 0);
        atomic_store(&ex->submitted, 0);
        atomic_store(&ex->completed, 0);
        /* Signals (Ctrl-C) go to the calling thread, which Python handles them on: the
         * worker starts with all of them blocked. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        int e = pthread_create(&ex->thread, NULL, worker_main, ex);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e) {
            errno = e;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        ex->running = 1;
    }
    Py_INCREF(journal);
    Py_XSETREF(ex->journal, journal);
    Py_RETURN_NONE;
}

/* Stop the worker after the ops queued (errors are dropped: see drain). */
void stop_worker(Exec *ex) {
    if (!ex->running) return;
    pthread_mutex_lock(&ex->mu);
    atomic_store(&ex->stopping, 1);
    pthread_cond_signal(&ex->cv_work);
    pthread_mutex_unlock(&ex->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(ex->thread, NULL);
    Py_END_ALLOW_THREADS
    ex->running = 0;
    atomic_store(&ex->failed, 0);
    ex->lost_ops = 0;
    ex->lost_bytes = 0;
    for (int i = 0; i < RING; i++) slot_clear(&ex->ring[i]);
}

PyObject *Exec_stop(Exec *ex, PyObject *Py_UNUSED(ignored)) {
    stop_worker(ex);
    Py_RETURN_NONE;
}

PyObject *Exec_set_budget(Exec *ex, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_budget(bytes, inodes)");
        return NULL;
    }
    long long b = PyLong_AsLongLong(args[0]), i = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    ex->budget_bytes = b;
    ex->budget_inodes = i;
    Py_RETURN_NONE;
}

/* The most space an op can take: its data rounded up to 4 KiB blocks, plus metadata. */
static long long op_cost(OpArgs *a) {
    long long data = 0;
    if (a->kind == K_CREATE || a->kind == K_APPEND || a->kind == K_OVERWRITE
        || a->kind == K_FALLOCATE)
        data = (a->size + 4095) / 4096 * 4096;
    return data + METADATA_COST;
}

/* Queue ``op`` (or, when it cannot run ahead, drain the queue and run it here); returns the
 * bytes of file data it writes, as apply does. */
PyObject *Exec_submit(Exec *ex, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "submit(journal, op)");
        return NULL;
    }
    PyObject *journal = args[0], *op = args[1];
    OpArgs a;
    PyObject *res = NULL;
    if (args_read(&a, op) < 0) goto done;
    char line[4096];
    Py_ssize_t llen = ex->running ? format_line(&a, line, sizeof line) : -1;
    long long cost = llen >= 0 ? op_cost(&a) : 0;
    long long inodes = a.kind == K_CREATE || a.kind == K_MKDIR;
    if (llen < 0 || cost > ex->budget_bytes || inodes > ex->budget_inodes) {
        args_release(&a);
        if (drain(ex) < 0) return NULL;
        long long n = apply_op(ex, op, &a);
        if (!(n == -1 && PyErr_Occurred()) && journal_write(ex, journal, op, &a) == 0)
            res = PyLong_FromLongLong(n);
        goto done;
    }
    int jfd = journal_fd(journal);
    if (jfd == -2) goto done;
    uint64_t sub = atomic_load_explicit(&ex->submitted, memory_order_relaxed);
    if (sub - atomic_load(&ex->completed) >= RING) wait_done(ex, sub - RING + 1);
    if (atomic_load(&ex->failed)) { /* nothing more runs: report it */
        if (drain(ex) < 0) goto done;
        sub = atomic_load_explicit(&ex->submitted, memory_order_relaxed);
    }
    Slot *sl = &ex->ring[sub % RING];
    /* The slot's previous op is finished: the worker no longer reads it. */
    size_t need = (size_t)(a.plen + a.dlen + 2 + llen);
    if (need > sl->cap) {
        char *nb = realloc(sl->buf, need);
        if (nb == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        sl->buf = nb;
        sl->cap = need;
    }
    memcpy(sl->buf, a.path, (size_t)a.plen);
    sl->buf[a.plen] = '\0';
    if (a.dlen) memcpy(sl->buf + a.plen + 1, a.dest, (size_t)a.dlen);
    sl->buf[a.plen + 1 + a.dlen] = '\0';
    memcpy(sl->buf + a.plen + a.dlen + 2, line, (size_t)llen);
    sl->plen = a.plen;
    sl->dlen = a.dlen;
    sl->llen = llen;
    sl->kind = a.kind;
    sl->size = a.size;
    sl->offset = a.offset;
    sl->attrs = a.attrs;
    sl->jfd = jfd;
    sl->bytes = op_result(&a);
    Py_INCREF(op);
    Py_XSETREF(sl->op, op);
    ex->budget_bytes -= cost;
    ex->budget_inodes -= inodes;
    atomic_store(&ex->submitted, sub + 1);
    if (atomic_load(&ex->idle) && sub + 1 - atomic_load(&ex->completed) >= WAKE_AT) {
        pthread_mutex_lock(&ex->mu);
        pthread_cond_signal(&ex->cv_work);
        pthread_mutex_unlock(&ex->mu);
    }
    res = PyLong_FromLongLong(sl->bytes);
done:
    args_release(&a);
    return res;
}
