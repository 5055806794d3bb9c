/* fsage._ext2fs: a read-only scanner of ext2/3/4 images and devices over libext2fs.
 *
 * The per-inode loop runs here and hands Python columnar batches as bytes objects (the Python
 * side views them with numpy.frombuffer), so no Python object is made per inode or per block.
 * Damage found while scanning (bad checksums, broken extent trees, blocks out of range) is
 * recorded per inode as a bit set and the scan goes on.
 */
#include "_ext2fs.h"

#include <e2p/e2p.h>
#include <ext2fs/ext3_extents.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
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

PyObject *fsage_Ext2fsError;

PyObject *fsage_raise(errcode_t err, const char *what) {
    PyObject *args = Py_BuildValue("(Lss)", (long long)err, what, error_message(err));
    if (args) {
        PyErr_SetObject(fsage_Ext2fsError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* ---------- growable column buffers ---------- */

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int buf_grow(Buf *b, size_t more) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

static inline int buf_reserve(Buf *b, size_t more) {
    if (__builtin_expect(b->len + more <= b->cap, 1))
        return 0;
    return buf_grow(b, more);
}

static inline int buf_put(Buf *b, const void *v, size_t n) {
    if (buf_reserve(b, n))
        return -1;
    memcpy(b->data + b->len, v, n);
    b->len += n;
    return 0;
}

#define PUT(b, type, value)                                                                        \
    do {                                                                                           \
        type _v = (type)(value);                                                                   \
        if (buf_put((b), &_v, sizeof _v))                                                          \
            goto nomem;                                                                            \
    } while (0)

static void buf_free(Buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static PyObject *buf_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

/* A column as a bytearray: numpy views it writable, so Python needs no copy of its own. */
static PyObject *buf_column(Buf *b) {
    return PyByteArray_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

/* ---------- the scanner object ---------- */

#define MAX_JOBS 8 /* threads of the inode scan and the directory pass */

typedef struct {
    PyObject_HEAD ext2_filsys fs;
    char *path;
    ext2_filsys helpers[MAX_JOBS - 1]; /* more handles for the other threads, opened on demand */
    int scan_done;
    Buf dirs; /* u64 inode numbers of directories seen, for the directory pass */
    long io_errors; /* reads the device refused (EIO, a short read), over all handles */
} Scanner;

/* Every failed read of a handle of a scanner is counted in the scanner (the channel's
 * app_data), so that a device that fails under the scan is not taken for a damaged file
 * system; the error still goes back to libext2fs, which records the damage as before. */
static errcode_t count_read_error(io_channel channel, unsigned long block, int count, void *data,
                                  size_t size, int actual, errcode_t error) {
    (void)block;
    (void)count;
    (void)data;
    (void)size;
    (void)actual;
    long *counter = channel->app_data;
    if (counter)
        __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    return error;
}

static void watch_reads(Scanner *self, ext2_filsys fs) {
    fs->io->app_data = &self->io_errors;
    fs->io->read_error = count_read_error;
}

/* libext2fs reports some problems itself through com_err, on stderr ("Illegal block number
 * passed to ext2fs_mark_block_bitmap ..."); fsage records them as damage or an error of its
 * own, so they are dropped here rather than printed ahead of fsage's output. */
static void quiet_com_err(const char *whoami, errcode_t code, const char *fmt, va_list args) {
    (void)whoami;
    (void)code;
    (void)fmt;
    (void)args;
}

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

/* A second handle on the same file system for another thread: what the scan and the
 * directory pass read (superblock, group descriptors, inode bitmap). */
static errcode_t open_helper(Scanner *self, ext2_filsys *out) {
    int flags = EXT2_FLAG_64BITS | EXT2_FLAG_IGNORE_CSUM_ERRORS | EXT2_FLAG_SOFTSUPP_FEATURES;
    errcode_t r = ext2fs_open2(self->path, NULL, flags, 0, 0, unix_io_manager, out);
    if (!r) {
        watch_reads(self, *out);
        r = ext2fs_read_inode_bitmap(*out);
        if (r)
            ext2fs_close_free(out);
        else
            (*out)->flags &= ~EXT2_FLAG_IGNORE_CSUM_ERRORS;
    }
    return r;
}

/* The handle of job k (0: the scanner's own), opening helpers as needed. */
static errcode_t job_handle(Scanner *self, int k, ext2_filsys *out) {
    if (k == 0) {
        *out = self->fs;
        return 0;
    }
    if (!self->helpers[k - 1]) {
        errcode_t r = open_helper(self, &self->helpers[k - 1]);
        if (r)
            return r;
    }
    *out = self->helpers[k - 1];
    return 0;
}

/* Run fn(job) for jobs 1..n-1 on threads and job 0 here; wait for all. */
static void run_jobs(void *(*fn)(void *), void *jobs, size_t job_size, int n) {
    pthread_t tids[MAX_JOBS];
    int started[MAX_JOBS] = {0};
    for (int k = 1; k < n; k++)
        started[k] = pthread_create(&tids[k], NULL, fn, (char *)jobs + k * job_size) == 0;
    fn(jobs);
    for (int k = 1; k < n; k++) {
        if (started[k])
            pthread_join(tids[k], NULL);
        else
            fn((char *)jobs + k * job_size); /* no thread to be had: run it here */
    }
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

/* Every job's part of one column, joined in job order: a bytearray (numeric columns, viewed
 * by numpy) or, with as_bytes, a bytes object (names). */
static PyObject *join_parts(Buf *const *parts, int n, int as_bytes) {
    size_t total = 0;
    for (int k = 0; k < n; k++)
        total += parts[k]->len;
    PyObject *out = as_bytes ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total)
                             : PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!out)
        return NULL;
    char *p = as_bytes ? PyBytes_AS_STRING(out) : PyByteArray_AS_STRING(out);
    for (int k = 0; k < n; k++) {
        if (parts[k]->len)
            memcpy(p, parts[k]->data, parts[k]->len);
        p += parts[k]->len;
    }
    return out;
}

static const char *const BATCH_COLUMNS[] = {
    "ino", "generation", "mode", "nlink", "uid", "gid", "size", "atime", "mtime", "ctime",
    "crtime", "flags", "damaged", "special", "ext_count", "ext_logical", "ext_physical",
    "ext_length", "ext_flags", "meta_count", "meta_physical", "meta_kind",
};

/* scan(threads, progress=None) -> dict of column bytearrays: every inode in use. */
static PyObject *scanner_scan(Scanner *self, PyObject *args) {
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

/* ---------- directory pass ---------- */

typedef struct {
    Buf parent, ino, name_len, names;
    ext2_ino_t dir;
    int oom;
} DirAcc;

static int dir_cb(ext2_ino_t dir, int entry, struct ext2_dir_entry *dirent, int offset,
                  int blocksize, char *buf, void *priv) {
    (void)dir;
    (void)offset;
    (void)blocksize;
    (void)buf;
    DirAcc *d = priv;
    if (entry == DIRENT_DOT_FILE || entry == DIRENT_DOT_DOT_FILE || entry == DIRENT_CHECKSUM)
        return 0;
    if (dirent->inode == 0)
        return 0;
    int len = ext2fs_dirent_name_len(dirent);
    /* Inline-data directories hand '..' over as an ordinary entry. */
    if ((len == 1 && dirent->name[0] == '.') ||
        (len == 2 && dirent->name[0] == '.' && dirent->name[1] == '.'))
        return 0;
    PUT(&d->parent, uint64_t, d->dir);
    PUT(&d->ino, uint64_t, dirent->inode);
    PUT(&d->name_len, uint32_t, len);
    if (buf_put(&d->names, dirent->name, (size_t)len))
        goto nomem;
    return 0;
nomem:
    d->oom = 1;
    return DIRENT_ABORT;
}

typedef struct {
    ext2_filsys fs;
    const uint64_t *dirs;
    size_t n;
    DirAcc d;
    Buf damaged;
    int oom;
} DirJob;

static void *dir_job_run(void *arg) {
    DirJob *job = arg;
    for (size_t i = 0; i < job->n && !job->d.oom && !job->oom; i++) {
        job->d.dir = (ext2_ino_t)job->dirs[i];
        errcode_t r = ext2fs_dir_iterate2(job->fs, job->d.dir, 0, NULL, dir_cb, &job->d);
        if (r && !job->d.oom && buf_put(&job->damaged, &job->dirs[i], sizeof job->dirs[i]))
            job->oom = 1;
    }
    return NULL;
}

/* links(threads) -> dict(parent, ino, name_len, names, damaged_dirs): every entry of every
 * directory seen by the inode scan, the directories split over threads. */
static PyObject *scanner_links(Scanner *self, PyObject *args) {
    int threads;
    if (!PyArg_ParseTuple(args, "i", &threads))
        return NULL;
    if (!self->fs) {
        PyErr_SetString(PyExc_ValueError, "scanner is closed");
        return NULL;
    }
    if (!self->scan_done) {
        PyErr_SetString(PyExc_RuntimeError, "links() needs a finished inode scan");
        return NULL;
    }
    size_t n_dirs = self->dirs.len / sizeof(uint64_t);
    const uint64_t *dirs = (const uint64_t *)self->dirs.data;
    int n = threads < 1 ? 1 : threads > MAX_JOBS ? MAX_JOBS : threads;
    if ((size_t)n > n_dirs / 64 + 1) /* a few directories are not worth a thread */
        n = (int)(n_dirs / 64 + 1);
    DirJob jobs[MAX_JOBS];
    memset(jobs, 0, sizeof jobs);
    errcode_t err = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (int k = 0; k < n && !err; k++) {
        jobs[k].dirs = dirs + n_dirs * (size_t)k / (size_t)n;
        jobs[k].n = n_dirs * (size_t)(k + 1) / (size_t)n - n_dirs * (size_t)k / (size_t)n;
        err = job_handle(self, k, &jobs[k].fs);
    }
    if (!err)
        run_jobs(dir_job_run, jobs, sizeof(DirJob), n);
    Py_END_ALLOW_THREADS;
    PyObject *out = NULL;
    int oom = 0;
    for (int k = 0; k < n; k++)
        oom |= jobs[k].oom || jobs[k].d.oom;
    if (err) {
        fsage_raise(err, "opening the file system again for the directory pass");
    } else if (oom) {
        PyErr_NoMemory();
    } else {
        Buf *parent[MAX_JOBS], *ino[MAX_JOBS], *name_len[MAX_JOBS], *names[MAX_JOBS],
            *damaged[MAX_JOBS];
        for (int k = 0; k < n; k++) {
            parent[k] = &jobs[k].d.parent;
            ino[k] = &jobs[k].d.ino;
            name_len[k] = &jobs[k].d.name_len;
            names[k] = &jobs[k].d.names;
            damaged[k] = &jobs[k].damaged;
        }
        PyObject *names_bytes = join_parts(names, n, 1);
        PyObject *damaged_bytes = join_parts(damaged, n, 1);
        if (names_bytes && damaged_bytes)
            out = Py_BuildValue("{s:N,s:N,s:N,s:O,s:O}", "parent", join_parts(parent, n, 0), "ino",
                                join_parts(ino, n, 0), "name_len", join_parts(name_len, n, 0),
                                "names", names_bytes, "damaged_dirs", damaged_bytes);
        Py_XDECREF(names_bytes);
        Py_XDECREF(damaged_bytes);
    }
    for (int k = 0; k < n; k++) {
        buf_free(&jobs[k].d.parent);
        buf_free(&jobs[k].d.ino);
        buf_free(&jobs[k].d.name_len);
        buf_free(&jobs[k].d.names);
        buf_free(&jobs[k].damaged);
    }
    return out;
}

/* ---------- free space ---------- */

/* free_extents() -> (start bytes, length bytes) as u64 arrays, from the block bitmap. */
static PyObject *scanner_free_extents(Scanner *self, PyObject *noargs) {
    (void)noargs;
    if (!self->fs) {
        PyErr_SetString(PyExc_ValueError, "scanner is closed");
        return NULL;
    }
    ext2_filsys fs = self->fs;
    Buf starts, lengths;
    memset(&starts, 0, sizeof starts);
    memset(&lengths, 0, sizeof lengths);
    blk64_t pos = fs->super->s_first_data_block;
    blk64_t end = ext2fs_blocks_count(fs->super) - 1;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS;
    while (pos <= end) {
        blk64_t first_free, first_used;
        if (ext2fs_find_first_zero_block_bitmap2(fs->block_map, pos, end, &first_free))
            break;
        if (ext2fs_find_first_set_block_bitmap2(fs->block_map, first_free, end, &first_used))
            first_used = end + 1;
        uint64_t s = first_free, l = first_used - first_free;
        if (buf_put(&starts, &s, sizeof s) || buf_put(&lengths, &l, sizeof l)) {
            oom = 1;
            break;
        }
        pos = first_used;
    }
    Py_END_ALLOW_THREADS;
    if (oom) {
        buf_free(&starts);
        buf_free(&lengths);
        return PyErr_NoMemory();
    }
    PyObject *out = Py_BuildValue("(NN)", buf_column(&starts), buf_column(&lengths));
    buf_free(&starts);
    buf_free(&lengths);
    return out;
}

/* ---------- facts ---------- */

static PyObject *feature_list(struct ext2_super_block *sb) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    __u32 masks[3] = {sb->s_feature_compat, sb->s_feature_incompat, sb->s_feature_ro_compat};
    for (int type = 0; type < 3; type++) {
        for (int bit = 0; bit < 32; bit++) {
            if (!(masks[type] & (1u << bit)))
                continue;
            PyObject *s = PyUnicode_FromString(e2p_feature2string(type, 1u << bit));
            if (!s || PyList_Append(out, s)) {
                Py_XDECREF(s);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(s);
        }
    }
    return out;
}

static PyObject *scanner_facts(Scanner *self, PyObject *noargs) {
    (void)noargs;
    if (!self->fs) {
        PyErr_SetString(PyExc_ValueError, "scanner is closed");
        return NULL;
    }
    ext2_filsys fs = self->fs;
    struct ext2_super_block *sb = fs->super;
    char uuid[40], label[EXT2_LABEL_LEN + 1], hash_seed[40], journal_uuid[40];
    e2p_uuid_to_str(sb->s_uuid, uuid);
    e2p_uuid_to_str(sb->s_hash_seed, hash_seed);
    e2p_uuid_to_str(sb->s_journal_uuid, journal_uuid);
    memcpy(label, sb->s_volume_name, EXT2_LABEL_LEN);
    label[EXT2_LABEL_LEN] = 0;

    /* Group table as columns: start, length, free blocks, free inodes, bitmaps, inode table. */
    Buf g_start, g_len, g_free, g_ifree, g_bbitmap, g_ibitmap, g_itable, g_flags;
    Buf *gb[] = {&g_start, &g_len, &g_free, &g_ifree, &g_bbitmap, &g_ibitmap, &g_itable, &g_flags};
    for (size_t i = 0; i < 8; i++)
        memset(gb[i], 0, sizeof(Buf));
    Buf fixed;
    memset(&fixed, 0, sizeof fixed);
    for (dgrp_t g = 0; g < fs->group_desc_count; g++) {
        blk64_t first = ext2fs_group_first_block2(fs, g), last = ext2fs_group_last_block2(fs, g);
        PUT(&g_start, uint64_t, first);
        PUT(&g_len, uint64_t, last - first + 1);
        PUT(&g_free, uint64_t, ext2fs_bg_free_blocks_count(fs, g));
        PUT(&g_ifree, uint64_t, ext2fs_bg_free_inodes_count(fs, g));
        PUT(&g_bbitmap, uint64_t, ext2fs_block_bitmap_loc(fs, g));
        PUT(&g_ibitmap, uint64_t, ext2fs_inode_bitmap_loc(fs, g));
        PUT(&g_itable, uint64_t, ext2fs_inode_table_loc(fs, g));
        PUT(&g_flags, uint64_t, ext2fs_bg_flags(fs, g));
    }

    /* Blocks the file system keeps for itself outside any inode: the boot block and primary
     * superblock, the backup superblocks and descriptor blocks (reserved ones included) of
     * each group; as (start, length) pairs. The bitmaps and inode tables are in the groups. */
    PUT(&fixed, uint64_t, 0);
    PUT(&fixed, uint64_t, (uint64_t)sb->s_first_data_block + 1);
    uint64_t old_desc_blocks = ext2fs_has_feature_meta_bg(sb)
                                   ? sb->s_first_meta_bg
                                   : fs->desc_blocks + sb->s_reserved_gdt_blocks;
    for (dgrp_t g = 0; g < fs->group_desc_count; g++) {
        blk64_t super_blk = 0, old_desc = 0, new_desc = 0;
        blk_t used = 0;
        ext2fs_super_and_bgd_loc2(fs, g, &super_blk, &old_desc, &new_desc, &used);
        if (super_blk) {
            PUT(&fixed, uint64_t, super_blk);
            PUT(&fixed, uint64_t, 1);
        }
        if (old_desc) {
            PUT(&fixed, uint64_t, old_desc);
            PUT(&fixed, uint64_t, old_desc_blocks);
        }
        if (new_desc) {
            PUT(&fixed, uint64_t, new_desc);
            PUT(&fixed, uint64_t, 1);
        }
    }

    /* The journal's size, for recreating the file system. */
    long long journal_blocks = 0;
    if (sb->s_journal_inum) {
        struct ext2_inode ji;
        if (ext2fs_read_inode(fs, sb->s_journal_inum, &ji) == 0)
            journal_blocks = (long long)(EXT2_I_SIZE(&ji) / fs->blocksize);
    }

    PyObject *features = feature_list(sb);
    if (!features)
        goto fail;
    PyObject *out = Py_BuildValue(
        "{s:s,s:y,s:i,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:i,s:i,s:K,s:N,"
        "s:K,s:K,s:K,s:K,s:i,s:i,s:i,s:i,s:s,s:i,s:K,s:K,s:i,s:i,s:i,s:i,s:s,s:K,s:L,s:N,"
        "s:{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N}}",
        "uuid", uuid, "label", label, "block_size", (int)fs->blocksize, "cluster_size",
        (int)EXT2_CLUSTER_SIZE(sb), "blocks_count",
        (unsigned long long)ext2fs_blocks_count(sb), "free_blocks",
        (unsigned long long)ext2fs_free_blocks_count(sb), "reserved_blocks",
        (unsigned long long)ext2fs_r_blocks_count(sb), "inodes_count",
        (unsigned long long)sb->s_inodes_count, "free_inodes",
        (unsigned long long)sb->s_free_inodes_count, "first_data_block",
        (unsigned long long)sb->s_first_data_block, "blocks_per_group",
        (unsigned long long)sb->s_blocks_per_group, "clusters_per_group",
        (unsigned long long)sb->s_clusters_per_group, "inodes_per_group",
        (unsigned long long)sb->s_inodes_per_group, "inode_size", (int)EXT2_INODE_SIZE(sb),
        "first_ino", (int)EXT2_FIRST_INODE(sb), "log_groups_per_flex",
        (int)sb->s_log_groups_per_flex, "group_count",
        (unsigned long long)fs->group_desc_count, "features", features, "mkfs_time",
        (unsigned long long)sb->s_mkfs_time, "write_time", (unsigned long long)sb->s_wtime,
        "mount_time", (unsigned long long)sb->s_mtime, "lastcheck_time",
        (unsigned long long)sb->s_lastcheck, "rev_level", (int)sb->s_rev_level, "creator_os",
        (int)sb->s_creator_os, "reserved_gdt_blocks", (int)sb->s_reserved_gdt_blocks,
        "desc_size", (int)EXT2_DESC_SIZE(sb), "hash_seed", hash_seed, "default_hash_version",
        (int)sb->s_def_hash_version, "raid_stride", (unsigned long long)sb->s_raid_stride,
        "raid_stripe_width", (unsigned long long)sb->s_raid_stripe_width, "errors",
        (int)sb->s_errors, "state", (int)sb->s_state, "journal_inum", (int)sb->s_journal_inum,
        "min_extra_isize", (int)sb->s_min_extra_isize, "journal_uuid", journal_uuid,
        "default_mount_opts", (unsigned long long)sb->s_default_mount_opts, "journal_blocks",
        journal_blocks, "fixed_meta", buf_bytes(&fixed), "groups", "start", buf_bytes(&g_start), "length", buf_bytes(&g_len),
        "free_blocks", buf_bytes(&g_free), "free_inodes", buf_bytes(&g_ifree), "block_bitmap",
        buf_bytes(&g_bbitmap), "inode_bitmap", buf_bytes(&g_ibitmap), "inode_table",
        buf_bytes(&g_itable), "flags", buf_bytes(&g_flags));
    for (size_t i = 0; i < 8; i++)
        buf_free(gb[i]);
    buf_free(&fixed);
    return out;
nomem:
    PyErr_NoMemory();
fail:
    for (size_t i = 0; i < 8; i++)
        buf_free(gb[i]);
    buf_free(&fixed);
    return NULL;
}

/* ---------- object plumbing ---------- */

static int scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"path", NULL};
    PyObject *path_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&", kwlist, PyUnicode_FSConverter, &path_obj))
        return -1;
    const char *path = PyBytes_AS_STRING(path_obj);
    ext2_filsys fs = NULL;
    errcode_t r;
    /* Read-only; checksum errors are recorded per inode rather than refusing the image. */
    int flags = EXT2_FLAG_64BITS | EXT2_FLAG_IGNORE_CSUM_ERRORS | EXT2_FLAG_SOFTSUPP_FEATURES;
    Py_BEGIN_ALLOW_THREADS;
    r = ext2fs_open2(path, NULL, flags, 0, 0, unix_io_manager, &fs);
    if (!r) {
        watch_reads(self, fs);
        /* Group descriptors whose bitmaps or inode table lie outside their group (or overlap
         * other metadata) would have the scan read inodes from the wrong place: refuse the
         * file system, as e2fsck does before it uses them. */
        r = ext2fs_check_desc(fs);
        if (!r)
            r = ext2fs_read_bitmaps(fs);
        if (r) {
            ext2fs_close_free(&fs);
        } else {
            /* Opened despite checksum errors; from here on verify them, so that the scan can
             * flag each damaged inode instead of reading it silently. */
            fs->flags &= ~EXT2_FLAG_IGNORE_CSUM_ERRORS;
        }
    }
    Py_END_ALLOW_THREADS;
    if (r) {
        PyObject *msg = PyUnicode_FromFormat("opening %s", path);
        Py_DECREF(path_obj);
        if (msg) {
            fsage_raise(r, PyUnicode_AsUTF8(msg));
            Py_DECREF(msg);
        }
        return -1;
    }
    self->fs = fs;
    self->path = strdup(path);
    Py_DECREF(path_obj);
    if (!self->path) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *scanner_io_errors(Scanner *self, PyObject *noargs) {
    (void)noargs;
    return PyLong_FromLong(__atomic_load_n(&self->io_errors, __ATOMIC_RELAXED));
}

static PyObject *scanner_close(Scanner *self, PyObject *noargs) {
    (void)noargs;
    if (self->fs)
        ext2fs_close_free(&self->fs);
    for (int k = 0; k < MAX_JOBS - 1; k++)
        if (self->helpers[k])
            ext2fs_close_free(&self->helpers[k]);
    free(self->path);
    self->path = NULL;
    buf_free(&self->dirs);
    Py_RETURN_NONE;
}

static void scanner_dealloc(Scanner *self) {
    PyObject *r = scanner_close(self, NULL);
    Py_XDECREF(r);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef scanner_methods[] = {
    {"facts", (PyCFunction)scanner_facts, METH_NOARGS,
     "facts() -> dict: superblock facts, features and the group table (columns as bytes)."},
    {"scan", (PyCFunction)scanner_scan, METH_VARARGS,
     "scan(threads, progress=None) -> dict of column bytearrays for every inode in use;\n"
     "progress(done, total) is called every 0.1 s while it runs."},
    {"links", (PyCFunction)scanner_links, METH_VARARGS,
     "links(threads) -> dict: every directory entry of the directories the scan saw."},
    {"free_extents", (PyCFunction)scanner_free_extents, METH_NOARGS,
     "free_extents() -> (start, length) u64 bytes from the block bitmap."},
    {"io_errors", (PyCFunction)scanner_io_errors, METH_NOARGS,
     "io_errors() -> int: reads the device or image refused so far (all handles)."},
    {"close", (PyCFunction)scanner_close, METH_NOARGS, "Release the file system."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fsage._ext2fs.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(path): read-only scan of an ext2/3/4 image or device.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "fsage._ext2fs",
    "Read (and, offline, write) ext2/3/4 file systems through libext2fs.", -1, NULL,
};

PyMODINIT_FUNC PyInit__ext2fs(void) {
    initialize_ext2_error_table();
    set_com_err_hook(quiet_com_err);
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    fsage_Ext2fsError = PyErr_NewException("fsage._ext2fs.Ext2fsError", PyExc_Exception, NULL);
    if (!fsage_Ext2fsError || PyModule_AddObjectRef(m, "Ext2fsError", fsage_Ext2fsError) < 0 ||
        PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0 ||
        PyModule_AddFunctions(m, fsage_writer_methods) < 0 ||
        PyModule_AddFunctions(m, fsage_digest_methods) < 0 ||
        PyModule_AddFunctions(m, fsage_columns_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
