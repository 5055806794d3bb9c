/*
 * fsage._live: the walk's threads (see _live.c for the whole). Workers share one stack of
 * pending directories and a set of the hard-linked inodes already claimed; the calling thread
 * supervises them, reporting progress when a worker asks for it and letting signal handlers
 * run.
 */
#include "_live.h"

static size_t ino_hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static int inoset_has(const inoset_t *s, uint64_t ino) {
    if (ino == 0)
        return s->has_zero;
    if (!s->cap)
        return 0;
    for (size_t i = ino_hash(ino) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->slots[i] == ino)
            return 1;
        if (s->slots[i] == 0)
            return 0;
    }
}

static int inoset_add(inoset_t *s, uint64_t ino) {
    if (ino == 0) {
        s->has_zero = 1;
        return 0;
    }
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        uint64_t *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return -1;
        for (size_t j = 0; j < s->cap; j++) {
            uint64_t v = s->slots[j];
            if (!v)
                continue;
            size_t i = ino_hash(v) & (cap - 1);
            while (slots[i])
                i = (i + 1) & (cap - 1);
            slots[i] = v;
        }
        free(s->slots);
        s->slots = slots;
        s->cap = cap;
    }
    size_t i = ino_hash(ino) & (s->cap - 1);
    while (s->slots[i] && s->slots[i] != ino)
        i = (i + 1) & (s->cap - 1);
    if (!s->slots[i]) {
        s->slots[i] = ino;
        s->n++;
    }
    return 0;
}

/* ---- progress: workers ask, the calling thread (which holds the GIL) answers ------------- */

/* Add this worker's uncounted records to the total; when the total passes the next multiple
 * of PROGRESS_EVERY, wait while the calling thread reports it (so a progress callback sees
 * the walk paused, as with one thread it always is). */
void flush_count(walker_t *w, int may_wait) {
    shared_t *sh = w->sh;
    uint64_t total = __atomic_add_fetch(&sh->nrec, w->unflushed, __ATOMIC_RELAXED);
    w->unflushed = 0;
    if (!may_wait || !sh->want_progress ||
        total < __atomic_load_n(&sh->next_checkpoint, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&sh->mu);
    if (total >= sh->next_checkpoint) {
        sh->next_checkpoint = (total / PROGRESS_EVERY + 1) * PROGRESS_EVERY;
        uint64_t seq = ++sh->ck_asked;
        sh->ck_count = total;
        pthread_cond_signal(&sh->main);
        while (sh->ck_done < seq && !__atomic_load_n(&sh->stop, __ATOMIC_RELAXED))
            pthread_cond_wait(&sh->resume, &sh->mu);
    }
    pthread_mutex_unlock(&sh->mu);
}

/* For an inode with several links: 1 if this worker is the first to see it (and must record
 * it), 0 if it was seen before (only this name is to be added), -1 out of memory. */
int claim(walker_t *w, uint64_t ino) {
    shared_t *sh = w->sh;
    pthread_mutex_lock(&sh->seen_mu);
    int r = inoset_has(&sh->seen, ino) ? 0 : (inoset_add(&sh->seen, ino) ? -1 : 1);
    pthread_mutex_unlock(&sh->seen_mu);
    if (r < 0)
        fail_oom(w);
    return r;
}

/* A worker: take a directory from the shared stack, read it, put its subdirectories back;
 * until the stack is empty and no other worker is reading one (or the walk is stopped). */
void *worker_main(void *arg) {
    walker_t *w = arg;
    shared_t *sh = w->sh;
    (void)unshare(CLONE_FILES); /* best effort: a private fd table (see _live.c) */
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) && sh->stack.n == 0 && sh->active)
            pthread_cond_wait(&sh->work, &sh->mu);
        if (__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) || sh->stack.n == 0)
            break;
        task_t t = sh->stack.v[--sh->stack.n];
        sh->active++;
        pthread_mutex_unlock(&sh->mu);
        process(w, &t);
        free(t.rel);
        pthread_mutex_lock(&sh->mu);
        /* in listing order: the last subdirectory listed is read next (as the Python walk) */
        size_t moved = w->found.n;
        for (size_t i = 0; i < moved; i++) {
            task_t *f = &w->found.v[i];
            if (tasks_push(&sh->stack, f->rel, f->len, f->parent, f->has_parent, f->top)) {
                free(f->rel);
                fail_oom(w);
            }
        }
        w->found.n = 0;
        sh->active--;
        if (moved > 1 || sh->active == 0 || __atomic_load_n(&sh->stop, __ATOMIC_RELAXED))
            pthread_cond_broadcast(&sh->work);
    }
    pthread_cond_broadcast(&sh->work);
    pthread_mutex_unlock(&sh->mu);
    flush_count(w, 0);
    pthread_mutex_lock(&sh->mu);
    sh->finished++;
    pthread_cond_signal(&sh->main);
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

/* In the calling thread, without the GIL (*ts saved): wait for the workers, taking the GIL
 * to report progress when one asks and to let signal handlers run every 100 ms. 1 if a
 * Python exception is set (the walk was then stopped). */
int supervise(shared_t *sh, PyObject *progress, uint64_t base, PyThreadState **ts) {
    int py_error = 0;
    pthread_mutex_lock(&sh->mu);
    while (sh->finished < sh->nthreads) {
        int answer = sh->ck_asked > sh->ck_done;
        if (!answer) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 100 * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            int r = pthread_cond_timedwait(&sh->main, &sh->mu, &until);
            if (r != ETIMEDOUT)
                continue;
        }
        uint64_t seq = sh->ck_asked, count = sh->ck_count;
        pthread_mutex_unlock(&sh->mu);
        PyEval_RestoreThread(*ts);
        if (!py_error && answer && progress) {
            PyObject *r = PyObject_CallFunction(progress, "K", (unsigned long long)(base + count));
            if (!r)
                py_error = 1;
            else
                Py_DECREF(r);
        }
        if (!py_error && PyErr_CheckSignals() < 0)
            py_error = 1;
        *ts = PyEval_SaveThread();
        pthread_mutex_lock(&sh->mu);
        if (py_error && !__atomic_load_n(&sh->stop, __ATOMIC_RELAXED)) {
            __atomic_store_n(&sh->stop, 1, __ATOMIC_RELAXED);
            pthread_cond_broadcast(&sh->work);
        }
        if (answer) {
            sh->ck_done = seq;
            pthread_cond_broadcast(&sh->resume);
        }
    }
    pthread_mutex_unlock(&sh->mu);
    return py_error;
}

void walker_free(walker_t *w) {
    free(w->fm);
    buf_free(&w->listing);
    buf_free(&w->recs);
    buf_free(&w->ext);
    buf_free(&w->lpar);
    buf_free(&w->lino);
    buf_free(&w->lend);
    buf_free(&w->names);
    buf_free(&w->scratch);
    buf_free(&w->order);
    pathlist_free(&w->skipped);
    pathlist_free(&w->not_crossed);
    pathlist_free(&w->no_fiemap);
    tasks_free(&w->found);
}

/* Room for about `expect` records, so that the buffers rarely move while the walk runs. */
int walker_init(walker_t *w, shared_t *sh, size_t expect, int dir_fiemap, int getversion) {
    memset(w, 0, sizeof *w);
    w->sh = sh;
    w->dir_fiemap = dir_fiemap;
    w->getversion = getversion;
    w->getflags = 1;
    w->fm = calloc(1, sizeof(struct fiemap) + (size_t)sh->batch * sizeof(struct fiemap_extent));
    buf_init_cap(&w->listing, DENTS_SIZE);
    if (!w->fm || !w->listing.p)
        return -1;
    buf_init_cap(&w->recs, expect * sizeof(rec_t));
    buf_init_cap(&w->ext, expect * sizeof(ext_t));
    buf_init_cap(&w->lpar, expect * 8);
    buf_init_cap(&w->lino, expect * 8);
    buf_init_cap(&w->lend, expect * 8);
    buf_init_cap(&w->names, expect * 16);
    return 0;
}
