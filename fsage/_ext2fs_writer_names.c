/* fsage._ext2fs offline writer: the ops on names and inodes (mkdir, symlink, mknod, unlink,
 * rename, link, setattr); see _ext2fs_writer.c. */
#include "_ext2fs_writer.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

/* The directory-entry file type of an inode mode. */
static int dirent_type(uint16_t mode) {
    return LINUX_S_ISREG(mode)    ? EXT2_FT_REG_FILE
           : LINUX_S_ISDIR(mode)  ? EXT2_FT_DIR
           : LINUX_S_ISLNK(mode)  ? EXT2_FT_SYMLINK
           : LINUX_S_ISCHR(mode)  ? EXT2_FT_CHRDEV
           : LINUX_S_ISBLK(mode)  ? EXT2_FT_BLKDEV
           : LINUX_S_ISFIFO(mode) ? EXT2_FT_FIFO
           : LINUX_S_ISSOCK(mode) ? EXT2_FT_SOCK
                                  : EXT2_FT_UNKNOWN;
}

PyObject *writer_mkdir(PyObject *self, PyObject *args) {
    char *copy, *name;
    ext2_ino_t parent, ino;
    errcode_t err;
    writer_t *w;
    (void)self;
    w = parse_path(args, "Oy#:writer_mkdir", &copy, &parent, &name, NULL, NULL, &err);
    if (w == NULL)
        return NULL;
    if (!err && lookup_in(w->fs, parent, name, &ino) == 0)
        err = EEXIST;
    if (!err) {
        err = ext2fs_mkdir(w->fs, parent, 0, name);
        if (err == EXT2_ET_DIR_NO_SPACE) {
            err = ext2fs_expand_dir(w->fs, parent);
            if (!err)
                err = ext2fs_mkdir(w->fs, parent, 0, name);
        }
    }
    PyMem_Free(copy);
    if (err)
        return fsage_raise(err, "mkdir");
    Py_RETURN_NONE;
}

/* symlink(path, target): a new symbolic link at path (fast, in the inode, when the target
 * fits there; else in a block of its own, as the kernel stores it). EEXIST when path is taken. */
PyObject *writer_symlink(PyObject *self, PyObject *args) {
    PyObject *cap;
    const char *path, *target;
    Py_ssize_t len, tlen;
    char *copy, *name;
    ext2_ino_t parent, ino;
    errcode_t err;
    writer_t *w;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy#y#:writer_symlink", &cap, &path, &len, &target, &tlen) ||
        (w = get_writer(cap)) == NULL)
        return NULL;
    if (tlen == 0)
        return raise_errno(ENOENT, "symlink");
    if ((size_t)tlen != strlen(target))
        return raise_errno(EINVAL, "symlink");
    if ((__u64)tlen >= w->fs->blocksize)
        return raise_errno(ENAMETOOLONG, "symlink");
    copy = PyMem_Malloc((size_t)len + 1);
    if (copy == NULL)
        return PyErr_NoMemory();
    memcpy(copy, path, (size_t)len + 1);
    err = resolve_parent(w->fs, copy, &parent, &name);
    if (!err && lookup_in(w->fs, parent, name, &ino) == 0)
        err = EEXIST;
    if (!err) {
        /* The library links the name before it accounts the inode and block, so a full
         * directory is grown and the whole call run again (as debugfs does). */
        err = ext2fs_symlink(w->fs, parent, 0, name, target);
        if (err == EXT2_ET_DIR_NO_SPACE) {
            err = ext2fs_expand_dir(w->fs, parent);
            if (!err)
                err = ext2fs_symlink(w->fs, parent, 0, name, target);
        }
        if (err == EXT2_ET_FILE_EXISTS)
            err = EEXIST;
    }
    PyMem_Free(copy);
    if (err)
        return fsage_raise(err, "symlink");
    Py_RETURN_NONE;
}

/* mknod(path, mode, rdev): a FIFO, socket, character or block device (mode holds the type and
 * permission bits; rdev the device number, stored as the kernel stores it: the old 16-bit form
 * when major and minor fit a byte each, else the new one). */
PyObject *writer_mknod(PyObject *self, PyObject *args) {
    char *copy, *name;
    ext2_ino_t parent, ino;
    unsigned long long mode, rdev;
    errcode_t err;
    writer_t *w;
    (void)self;
    w = parse_path(args, "Oy#KK:writer_mknod", &copy, &parent, &name, &mode, &rdev, &err);
    if (w == NULL)
        return NULL;
    if (!err && !(LINUX_S_ISFIFO(mode) || LINUX_S_ISSOCK(mode) || LINUX_S_ISCHR(mode) ||
                  LINUX_S_ISBLK(mode)))
        err = EINVAL;
    if (!err && lookup_in(w->fs, parent, name, &ino) == 0)
        err = EEXIST;
    if (!err)
        err = ext2fs_new_inode(w->fs, parent, (int)mode, NULL, &ino);
    if (!err)
        err = link_grow(w->fs, parent, name, ino, dirent_type((__u16)mode));
    if (!err) {
        struct ext2_inode inode;
        __u32 t = now32(w->fs);
        /* glibc's dev_t: major in bits 8-19, minor in bits 0-7 and 20-31 */
        unsigned int major = (unsigned int)(rdev >> 8) & 0xfff;
        unsigned int minor = ((unsigned int)rdev & 0xff) | ((unsigned int)(rdev >> 12) & 0xfff00);
        ext2fs_inode_alloc_stats2(w->fs, ino, +1, 0);
        memset(&inode, 0, sizeof(inode));
        inode.i_mode = (__u16)mode;
        inode.i_links_count = 1;
        inode.i_atime = inode.i_ctime = inode.i_mtime = t;
        if (major < 256 && minor < 256) {
            inode.i_block[0] = major * 256 + minor;
        } else {
            inode.i_block[1] = (minor & 0xff) | (major << 8) | ((minor & ~0xffU) << 12);
        }
        err = ext2fs_write_new_inode(w->fs, ino, &inode);
    }
    PyMem_Free(copy);
    if (err)
        return fsage_raise(err, "mknod");
    Py_RETURN_NONE;
}

static int count_entries(ext2_ino_t dir, int entry, struct ext2_dir_entry *dirent, int offset,
                         int blocksize, char *buf, void *priv) {
    int *count = priv;
    int len = ext2fs_dirent_name_len(dirent);
    (void)dir, (void)entry, (void)offset, (void)blocksize, (void)buf;
    if (dirent->inode == 0)
        return 0;
    if ((len == 1 && dirent->name[0] == '.') ||
        (len == 2 && dirent->name[0] == '.' && dirent->name[1] == '.'))
        return 0;
    (*count)++;
    return DIRENT_ABORT;
}

static int release_block(ext2_filsys fs, blk64_t *blocknr, e2_blkcnt_t blockcnt, blk64_t ref_blk,
                         int ref_offset, void *priv) {
    (void)blockcnt, (void)ref_blk, (void)ref_offset, (void)priv;
    ext2fs_block_alloc_stats2(fs, *blocknr, -1);
    return 0;
}

/* Drop one link of ino (named name in parent); free the inode and its blocks at zero links. */
static errcode_t drop_link(ext2_filsys fs, ext2_ino_t parent, const char *name, ext2_ino_t ino) {
    struct ext2_inode inode;
    int isdir;
    errcode_t err = ext2fs_read_inode(fs, ino, &inode);
    if (err)
        return err;
    isdir = LINUX_S_ISDIR(inode.i_mode);
    if (isdir) {
        int count = 0;
        err = ext2fs_dir_iterate2(fs, ino, 0, NULL, count_entries, &count);
        if (err)
            return err;
        if (count)
            return ENOTEMPTY;
    }
    err = ext2fs_unlink(fs, parent, name, ino, 0);
    if (err)
        return err;
    if (isdir) {
        struct ext2_inode pinode;
        err = ext2fs_read_inode(fs, parent, &pinode);
        if (!err && pinode.i_links_count > 1) {
            pinode.i_links_count--;
            err = ext2fs_write_inode(fs, parent, &pinode);
        }
        if (err)
            return err;
        inode.i_links_count = 0;
    } else if (inode.i_links_count > 0) {
        inode.i_links_count--;
    }
    if (inode.i_links_count == 0) {
        if (ext2fs_inode_has_valid_blocks2(fs, &inode)) {
            /* Release every block (data and extent-tree/indirect blocks) without editing the
             * tree: unlike a punch, this never needs to allocate, so it works on a full fs. */
            err = ext2fs_block_iterate3(fs, ino, BLOCK_FLAG_READ_ONLY, NULL, release_block, NULL);
            if (err)
                return err;
            memset(inode.i_block, 0, sizeof(inode.i_block));
            if (ext2fs_has_feature_extents(fs->super) && (inode.i_flags & EXT4_EXTENTS_FL)) {
                struct ext3_extent_header *eh = (struct ext3_extent_header *)inode.i_block;
                eh->eh_magic = ext2fs_cpu_to_le16(EXT3_EXT_MAGIC);
                eh->eh_max = ext2fs_cpu_to_le16((sizeof(inode.i_block) - sizeof(*eh)) /
                                                sizeof(struct ext3_extent));
            }
            ext2fs_iblk_set(fs, &inode, 0);
        }
        inode.i_dtime = now32(fs);
        inode.i_size = 0;
        inode.i_size_high = 0;
        err = ext2fs_write_inode(fs, ino, &inode);
        if (err)
            return err;
        ext2fs_inode_alloc_stats2(fs, ino, -1, isdir);
        return 0;
    }
    return ext2fs_write_inode(fs, ino, &inode);
}

PyObject *writer_unlink(PyObject *self, PyObject *args) {
    char *copy, *name;
    ext2_ino_t parent, ino = 0;
    errcode_t err;
    writer_t *w;
    (void)self;
    w = parse_path(args, "Oy#:writer_unlink", &copy, &parent, &name, NULL, NULL, &err);
    if (w == NULL)
        return NULL;
    if (!err)
        err = lookup_in(w->fs, parent, name, &ino);
    if (!err)
        err = drop_link(w->fs, parent, name, ino);
    PyMem_Free(copy);
    if (err)
        return fsage_raise(err, "delete");
    Py_RETURN_NONE;
}

static int set_dotdot(ext2_ino_t dir, int entry, struct ext2_dir_entry *dirent, int offset,
                      int blocksize, char *buf, void *priv) {
    ext2_ino_t *newparent = priv;
    (void)dir, (void)offset, (void)blocksize, (void)buf;
    if (entry == DIRENT_DOT_DOT_FILE) {
        dirent->inode = *newparent;
        return DIRENT_CHANGED | DIRENT_ABORT;
    }
    return 0;
}

/* The two paths of rename and link: copies the resolution may write into, the parent and
 * last name of each, and the source's inode. */
typedef struct {
    char *scopy, *dcopy, *sname, *dname;
    ext2_ino_t sparent, dparent, ino;
    struct ext2_inode inode;
} path_pair;

static void path_pair_free(path_pair *pp) {
    PyMem_Free(pp->scopy);
    PyMem_Free(pp->dcopy);
}

/* Resolve src (which must exist) and dst's parent; -1 with MemoryError set, else a libext2fs
 * or errno code (0: all found). Call path_pair_free afterwards in every case. */
static errcode_t path_pair_resolve(ext2_filsys fs, path_pair *pp, const char *src,
                                   Py_ssize_t slen, const char *dst, Py_ssize_t dlen) {
    memset(pp, 0, sizeof *pp);
    pp->scopy = PyMem_Malloc((size_t)slen + 1);
    pp->dcopy = PyMem_Malloc((size_t)dlen + 1);
    if (pp->scopy == NULL || pp->dcopy == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(pp->scopy, src, (size_t)slen + 1);
    memcpy(pp->dcopy, dst, (size_t)dlen + 1);
    errcode_t err = resolve_parent(fs, pp->scopy, &pp->sparent, &pp->sname);
    if (!err)
        err = resolve_parent(fs, pp->dcopy, &pp->dparent, &pp->dname);
    if (!err)
        err = lookup_in(fs, pp->sparent, pp->sname, &pp->ino);
    if (!err)
        err = ext2fs_read_inode(fs, pp->ino, &pp->inode);
    return err;
}

PyObject *writer_rename(PyObject *self, PyObject *args) {
    PyObject *cap;
    const char *src, *dst;
    Py_ssize_t slen, dlen;
    ext2_ino_t existing;
    writer_t *w;
    path_pair pp;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy#y#:writer_rename", &cap, &src, &slen, &dst, &dlen) ||
        (w = get_writer(cap)) == NULL)
        return NULL;
    ext2_filsys fs = w->fs;
    errcode_t err = path_pair_resolve(fs, &pp, src, slen, dst, dlen);
    ext2_ino_t ino = pp.ino;
    struct ext2_inode inode = pp.inode;
    if (!err && LINUX_S_ISDIR(inode.i_mode) && dlen > slen && strncmp(dst, src, (size_t)slen) == 0 &&
        dst[slen] == '/')
        err = EINVAL; /* a directory into itself */
    if (!err && lookup_in(fs, pp.dparent, pp.dname, &existing) == 0) {
        if (existing == ino)
            goto done; /* same file: nothing to do */
        err = drop_link(fs, pp.dparent, pp.dname, existing);
    }
    if (!err) {
        err = link_grow(fs, pp.dparent, pp.dname, ino, dirent_type(inode.i_mode));
        if (!err)
            err = ext2fs_unlink(fs, pp.sparent, pp.sname, ino, 0);
        if (!err && LINUX_S_ISDIR(inode.i_mode) && pp.sparent != pp.dparent) {
            struct ext2_inode p;
            ext2_ino_t dparent = pp.dparent;
            err = ext2fs_dir_iterate2(fs, ino, DIRENT_FLAG_INCLUDE_EMPTY, NULL, set_dotdot,
                                      &dparent);
            if (!err)
                err = ext2fs_read_inode(fs, pp.sparent, &p);
            if (!err) {
                p.i_links_count--;
                err = ext2fs_write_inode(fs, pp.sparent, &p);
            }
            if (!err)
                err = ext2fs_read_inode(fs, pp.dparent, &p);
            if (!err) {
                p.i_links_count++;
                err = ext2fs_write_inode(fs, pp.dparent, &p);
            }
        }
        if (!err) {
            err = ext2fs_read_inode(fs, ino, &inode);
            if (!err) {
                inode.i_ctime = now32(fs);
                err = ext2fs_write_inode(fs, ino, &inode);
            }
        }
    }
done:
    path_pair_free(&pp);
    if (err == (errcode_t)-1)
        return NULL;
    if (err)
        return fsage_raise(err, "rename");
    Py_RETURN_NONE;
}

/* link(src, dst): a new name dst for the existing non-directory src (no symlink followed: a
 * symlink at src gets a second name itself). EPERM for a directory, EEXIST when dst is taken,
 * EMLINK at the link-count limit. */
PyObject *writer_link(PyObject *self, PyObject *args) {
    PyObject *cap;
    const char *src, *dst;
    Py_ssize_t slen, dlen;
    ext2_ino_t existing;
    writer_t *w;
    path_pair pp;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy#y#:writer_link", &cap, &src, &slen, &dst, &dlen) ||
        (w = get_writer(cap)) == NULL)
        return NULL;
    ext2_filsys fs = w->fs;
    errcode_t err = path_pair_resolve(fs, &pp, src, slen, dst, dlen);
    if (!err && LINUX_S_ISDIR(pp.inode.i_mode))
        err = EPERM; /* no hard links to directories */
    if (!err && lookup_in(fs, pp.dparent, pp.dname, &existing) == 0)
        err = EEXIST;
    if (!err && pp.inode.i_links_count >= EXT2_LINK_MAX)
        err = EMLINK;
    if (!err)
        err = link_grow(fs, pp.dparent, pp.dname, pp.ino, dirent_type(pp.inode.i_mode));
    if (!err) {
        /* Read again: growing the directory wrote other inodes, never this one, but the
         * cached copy must not go stale between calls. */
        struct ext2_inode inode;
        err = ext2fs_read_inode(fs, pp.ino, &inode);
        if (!err) {
            inode.i_links_count++;
            inode.i_ctime = now32(fs);
            err = ext2fs_write_inode(fs, pp.ino, &inode);
        }
    }
    path_pair_free(&pp);
    if (err == (errcode_t)-1)
        return NULL;
    if (err)
        return fsage_raise(err, "link");
    Py_RETURN_NONE;
}

/* setattr(path, mode, mtime_ns): chmod (permission bits; None: kept) and/or set the modification
 * time (ns since the epoch; None: kept) of path, which is never followed if it is a symlink; the
 * change time becomes now, as for chmod and utimens. Times are stored as the kernel stores
 * them: 32 seconds in i_mtime, epoch bits and nanoseconds in i_mtime_extra when the inode has
 * room for it. */
PyObject *writer_setattr(PyObject *self, PyObject *args) {
    PyObject *cap, *mode_obj, *mtime_obj;
    const char *path;
    Py_ssize_t len;
    writer_t *w;
    long long mode = 0, mtime_ns = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy#OO:writer_setattr", &cap, &path, &len, &mode_obj,
                          &mtime_obj) ||
        (w = get_writer(cap)) == NULL)
        return NULL;
    if (mode_obj != Py_None && ((mode = PyLong_AsLongLong(mode_obj)) == -1 && PyErr_Occurred()))
        return NULL;
    if (mtime_obj != Py_None &&
        ((mtime_ns = PyLong_AsLongLong(mtime_obj)) == -1 && PyErr_Occurred()))
        return NULL;
    if (mode < 0 || mode > 07777) {
        PyErr_SetString(PyExc_ValueError, "setattr mode must be permission bits");
        return NULL;
    }
    ext2_filsys fs = w->fs;
    ext2_ino_t ino;
    char *copy = PyMem_Malloc((size_t)len + 1);
    if (copy == NULL)
        return PyErr_NoMemory();
    memcpy(copy, path, (size_t)len + 1);
    errcode_t err = resolve(fs, copy, &ino);
    PyMem_Free(copy);
    struct ext2_inode_large inode;
    int isize = EXT2_INODE_SIZE(fs->super);
    if (isize > (int)sizeof(inode))
        isize = (int)sizeof(inode);
    memset(&inode, 0, sizeof(inode));
    if (!err)
        err = ext2fs_read_inode_full(fs, ino, (struct ext2_inode *)&inode, isize);
    if (!err) {
        int has_extra = isize > EXT2_GOOD_OLD_INODE_SIZE &&
                        offsetof(struct ext2_inode_large, i_mtime_extra) +
                                sizeof(inode.i_mtime_extra) <=
                            (size_t)EXT2_GOOD_OLD_INODE_SIZE + inode.i_extra_isize;
        if (mode_obj != Py_None && !LINUX_S_ISLNK(inode.i_mode))
            inode.i_mode = (__u16)((inode.i_mode & LINUX_S_IFMT) | (__u16)mode);
        if (mtime_obj != Py_None) {
            long long sec = mtime_ns / 1000000000LL, frac = mtime_ns % 1000000000LL;
            if (frac < 0) {
                sec -= 1;
                frac += 1000000000LL;
            }
            inode.i_mtime = (__u32)sec;
            if (has_extra)
                inode.i_mtime_extra = (__u32)((((sec - (__s32)sec) >> 32) & EXT4_EPOCH_MASK) |
                                              ((unsigned long long)frac << EXT4_EPOCH_BITS));
        }
        inode.i_ctime = now32(fs);
        if (isize > EXT2_GOOD_OLD_INODE_SIZE &&
            offsetof(struct ext2_inode_large, i_ctime_extra) + sizeof(inode.i_ctime_extra) <=
                (size_t)EXT2_GOOD_OLD_INODE_SIZE + inode.i_extra_isize)
            inode.i_ctime_extra = 0; /* whole seconds, as now32 gives them */
        err = ext2fs_write_inode_full(fs, ino, (struct ext2_inode *)&inode, isize);
    }
    if (err)
        return fsage_raise(err, "setattr");
    Py_RETURN_NONE;
}
