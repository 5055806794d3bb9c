/*
 * fsage._live: joining the workers' records (see _live.c for the whole): sort them by inode
 * (an inode recorded twice is kept once), convert extents from bytes to blocks, and lay them
 * out as the columns walk() returns; three threads each fill a part of the columns.
 */
#include "_live.h"

/* Stable LSD radix sort of keys by key, a byte at a time, skipping bytes all keys share. */
static void radix_sort(sortkey_t *keys, sortkey_t *tmp, size_t n) {
    if (n < 2)
        return;
    uint64_t differ = 0;
    for (size_t i = 1; i < n; i++)
        differ |= keys[i].key ^ keys[0].key;
    sortkey_t *src = keys, *dst = tmp;
    for (int shift = 0; shift < 64; shift += 8) {
        if (!((differ >> shift) & 0xFF))
            continue;
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++)
            count[((src[i].key >> shift) & 0xFF) + 1]++;
        for (int b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i].key >> shift) & 0xFF]++] = src[i];
        sortkey_t *s = src;
        src = dst;
        dst = s;
    }
    if (src != keys)
        memcpy(keys, src, n * sizeof *keys);
}

/* Sort keys by inode and keep the first of each inode; how many are kept. Inode numbers
 * mostly fill a range not much wider than their count (ext4, btrfs): then a table indexed by
 * inode does it in two passes; else (xfs's sparse numbers) the radix sort. */
size_t sort_unique(sortkey_t *keys, sortkey_t *tmp, size_t n, int use_table) {
    if (n == 0)
        return 0;
    uint64_t lo = keys[0].key, hi = keys[0].key;
    for (size_t i = 1; i < n; i++) {
        lo = keys[i].key < lo ? keys[i].key : lo;
        hi = keys[i].key > hi ? keys[i].key : hi;
    }
    size_t kept = 0;
    uint32_t *slot = NULL;
    if (use_table && hi - lo < 4 * (uint64_t)n + 4096 && n < UINT32_MAX)
        slot = calloc((size_t)(hi - lo) + 1, sizeof *slot);
    if (slot) {
        for (size_t i = 0; i < n; i++) {
            uint32_t *s = &slot[keys[i].key - lo];
            if (!*s)
                *s = (uint32_t)i + 1;
        }
        for (uint64_t v = 0; v <= hi - lo; v++)
            if (slot[v])
                tmp[kept++] = keys[slot[v] - 1];
        free(slot);
        memcpy(keys, tmp, kept * sizeof *keys);
        return kept;
    }
    radix_sort(keys, tmp, n);
    for (size_t i = 0; i < n; i++)
        if (!i || keys[i].key != keys[i - 1].key)
            keys[kept++] = keys[i];
    return kept;
}

static uint32_t fsage_flags(uint32_t f) {
    uint32_t out = 0;
    if (f & FIEMAP_EXTENT_UNWRITTEN)
        out |= EXTENT_UNWRITTEN;
    if (f & FIEMAP_EXTENT_DELALLOC)
        out |= EXTENT_DELALLOC;
    if (f & (FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_DATA_TAIL))
        out |= EXTENT_INLINE;
    if (f & FIEMAP_EXTENT_SHARED)
        out |= EXTENT_SHARED;
    if (f & (FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_DATA_ENCRYPTED))
        out |= EXTENT_ENCODED;
    return out;
}

void joined_free(joined_t *j) {
    for (int c = 0; c < N_COLS; c++)
        buf_free(&j->col[c]);
    buf_free(&j->names);
}

static int alloc_col(buf_t *b, size_t bytes) {
    b->p = malloc(bytes ? bytes : 1);
    b->len = b->cap = b->p ? bytes : 0;
    return b->p ? 0 : -1;
}

static int has_key(const sortkey_t *keys, size_t n, uint64_t ino) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid].key < ino)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && keys[lo].key == ino;
}

/* One part of joining the workers' output; the three parts run at once. */
typedef struct {
    const walker_t *ws;
    int nw;
    const sortkey_t *keys; /* sorted, one per inode */
    size_t n;
    uint64_t block_size;
    int filter_links; /* drop link rows whose inode has no record */
    joined_t *out;
    int err;
} join_t;

static const rec_t *rec_of(const join_t *j, size_t i) {
    return &((const rec_t *)j->ws[j->keys[i].worker].recs.p)[j->keys[i].index];
}

/* ino .. crtime, in inode order */
static void *join_records(void *arg) {
    join_t *j = arg;
    static const size_t width[C_FLAGS + 1] = {8, 4, 4, 4, 4, 4, 8, 8, 8, 8, 8, 4};
    for (int c = 0; c <= C_FLAGS; c++)
        if (alloc_col(&j->out->col[c], j->n * width[c])) {
            j->err = 1;
            return NULL;
        }
    buf_t *col = j->out->col;
    uint64_t *ino = (uint64_t *)col[C_INO].p, *size = (uint64_t *)col[C_SIZE].p;
    uint32_t *gen = (uint32_t *)col[C_GEN].p, *mode = (uint32_t *)col[C_MODE].p;
    uint32_t *nlink = (uint32_t *)col[C_NLINK].p, *uid = (uint32_t *)col[C_UID].p;
    uint32_t *gid = (uint32_t *)col[C_GID].p;
    int64_t *atime = (int64_t *)col[C_ATIME].p, *mtime = (int64_t *)col[C_MTIME].p;
    int64_t *ctime_ = (int64_t *)col[C_CTIME].p, *crtime = (int64_t *)col[C_CRTIME].p;
    uint32_t *iflags = (uint32_t *)col[C_FLAGS].p;
    for (size_t i = 0; i < j->n; i++) {
        const rec_t *r = rec_of(j, i);
        ino[i] = r->ino;
        gen[i] = r->gen;
        mode[i] = r->mode;
        nlink[i] = r->nlink;
        uid[i] = r->uid;
        gid[i] = r->gid;
        size[i] = r->size;
        atime[i] = r->atime;
        mtime[i] = r->mtime;
        ctime_[i] = r->ctime;
        crtime[i] = r->crtime;
        iflags[i] = r->iflags;
    }
    return NULL;
}

/* ext_off and the extent columns, in blocks */
static void *join_extents(void *arg) {
    join_t *j = arg;
    buf_t *col = j->out->col;
    if (alloc_col(&col[C_EXT_OFF], (j->n + 1) * 8)) {
        j->err = 1;
        return NULL;
    }
    uint64_t *off = (uint64_t *)col[C_EXT_OFF].p;
    off[0] = 0;
    for (size_t i = 0; i < j->n; i++)
        off[i + 1] = off[i] + rec_of(j, i)->ext_count;
    size_t m = off[j->n];
    if (alloc_col(&col[C_EXT_LOGICAL], m * 8) || alloc_col(&col[C_EXT_PHYSICAL], m * 8) ||
        alloc_col(&col[C_EXT_LENGTH], m * 8) || alloc_col(&col[C_EXT_FLAGS], m * 4)) {
        j->err = 1;
        return NULL;
    }
    uint64_t *lo = (uint64_t *)col[C_EXT_LOGICAL].p, *ph = (uint64_t *)col[C_EXT_PHYSICAL].p;
    uint64_t *ln = (uint64_t *)col[C_EXT_LENGTH].p;
    uint32_t *fl = (uint32_t *)col[C_EXT_FLAGS].p;
    const uint64_t bs = j->block_size;
    size_t e = 0;
    for (size_t i = 0; i < j->n; i++) {
        const rec_t *r = rec_of(j, i);
        const ext_t *x = (const ext_t *)j->ws[j->keys[i].worker].ext.p + r->ext_start;
        for (uint32_t k = 0; k < r->ext_count; k++, e++) {
            uint64_t first = x[k].logical / bs;
            lo[e] = first;
            ph[e] = x[k].physical / bs;
            ln[e] = (x[k].logical + x[k].length + bs - 1) / bs - first;
            fl[e] = fsage_flags(x[k].flags);
        }
    }
    return NULL;
}

/* the link tables, one worker's after another */
static void *join_links(void *arg) {
    join_t *j = arg;
    size_t nlinks = 0, nnames = 0;
    for (int k = 0; k < j->nw; k++) {
        nlinks += j->ws[k].lino.len / sizeof(uint64_t);
        nnames += j->ws[k].names.len;
    }
    buf_t *col = j->out->col;
    if (alloc_col(&col[C_L_PARENT], nlinks * 8) || alloc_col(&col[C_L_INO], nlinks * 8) ||
        alloc_col(&col[C_NAME_OFF], (nlinks + 1) * 8) || alloc_col(&j->out->names, nnames)) {
        j->err = 1;
        return NULL;
    }
    uint64_t *lpar = (uint64_t *)col[C_L_PARENT].p, *lino = (uint64_t *)col[C_L_INO].p;
    uint64_t *noff = (uint64_t *)col[C_NAME_OFF].p;
    char *names = j->out->names.p;
    size_t l = 0, nb = 0;
    noff[0] = 0;
    for (int k = 0; k < j->nw; k++) {
        const walker_t *w = &j->ws[k];
        const uint64_t *wp = (const uint64_t *)w->lpar.p, *wi = (const uint64_t *)w->lino.p;
        const uint64_t *we = (const uint64_t *)w->lend.p;
        size_t cnt = w->lino.len / sizeof(uint64_t);
        for (size_t i = 0; i < cnt; i++) {
            uint64_t a = i ? we[i - 1] : 0, b = we[i];
            if (j->filter_links && !has_key(j->keys, j->n, wi[i]))
                continue;
            lpar[l] = wp[i];
            lino[l] = wi[i];
            memcpy(names + nb, w->names.p + a, b - a);
            nb += b - a;
            noff[++l] = nb;
        }
    }
    col[C_L_PARENT].len = col[C_L_INO].len = l * sizeof(uint64_t);
    col[C_NAME_OFF].len = (l + 1) * sizeof(uint64_t);
    j->out->names.len = nb;
    return NULL;
}

/* The workers' records as FileTable columns sorted by inode (an inode recorded twice, which
 * only a tree changing under the walk can cause, is kept once), and their link tables. */
int join_workers(walker_t *ws, int nw, uint64_t block_size, int filter_links,
                 joined_t *out) {
    size_t n = 0;
    for (int k = 0; k < nw; k++)
        n += ws[k].recs.len / sizeof(rec_t);
    sortkey_t *keys = malloc((n ? n : 1) * sizeof *keys);
    sortkey_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!keys || !tmp) {
        free(keys);
        free(tmp);
        return -1;
    }
    size_t at = 0;
    for (int k = 0; k < nw; k++) {
        const rec_t *r = (const rec_t *)ws[k].recs.p;
        size_t cnt = ws[k].recs.len / sizeof(rec_t);
        for (size_t i = 0; i < cnt; i++)
            keys[at++] = (sortkey_t){r[i].ino, (uint32_t)k, (uint32_t)i};
    }
    size_t kept = sort_unique(keys, tmp, n, 1);
    free(tmp);
    join_t parts[3];
    for (int p = 0; p < 3; p++)
        parts[p] = (join_t){ws, nw, keys, kept, block_size, filter_links, out, 0};
    void *(*const jobs[3])(void *) = {join_records, join_extents, join_links};
    pthread_t tids[2];
    int started[2] = {0, 0};
    for (int p = 0; p < 2; p++)
        started[p] = pthread_create(&tids[p], NULL, jobs[p], &parts[p]) == 0;
    for (int p = 0; p < 2; p++)
        if (!started[p])
            jobs[p](&parts[p]);
    join_links(&parts[2]);
    for (int p = 0; p < 2; p++)
        if (started[p])
            pthread_join(tids[p], NULL);
    free(keys);
    return parts[0].err || parts[1].err || parts[2].err ? -1 : 0;
}
