/*
 * The executor's cache of directory descriptors (fsage._posixexec): each directory an op
 * names is opened by walking its path one component at a time from the target's root with
 * O_NOFOLLOW, and kept by relative path (least recently used evicted beyond ``max_fds``).
 */
#include "_posixexec.h"

/* ------------------------------------------------------------------ the cache */

static uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

static int table_find(Exec *ex, const char *key, Py_ssize_t len, uint64_t h) {
    uint32_t i = (uint32_t)h & ex->tmask;
    for (;;) {
        int e = ex->table[i];
        if (e < 0) return -1;
        Entry *en = &ex->ents[e];
        if (en->hash == h && en->len == len && memcmp(en->key, key, (size_t)len) == 0) return e;
        i = (i + 1) & ex->tmask;
    }
}

static void table_put(Exec *ex, int e) {
    uint32_t i = (uint32_t)ex->ents[e].hash & ex->tmask;
    while (ex->table[i] >= 0) i = (i + 1) & ex->tmask;
    ex->table[i] = e;
}

static void table_remove(Exec *ex, int e) {
    uint32_t i = (uint32_t)ex->ents[e].hash & ex->tmask;
    while (ex->table[i] != e) i = (i + 1) & ex->tmask;
    /* Backward-shift deletion: move later entries of the run into the hole. */
    uint32_t hole = i;
    for (;;) {
        i = (i + 1) & ex->tmask;
        int f = ex->table[i];
        if (f < 0) break;
        uint32_t home = (uint32_t)ex->ents[f].hash & ex->tmask;
        if (((i - home) & ex->tmask) >= ((i - hole) & ex->tmask)) {
            ex->table[hole] = f;
            hole = i;
        }
    }
    ex->table[hole] = -1;
}

static void lru_unlink(Exec *ex, int e) {
    Entry *en = &ex->ents[e];
    if (en->prev >= 0) ex->ents[en->prev].next = en->next;
    else ex->lru = en->next;
    if (en->next >= 0) ex->ents[en->next].prev = en->prev;
    else ex->mru = en->prev;
    en->prev = en->next = -1;
}

static void lru_push(Exec *ex, int e) {
    Entry *en = &ex->ents[e];
    en->prev = ex->mru;
    en->next = -1;
    if (ex->mru >= 0) ex->ents[ex->mru].next = e;
    else ex->lru = e;
    ex->mru = e;
}

static void close_entry(Exec *ex, int e) {
    Entry *en = &ex->ents[e];
    close(en->fd);
    table_remove(ex, e);
    lru_unlink(ex, e);
    free(en->key);
    en->key = NULL;
    en->fd = -1;
    en->next = ex->free_head; /* the free list reuses next */
    ex->free_head = e;
    ex->count--;
}

/* Room for one more entry: grow the arrays (the table stays under half full). */
int reserve(Exec *ex) {
    if (ex->free_head >= 0) return 0;
    int ncap = ex->cap ? ex->cap * 2 : 64;
    Entry *ne = realloc(ex->ents, sizeof(Entry) * (size_t)ncap);
    if (ne == NULL) return -1;
    ex->ents = ne;
    for (int i = ncap - 1; i >= ex->cap; i--) {
        ne[i].key = NULL;
        ne[i].fd = -1;
        ne[i].next = ex->free_head;
        ex->free_head = i;
    }
    uint32_t tsize = (uint32_t)ncap * 4;
    int32_t *nt = malloc(sizeof(int32_t) * tsize);
    if (nt == NULL) return -1;
    free(ex->table);
    ex->table = nt;
    ex->tmask = tsize - 1;
    for (uint32_t i = 0; i < tsize; i++) nt[i] = -1;
    for (int i = 0; i < ex->cap; i++)
        if (ne[i].key != NULL) table_put(ex, i);
    ex->cap = ncap;
    return 0;
}

/* Close the least recently used unpinned descriptors until at most ``keep`` remain. */
static void evict(Exec *ex, int keep) {
    int e = ex->lru;
    while (ex->count > keep && e >= 0) {
        int next = ex->ents[e].next;
        if (ex->ents[e].pin != ex->gen) close_entry(ex, e);
        e = next;
    }
}

void drop_all(Exec *ex) {
    while (ex->lru >= 0) close_entry(ex, ex->lru);
}

/* Close the entries of directory ``path`` and of everything below it. */
void forget(Exec *ex, const char *path, Py_ssize_t len) {
    if (ex->count == 0) return;
    for (int e = 0; e < ex->cap; e++) {
        Entry *en = &ex->ents[e];
        if (en->key == NULL || en->len < len || memcmp(en->key, path, (size_t)len) != 0) continue;
        if (en->len == len || en->key[len] == '/') close_entry(ex, e);
    }
}

static int note_unsafe(Exec *ex, const char *key, Py_ssize_t len) {
    char *copy = malloc((size_t)len + 1);
    if (copy == NULL) return ERR_NOMEM;
    memcpy(copy, key, (size_t)len);
    free(ex->bad_key);
    ex->bad_key = copy;
    ex->bad_len = len;
    return ERR_UNSAFE;
}

void raise_unsafe(Exec *ex) {
    PyObject *s = PyUnicode_DecodeFSDefaultAndSize(ex->bad_key, ex->bad_len);
    if (s == NULL) return;
    PyObject *msg = PyUnicode_FromFormat("%R is not a directory inside the target (symlink?)", s);
    Py_DECREF(s);
    if (msg == NULL) return;
    PyErr_SetObject(ex->unsafe_exc, msg);
    Py_DECREF(msg);
}

/* Descriptor of directory ``key`` (relative, "" = the root), walked without following
 * symlinks; cached and pinned for the current op. */
int dir_fd(Exec *ex, const char *key, Py_ssize_t len, int *out) {
    if (len == 0) {
        *out = ex->root_fd;
        return 0;
    }
    uint64_t h = hash_bytes(key, len);
    int e = table_find(ex, key, len, h);
    if (e >= 0) {
        Entry *en = &ex->ents[e];
        if (ex->mru != e) {
            lru_unlink(ex, e);
            lru_push(ex, e);
        }
        en->pin = ex->gen;
        *out = en->fd;
        return 0;
    }
    Py_ssize_t slash = len - 1;
    while (slash >= 0 && key[slash] != '/') slash--;
    int base;
    int rc = dir_fd(ex, key, slash < 0 ? 0 : slash, &base);
    if (rc) return rc;
    char name[NAME_MAX + 1];
    Py_ssize_t nlen = len - slash - 1;
    if (nlen > NAME_MAX) {
        ex->err = ENAMETOOLONG;
        return ERR_ERRNO;
    }
    memcpy(name, key + slash + 1, (size_t)nlen);
    name[nlen] = '\0';
    int fd = (int)RETRY(openat(base, name, DIR_FLAGS));
    if (fd < 0) {
        if (errno == ELOOP || errno == ENOTDIR) return note_unsafe(ex, key, len);
        ex->err = errno;
        return ERR_ERRNO;
    }
    evict(ex, ex->max_fds - 1);
    if (reserve(ex) < 0) {
        close(fd);
        return ERR_NOMEM;
    }
    e = ex->free_head;
    Entry *en = &ex->ents[e];
    ex->free_head = en->next;
    en->key = malloc((size_t)len);
    if (en->key == NULL) {
        en->next = ex->free_head;
        ex->free_head = e;
        close(fd);
        return ERR_NOMEM;
    }
    memcpy(en->key, key, (size_t)len);
    en->len = len;
    en->hash = h;
    en->fd = fd;
    en->pin = ex->gen;
    table_put(ex, e);
    lru_push(ex, e);
    ex->count++;
    *out = fd;
    return 0;
}

/* The directory descriptor and the last component of ``path`` (a NUL-terminated suffix). */
int split(Exec *ex, const char *path, Py_ssize_t len, int *dfd, const char **name) {
    Py_ssize_t slash = len - 1;
    while (slash >= 0 && path[slash] != '/') slash--;
    *name = path + slash + 1;
    return dir_fd(ex, path, slash < 0 ? 0 : slash, dfd);
}
