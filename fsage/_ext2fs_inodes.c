/* fsage._ext2fs: scan(), the per-inode loop of the read-only scanner (see _ext2fs.c).
 *
 * The loop hands Python columnar batches, so no Python object is made per inode or per block.
 * Damage found while scanning (bad checksums, broken extent trees, blocks out of range) is
 * recorded per inode as a bit set and the scan goes on.
 */
#include "_ext2fs_scanner.h"

#include <ext2fs/ext3_extents.h>
#include <pthread.h>
#include <time.h>

/* Keep in step with fsage/layout.py. */
#define EXTENT_UNWRITTEN 1u
#define META_EXTENT_NODE 1
#define META_IND 2
#define META_DIND 3
#define META_TIND 4
#define META_XATTR 5
#define DAMAGE_INODE_CHECKSUM 1u
#define DAMAGE_GARBAGE_INODE 2u
#define DAMAGE_EXTENT_TREE 4u
#define DAMAGE_BLOCK_MAP 8u
#define DAMAGE_BLOCK_OUT_OF_RANGE 16u
#define DAMAGE_DIRECTORY 32u
#define DAMAGE_BLOCK_COUNT 64u

/* Columns of one batch of inodes. */
typedef struct {
    Buf ino, generation, mode, nlink, uid, gid, size, atime, mtime, ctime, crtime, flags, damaged,
        special, ext_count, ext_logical, ext_physical, ext_length, ext_flags, meta_count,
        meta_physical, meta_kind;
} Batch;

static void batch_free(Batch *t) {
    Buf *cols = (Buf *)t;
    for (size_t i = 0; i < sizeof(Batch) / sizeof(Buf); i++)
        buf_free(&cols[i]);
}

/* Per-file state while collecting extents. */
typedef struct {
    Batch *t;
    ext2_filsys fs;
    uint32_t n_ext, n_meta;
    uint32_t damage;
    uint64_t data_blocks; /* blocks of all extents, for the check against i_blocks */
    uint64_t next_logical; /* where the previous leaf extent ended: extents come in order */
    int have_last;
    uint64_t last_logical, last_physical, last_length;
    uint32_t last_flags;
    int oom;
} FileAcc;

static int acc_flush(FileAcc *a) {
    if (!a->have_last)
        return 0;
    Batch *t = a->t;
    PUT(&t->ext_logical, uint64_t, a->last_logical);
    PUT(&t->ext_physical, uint64_t, a->last_physical);
    PUT(&t->ext_length, uint64_t, a->last_length);
    PUT(&t->ext_flags, uint32_t, a->last_flags);
    a->n_ext++;
    a->have_last = 0;
    return 0;
nomem:
    a->oom = 1;
    return -1;
}

static void check_range(FileAcc *a, uint64_t physical, uint64_t length) {
    uint64_t first = a->fs->super->s_first_data_block;
    uint64_t total = ext2fs_blocks_count(a->fs->super);
    if (physical == 0 || physical < first || physical + length > total ||
        physical + length < physical)
        a->damage |= DAMAGE_BLOCK_OUT_OF_RANGE;
}

/* Add a run of data blocks, merging it into the previous one when both logically and
 * physically contiguous with the same flags (ext4 splits long runs at 32768 blocks). */
static int acc_extent(FileAcc *a, uint64_t logical, uint64_t physical, uint64_t length,
                      uint32_t flags) {
    check_range(a, physical, length);
    a->data_blocks += length;
    if (a->have_last && a->last_flags == flags && a->last_logical + a->last_length == logical &&
        a->last_physical + a->last_length == physical) {
        a->last_length += length;
        return 0;
    }
    if (acc_flush(a))
        return -1;
    a->have_last = 1;
    a->last_logical = logical;
    a->last_physical = physical;
    a->last_length = length;
    a->last_flags = flags;
    return 0;
}

static int acc_meta(FileAcc *a, uint64_t physical, int kind) {
    check_range(a, physical, 1);
    PUT(&a->t->meta_physical, uint64_t, physical);
    PUT(&a->t->meta_kind, uint8_t, kind);
    a->n_meta++;
    return 0;
nomem:
    a->oom = 1;
    return -1;
}

/* Most files keep their whole extent tree in the inode (depth 0, at most 4 extents): read
 * those entries straight from i_block instead of opening an extent handle for each inode.
 * Anything unusual (a bad header, a deeper tree) takes the libext2fs path below. */
static int walk_inline_extents(FileAcc *a, struct ext2_inode *inode) {
    const struct ext3_extent_header *eh = (const struct ext3_extent_header *)inode->i_block;
    uint16_t entries = ext2fs_le16_to_cpu(eh->eh_entries);
    uint16_t max = ext2fs_le16_to_cpu(eh->eh_max);
    if (ext2fs_le16_to_cpu(eh->eh_magic) != EXT3_EXT_MAGIC || eh->eh_depth != 0 ||
        max > 4 || entries > max)
        return 0;
    const struct ext3_extent *ex = (const struct ext3_extent *)(eh + 1);
    for (uint16_t i = 0; i < entries; i++) {
        uint32_t len = ext2fs_le16_to_cpu(ex[i].ee_len);
        uint32_t fl = 0;
        if (len > EXT_INIT_MAX_LEN) {
            len -= EXT_INIT_MAX_LEN;
            fl = EXTENT_UNWRITTEN;
        }
        uint32_t lblk = ext2fs_le32_to_cpu(ex[i].ee_block);
        if (len == 0 || lblk < a->next_logical) {
            a->damage |= DAMAGE_EXTENT_TREE; /* e2fsck: invalid or out-of-order extent */
            continue;
        }
        a->next_logical = (uint64_t)lblk + len;
        uint64_t pblk = ((uint64_t)ext2fs_le16_to_cpu(ex[i].ee_start_hi) << 32) |
                        ext2fs_le32_to_cpu(ex[i].ee_start);
        if (acc_extent(a, lblk, pblk, len, fl))
            break;
    }
    return 1;
}

static void walk_extents(FileAcc *a, ext2_ino_t ino, struct ext2_inode *inode) {
    if (walk_inline_extents(a, inode))
        return;
    ext2_extent_handle_t h;
    errcode_t r = ext2fs_extent_open2(a->fs, ino, inode, &h);
    if (r) {
        a->damage |= DAMAGE_EXTENT_TREE;
        return;
    }
    struct ext2fs_extent ex;
    int op = EXT2_EXTENT_ROOT;
    /* Bound the walk: a corrupt tree must not loop forever. */
    uint64_t limit = 16u * 1024u * 1024u;
    while (limit--) {
        r = ext2fs_extent_get(h, op, &ex);
        if (r) {
            if (r != EXT2_ET_EXTENT_NO_NEXT && r != EXT2_ET_EXTENT_NO_DOWN)
                a->damage |= DAMAGE_EXTENT_TREE;
            break;
        }
        op = EXT2_EXTENT_NEXT;
        if (ex.e_flags & EXT2_EXTENT_FLAGS_SECOND_VISIT)
            continue;
        if (!(ex.e_flags & EXT2_EXTENT_FLAGS_LEAF)) {
            /* An index entry: e_pblk is the tree block below it. */
            if (acc_meta(a, ex.e_pblk, META_EXTENT_NODE))
                break;
            continue;
        }
        if (ex.e_len == 0 || ex.e_lblk < a->next_logical) {
            a->damage |= DAMAGE_EXTENT_TREE; /* e2fsck: invalid or out-of-order extent */
            continue;
        }
        a->next_logical = (uint64_t)ex.e_lblk + ex.e_len;
        uint32_t fl = (ex.e_flags & EXT2_EXTENT_FLAGS_UNINIT) ? EXTENT_UNWRITTEN : 0;
        if (acc_extent(a, ex.e_lblk, ex.e_pblk, ex.e_len, fl))
            break;
    }
    ext2fs_extent_free(h);
}

static int block_cb(ext2_filsys fs, blk64_t *blocknr, e2_blkcnt_t blockcnt, blk64_t ref_blk,
                    int ref_offset, void *priv) {
    (void)fs;
    (void)ref_blk;
    (void)ref_offset;
    FileAcc *a = priv;
    int rc;
    if (blockcnt >= 0)
        rc = acc_extent(a, (uint64_t)blockcnt, *blocknr, 1, 0);
    else if (blockcnt == BLOCK_COUNT_IND)
        rc = acc_meta(a, *blocknr, META_IND);
    else if (blockcnt == BLOCK_COUNT_DIND)
        rc = acc_meta(a, *blocknr, META_DIND);
    else if (blockcnt == BLOCK_COUNT_TIND)
        rc = acc_meta(a, *blocknr, META_TIND);
    else
        rc = 0;
    return rc ? BLOCK_ABORT : 0;
}

static void walk_block_map(FileAcc *a, ext2_ino_t ino, struct ext2_inode *inode) {
    int indirect = inode->i_block[EXT2_IND_BLOCK] || inode->i_block[EXT2_DIND_BLOCK] ||
                   inode->i_block[EXT2_TIND_BLOCK];
    if (!indirect) {
        /* Direct blocks only: read them from the inode, no I/O. */
        for (uint64_t i = 0; i < EXT2_NDIR_BLOCKS; i++) {
            if (inode->i_block[i] && acc_extent(a, i, inode->i_block[i], 1, 0))
                return;
        }
        return;
    }
    errcode_t r = ext2fs_block_iterate3(a->fs, ino, BLOCK_FLAG_READ_ONLY, NULL, block_cb, a);
    if (r)
        a->damage |= DAMAGE_BLOCK_MAP;
}

/* ---------- inode checksums ----------
 *
 * libext2fs verifies every inode the scan passes, free ones included, with a table-driven
 * crc32c; that was two fifths of the scan. The scan is told to skip it and the inodes in use
 * are verified here, with the CPU's crc32c instruction where there is one. Same sum: crc32c of
 * the inode number, the generation and the whole on-disk inode with its checksum fields zeroed,
 * seeded with the file system's checksum seed. */

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p,
                                                            size_t n) {
    uint64_t c = crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n; n--, p++)
        c32 = __builtin_ia32_crc32qi(c32, *p);
    return c32;
}
static int have_crc32c_hw(void) { return __builtin_cpu_supports("sse4.2"); }
#else
static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
    return ext2fs_crc32c_le(crc, p, n);
}
static int have_crc32c_hw(void) { return 0; }
#endif

static int inode_csum_ok(ext2_filsys fs, ext2_ino_t ino, const struct ext2_inode_large *inode,
                         int use_hw) {
    if (!use_hw)
        return ext2fs_inode_csum_verify(fs, ino, (struct ext2_inode_large *)inode);
    size_t size = EXT2_INODE_SIZE(fs->super);
    unsigned char copy[1024];
    if (size > sizeof copy)
        return ext2fs_inode_csum_verify(fs, ino, (struct ext2_inode_large *)inode);
    memcpy(copy, inode, size);
    struct ext2_inode_large *c = (struct ext2_inode_large *)copy;
    int has_hi = size > EXT2_GOOD_OLD_INODE_SIZE &&
                 c->i_extra_isize >= EXT4_INODE_CSUM_HI_EXTRA_END;
    uint32_t provided = c->i_checksum_lo;
    c->i_checksum_lo = 0;
    if (has_hi) {
        provided |= (uint32_t)c->i_checksum_hi << 16;
        c->i_checksum_hi = 0;
    }
    uint32_t le_ino = ino, gen = c->i_generation; /* little-endian machines only (x86) */
    uint32_t crc = crc32c_hw(fs->csum_seed, (const unsigned char *)&le_ino, 4);
    crc = crc32c_hw(crc, (const unsigned char *)&gen, 4);
    crc = crc32c_hw(crc, copy, size);
    if (!has_hi)
        crc &= 0xFFFF;
    if (crc == provided)
        return 1;
    /* As libext2fs: an all-zero inode passes. */
    for (size_t i = 0; i < sizeof(struct ext2_inode); i++)
        if (copy[i])
            return 0;
    return 1;
}

static int64_t ext_time(uint32_t seconds, uint32_t extra, int have_extra) {
    int64_t s = (int64_t)(int32_t)seconds;
    int64_t ns = 0;
    if (have_extra) {
        s += (int64_t)(extra & EXT4_EPOCH_MASK) << 32;
        ns = extra >> EXT4_EPOCH_BITS;
    }
    return s * 1000000000LL + ns;
}

#define HAS_EXTRA(inode, field)                                                                    \
    (EXT2_INODE_SIZE(fs->super) > EXT2_GOOD_OLD_INODE_SIZE &&                                      \
     offsetof(struct ext2_inode_large, field) + sizeof((inode)->field) <=                          \
         (size_t)EXT2_GOOD_OLD_INODE_SIZE + (inode)->i_extra_isize)

/* ---------- the inode scan, split over threads ----------
 *
 * Each job scans a run of block groups through a libext2fs handle of its own (a handle is not
 * safe to share between threads); their columns are joined in group order, so the result is
 * the same as one scan's. */

typedef struct {
    ext2_filsys fs;
    dgrp_t group_first;
    ext2_ino_t last_ino; /* the last inode of the job's last group */
    char *inode_buf;
    int inode_buf_size;
    int verify_csum, use_hw;
    Batch t;
    Buf dirs; /* u64 inode numbers of the directories seen, for the directory pass */
    errcode_t err;
    uint64_t seen;  /* inodes recorded so far (atomic: read by the thread reporting progress) */
    int finished;   /* atomic: set when the job is over */
} ScanJob;

static void *scan_job_run(void *arg) {
    ScanJob *job = arg;
    ext2_filsys fs = job->fs;
    Batch *t = &job->t;
    ext2_inode_scan scan;
    ext2_ino_t first_ino = EXT2_FIRST_INODE(fs->super);
    int verify_csum = job->verify_csum, use_hw = job->use_hw;
    job->err = ext2fs_open_inode_scan(fs, 0, &scan);
    if (job->err)
        return NULL;
    /* A bad block in the inode table is reported per inode, not as the end of the scan. */
    ext2fs_inode_scan_flags(scan, EXT2_SF_SKIP_MISSING_ITABLE, 0);
    if (job->group_first) {
        job->err = ext2fs_inode_scan_goto_blockgroup(scan, job->group_first);
        if (job->err) {
            ext2fs_close_inode_scan(scan);
            return NULL;
        }
    }
    for (;;) {
        ext2_ino_t ino;
        struct ext2_inode_large *inode = (struct ext2_inode_large *)job->inode_buf;
        /* Checksums are verified below, for the inodes in use only (see inode_csum_ok). */
        fs->flags |= EXT2_FLAG_IGNORE_CSUM_ERRORS;
        errcode_t r = ext2fs_get_next_inode_full(scan, &ino, (struct ext2_inode *)inode,
                                                 job->inode_buf_size);
        fs->flags &= ~EXT2_FLAG_IGNORE_CSUM_ERRORS;
        uint32_t damage = 0;
        if (r == EXT2_ET_BAD_BLOCK_IN_INODE_TABLE) {
            continue;
        } else if (r == EXT2_ET_INODE_CSUM_INVALID) {
            damage |= DAMAGE_INODE_CHECKSUM;
        } else if (r == EXT2_ET_INODE_IS_GARBAGE) {
            damage |= DAMAGE_GARBAGE_INODE;
        } else if (r) {
            job->err = r;
            break;
        }
        if (ino == 0 || ino > job->last_ino)
            break;
        if (!ext2fs_test_inode_bitmap2(fs->inode_map, ino))
            continue;
        if (verify_csum && !r && !inode_csum_ok(fs, ino, inode, use_hw))
            damage |= DAMAGE_INODE_CHECKSUM;
        int special = ino < first_ino && ino != EXT2_ROOT_INO;
        if (special && inode->i_mode == 0 && inode->i_links_count == 0 &&
            ext2fs_get_stat_i_blocks(fs, (struct ext2_inode *)inode) == 0)
            continue; /* an unused reserved inode */

        /* In use by the bitmap but with no type: a zeroed or garbage inode. (A link count of
         * 0 is legitimate: an open, unlinked file on a mounted file system.) */
        if (!special && inode->i_mode == 0)
            damage |= DAMAGE_GARBAGE_INODE;

        FileAcc a;
        memset(&a, 0, sizeof a);
        a.t = t;
        a.fs = fs;
        a.damage = damage;
        if (!(damage & DAMAGE_GARBAGE_INODE)) {
            struct ext2_inode *in = (struct ext2_inode *)inode;
            if (in->i_flags & EXT4_INLINE_DATA_FL) {
                /* data lives in the inode and its xattrs: no blocks */
            } else if (in->i_flags & EXT4_EXTENTS_FL) {
                walk_extents(&a, ino, in);
            } else if (ext2fs_inode_has_valid_blocks2(fs, in)) {
                walk_block_map(&a, ino, in);
            }
            blk64_t acl = ext2fs_file_acl_block(fs, in);
            if (acl)
                acc_meta(&a, acl, META_XATTR);
            acc_flush(&a);
            /* i_blocks counts every block the inode maps (data, tree or indirect blocks, its
             * xattr block), as e2fsck checks it. Reserved inodes (the resize inode maps the
             * reserved descriptor blocks its own way) and bigalloc's clusters are left out. */
            if (!special && !ext2fs_has_feature_bigalloc(fs->super)) {
                uint64_t mapped = (a.data_blocks + a.n_meta) * (fs->blocksize / 512);
                if (mapped != ext2fs_get_stat_i_blocks(fs, in))
                    a.damage |= DAMAGE_BLOCK_COUNT;
            }
        }
        if (a.oom)
            goto nomem;

        struct ext2_inode_large *L = inode;
        PUT(&t->ino, uint64_t, ino);
        PUT(&t->generation, uint32_t, L->i_generation);
        PUT(&t->mode, uint32_t, L->i_mode);
        PUT(&t->nlink, uint32_t, L->i_links_count);
        PUT(&t->uid, uint32_t, inode_uid(*L));
        PUT(&t->gid, uint32_t, inode_gid(*L));
        PUT(&t->size, uint64_t, EXT2_I_SIZE(L));
        PUT(&t->atime, int64_t, ext_time(L->i_atime, L->i_atime_extra, HAS_EXTRA(L, i_atime_extra)));
        PUT(&t->mtime, int64_t, ext_time(L->i_mtime, L->i_mtime_extra, HAS_EXTRA(L, i_mtime_extra)));
        PUT(&t->ctime, int64_t, ext_time(L->i_ctime, L->i_ctime_extra, HAS_EXTRA(L, i_ctime_extra)));
        PUT(&t->crtime, int64_t,
            HAS_EXTRA(L, i_crtime_extra)
                ? ext_time(L->i_crtime, L->i_crtime_extra, 1)
                : 0);
        PUT(&t->flags, uint32_t, L->i_flags);
        PUT(&t->damaged, uint32_t, a.damage);
        PUT(&t->special, uint8_t, special);
        PUT(&t->ext_count, uint32_t, a.n_ext);
        PUT(&t->meta_count, uint32_t, a.n_meta);
        if (LINUX_S_ISDIR(L->i_mode) && !(a.damage & DAMAGE_GARBAGE_INODE))
            PUT(&job->dirs, uint64_t, ino);
        __atomic_store_n(&job->seen, job->seen + 1, __ATOMIC_RELAXED); /* only this thread writes */
        continue;
    nomem:
        job->err = EXT2_ET_NO_MEMORY;
        break;
    }
    ext2fs_close_inode_scan(scan);
    return NULL;
}

/* A scan job on a thread of its own, saying when it is over. */
static void *scan_job_thread(void *arg) {
    scan_job_run(arg);
    __atomic_store_n(&((ScanJob *)arg)->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

#define PROGRESS_NS 100000000L /* between progress reports */

/* The scan jobs, every one on a thread of its own, while this thread calls
 * progress(inodes recorded, total) at once and then every PROGRESS_NS (taking the GIL back
 * from *ts only for the call). 0, or -1 with the exception set once progress raised (it is not called again;
 * the jobs still run to their end). */
static int run_scan_reporting(ScanJob *jobs, int n, PyObject *progress, uint64_t total,
                              PyThreadState **ts) {
    pthread_t tids[MAX_JOBS];
    int started[MAX_JOBS] = {0};
    for (int k = 0; k < n; k++)
        started[k] = pthread_create(&tids[k], NULL, scan_job_thread, &jobs[k]) == 0;
    for (int k = 0; k < n; k++)
        if (!started[k])
            scan_job_thread(&jobs[k]); /* no thread to be had: run it here */
    int failed = 0;
    long waited = PROGRESS_NS; /* the first report right away, so that every scan makes one */
    for (;;) {
        if (!failed && waited >= PROGRESS_NS) {
            waited = 0;
            uint64_t done = 0;
            for (int k = 0; k < n; k++)
                done += __atomic_load_n(&jobs[k].seen, __ATOMIC_RELAXED);
            PyEval_RestoreThread(*ts);
            PyObject *r = PyObject_CallFunction(progress, "KK", (unsigned long long)done,
                                                (unsigned long long)total);
            if (r)
                Py_DECREF(r);
            else
                failed = 1;
            *ts = PyEval_SaveThread();
        }
        int all = 1;
        for (int k = 0; k < n; k++)
            all &= __atomic_load_n(&jobs[k].finished, __ATOMIC_ACQUIRE);
        if (all)
            break;
        struct timespec pause = {0, PROGRESS_NS / 20}; /* notice the end soon after */
        nanosleep(&pause, NULL);
        waited += PROGRESS_NS / 20;
    }
    for (int k = 0; k < n; k++)
        if (started[k])
            pthread_join(tids[k], NULL);
    return failed ? -1 : 0;
}

static const char *const BATCH_COLUMNS[] = {
    "ino", "generation", "mode", "nlink", "uid", "gid", "size", "atime", "mtime", "ctime",
    "crtime", "flags", "damaged", "special", "ext_count", "ext_logical", "ext_physical",
    "ext_length", "ext_flags", "meta_count", "meta_physical", "meta_kind",
};

/* scan(threads, progress=None) -> dict of column bytearrays: every inode in use. */
PyObject *scanner_scan(Scanner *self, PyObject *args) {
    int threads;
    PyObject *progress = Py_None;
    if (!PyArg_ParseTuple(args, "i|O", &threads, &progress))
        return NULL;
    if (progress != Py_None && !PyCallable_Check(progress)) {
        PyErr_SetString(PyExc_TypeError, "progress must be callable or None");
        return NULL;
    }
    if (!self->fs) {
        PyErr_SetString(PyExc_ValueError, "scanner is closed");
        return NULL;
    }
    if (self->scan_done) {
        PyErr_SetString(PyExc_RuntimeError, "the inode scan has run already");
        return NULL;
    }
    ext2_filsys fs = self->fs;
    dgrp_t groups = fs->group_desc_count;
    int n = threads < 1 ? 1 : threads > MAX_JOBS ? MAX_JOBS : threads;
    if ((dgrp_t)n > groups)
        n = (int)groups;
    /* Split the groups so that each job gets about as many inodes in use. */
    uint64_t ipg = EXT2_INODES_PER_GROUP(fs->super), used_total = 0;
    for (dgrp_t g = 0; g < groups; g++)
        used_total += ipg - ext2fs_bg_free_inodes_count(fs, g);
    ScanJob jobs[MAX_JOBS];
    memset(jobs, 0, sizeof jobs);
    errcode_t err = 0;
    int inode_size = EXT2_INODE_SIZE(fs->super);
    if (inode_size < (int)sizeof(struct ext2_inode_large))
        inode_size = sizeof(struct ext2_inode_large);
    dgrp_t g = 0;
    uint64_t used = 0;
    for (int k = 0; k < n; k++) {
        ScanJob *job = &jobs[k];
        job->group_first = g;
        uint64_t share = used_total * (uint64_t)(k + 1) / (uint64_t)n;
        while (g < groups && (used < share || g == job->group_first || k == n - 1) &&
               groups - g > (dgrp_t)(n - 1 - k)) {
            used += ipg - ext2fs_bg_free_inodes_count(fs, g);
            g++;
        }
        job->last_ino = (ext2_ino_t)((uint64_t)g * ipg);
        job->verify_csum = ext2fs_has_feature_metadata_csum(fs->super);
        job->use_hw = have_crc32c_hw();
        job->inode_buf_size = inode_size;
        job->inode_buf = calloc(1, (size_t)inode_size);
        if (!job->inode_buf && !err)
            err = EXT2_ET_NO_MEMORY;
    }
    int raised = 0;
    PyThreadState *ts = PyEval_SaveThread();
    for (int k = 0; k < n && !err; k++)
        err = job_handle(self, k, &jobs[k].fs);
    if (!err && progress != Py_None)
        raised = run_scan_reporting(jobs, n, progress, used_total, &ts) < 0;
    else if (!err)
        run_jobs(scan_job_run, jobs, sizeof(ScanJob), n);
    PyEval_RestoreThread(ts);
    for (int k = 0; k < n && !err; k++)
        err = jobs[k].err;
    PyObject *out = NULL;
    if (raised) {
        /* progress raised: that exception, nothing else (the scan may be run again) */
    } else if (!err) {
        self->scan_done = 1;
        for (int k = 0; k < n; k++) {
            Buf *d = &jobs[k].dirs;
            if (buf_put(&self->dirs, d->data ? d->data : "", d->len))
                err = EXT2_ET_NO_MEMORY;
        }
    }
    if (!raised && !err && (out = PyDict_New())) {
        size_t ncols = sizeof BATCH_COLUMNS / sizeof BATCH_COLUMNS[0];
        for (size_t c = 0; c < ncols; c++) {
            Buf *parts[MAX_JOBS];
            for (int k = 0; k < n; k++)
                parts[k] = (Buf *)&jobs[k].t + c;
            PyObject *col = join_parts(parts, n, 0);
            if (!col || PyDict_SetItemString(out, BATCH_COLUMNS[c], col)) {
                Py_XDECREF(col);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(col);
        }
    }
    for (int k = 0; k < n; k++) {
        batch_free(&jobs[k].t);
        buf_free(&jobs[k].dirs);
        free(jobs[k].inode_buf);
    }
    if (raised)
        return NULL;
    if (err == EXT2_ET_NO_MEMORY)
        return PyErr_NoMemory();
    if (err)
        return fsage_raise(err, "scanning inodes");
    return out;
}
