/* fsage._ext2fs: facts() and free_extents() of the read-only scanner (see _ext2fs.c): the
 * superblock, the group table and the blocks the file system keeps for itself; the free
 * extents of the block bitmap. */
#include "_ext2fs_scanner.h"

#include <e2p/e2p.h>

/* ---------- free space ---------- */

/* free_extents() -> (start bytes, length bytes) as u64 arrays, from the block bitmap. */
PyObject *scanner_free_extents(Scanner *self, PyObject *noargs) {
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

PyObject *scanner_facts(Scanner *self, PyObject *noargs) {
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
