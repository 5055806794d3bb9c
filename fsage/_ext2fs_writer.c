/* Offline writer over libext2fs: runs workload ops on an unmounted ext2/3/4 image.
 *
 * The allocator here is libext2fs's (block by block, goal near the previous block), not the
 * kernel's (mballoc, delayed allocation, preallocation): layouts made offline differ from
 * layouts made through a mount. Paths are relative byte strings ('/'-separated, checked by the
 * Python side); every component is looked up with ext2fs_lookup and must be a directory, so no
 * symlink is ever followed.
 *
 * The handle is a capsule owning an ext2_filsys; writer_close flushes and frees it (the capsule
 * destructor frees without flushing if the caller forgot). Errors raise Ext2fsError via
 * fsage_raise with a libext2fs code, or with an errno value (ENOTEMPTY, EEXIST, ENOTDIR,
 * EISDIR, ENOENT, EPERM, EMLINK) for conditions the library does not report itself. */
#include "_ext2fs.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#define WRITER_CAPSULE "fsage._ext2fs.writer"
#define WRITE_CHUNK (1 << 20)

typedef struct {
    ext2_filsys fs;
    char *buf; /* WRITE_CHUNK bytes of fixed pseudo-random data */
} writer_t;

static void writer_free(writer_t *w) {
    if (w == NULL)
        return;
    if (w->fs != NULL)
        ext2fs_free(w->fs);
    PyMem_Free(w->buf);
    PyMem_Free(w);
}

static void capsule_destructor(PyObject *cap) {
    writer_t *w = PyCapsule_GetPointer(cap, WRITER_CAPSULE);
    writer_free(w);
}

static writer_t *get_writer(PyObject *cap) {
    writer_t *w = PyCapsule_GetPointer(cap, WRITER_CAPSULE);
    if (w == NULL)
        return NULL;
    if (w->fs == NULL) {
        PyErr_SetString(PyExc_ValueError, "writer is closed");
        return NULL;
    }
    return w;
}

static PyObject *raise_errno(int err, const char *what) {
    return fsage_raise((errcode_t)err, what);
}

static __u32 now32(ext2_filsys fs) {
    (void)fs;
    return (__u32)time(NULL);
}

/* ------------------------------------------------------------------ path resolution */

static errcode_t inode_mode(ext2_filsys fs, ext2_ino_t ino, __u16 *mode) {
    struct ext2_inode inode;
    errcode_t err = ext2fs_read_inode(fs, ino, &inode);
    if (err)
        return err;
    *mode = inode.i_mode;
    return 0;
}

/* Walk `path` (relative, no empty/./.. parts) to the directory holding its last component.
 * On success *parent is that directory and *name points into path (NUL-terminated).
 * Returns 0, a libext2fs code, or an errno value. */
static errcode_t resolve_parent(ext2_filsys fs, char *path, ext2_ino_t *parent, char **name) {
    ext2_ino_t dir = EXT2_ROOT_INO;
    char *part = path;
    char *slash;
    while ((slash = strchr(part, '/')) != NULL) {
        ext2_ino_t ino;
        __u16 mode;
        errcode_t err;
        *slash = '\0';
        err = ext2fs_lookup(fs, dir, part, (int)strlen(part), NULL, &ino);
        *slash = '/';
        if (err == EXT2_ET_FILE_NOT_FOUND)
            return ENOENT;
        if (err)
            return err;
        err = inode_mode(fs, ino, &mode);
        if (err)
            return err;
        if (!LINUX_S_ISDIR(mode))
            return ENOTDIR; /* a symlink or file in the middle of a path: never followed */
        dir = ino;
        part = slash + 1;
    }
    if (*part == '\0')
        return ENOENT;
    *parent = dir;
    *name = part;
    return 0;
}

static errcode_t lookup_in(ext2_filsys fs, ext2_ino_t dir, const char *name, ext2_ino_t *ino) {
    errcode_t err = ext2fs_lookup(fs, dir, name, (int)strlen(name), NULL, ino);
    return err == EXT2_ET_FILE_NOT_FOUND ? ENOENT : err;
}

static errcode_t resolve(ext2_filsys fs, char *path, ext2_ino_t *ino) {
    ext2_ino_t parent;
    char *name;
    errcode_t err = resolve_parent(fs, path, &parent, &name);
    if (err)
        return err;
    return lookup_in(fs, parent, name, ino);
}

/* Link `name` -> ino in dir, growing the directory when it is full. */
static errcode_t link_grow(ext2_filsys fs, ext2_ino_t dir, const char *name, ext2_ino_t ino,
                           int filetype) {
    errcode_t err = ext2fs_link(fs, dir, name, ino, filetype);
    if (err == EXT2_ET_DIR_NO_SPACE) {
        err = ext2fs_expand_dir(fs, dir);
        if (err)
            return err;
        err = ext2fs_link(fs, dir, name, ino, filetype);
    }
    return err;
}

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

/* ------------------------------------------------------------------ data */

static errcode_t write_data(writer_t *w, ext2_ino_t ino, __u64 offset, __u64 size, int extend) {
    ext2_file_t file;
    errcode_t err, err2;
    __u64 done = 0;
    err = ext2fs_file_open(w->fs, ino, EXT2_FILE_WRITE, &file);
    if (err)
        return err;
    err = ext2fs_file_llseek(file, offset, EXT2_SEEK_SET, NULL);
    while (!err && done < size) {
        unsigned int n = (unsigned int)((size - done) < WRITE_CHUNK ? (size - done) : WRITE_CHUNK);
        unsigned int got = 0;
        err = ext2fs_file_write(file, w->buf, n, &got);
        if (!err && got == 0)
            err = EXT2_ET_BLOCK_ALLOC_FAIL;
        done += got;
    }
    if (!err && extend) {
        __u64 cur = 0;
        err = ext2fs_file_get_lsize(file, &cur);
        if (!err && offset + size > cur)
            err = ext2fs_file_set_size2(file, offset + size);
    }
    err2 = ext2fs_file_close(file);
    return err ? err : err2;
}

/* ------------------------------------------------------------------ methods */

static PyObject *writer_open(PyObject *self, PyObject *args) {
    const char *path;
    ext2_filsys fs = NULL;
    errcode_t err;
    int mount_flags = 0;
    writer_t *w;
    PyObject *cap;
    (void)self;
    if (!PyArg_ParseTuple(args, "y:writer_open", &path))
        return NULL;
    err = ext2fs_check_if_mounted(path, &mount_flags);
    if (!err && (mount_flags & EXT2_MF_MOUNTED))
        return raise_errno(EBUSY, "image is mounted; the offline writer needs it unmounted");
    Py_BEGIN_ALLOW_THREADS
    err = ext2fs_open2(path, NULL, EXT2_FLAG_RW | EXT2_FLAG_64BITS, 0, 0, unix_io_manager, &fs);
    if (!err)
        err = ext2fs_read_bitmaps(fs);
    Py_END_ALLOW_THREADS
    if (err) {
        if (fs)
            ext2fs_free(fs);
        return fsage_raise(err, "opening image for writing");
    }
    if (ext2fs_has_feature_journal_needs_recovery(fs->super)) {
        ext2fs_free(fs);
        return raise_errno(EUCLEAN, "image journal needs recovery (run e2fsck first)");
    }
    w = PyMem_Calloc(1, sizeof(*w));
    if (w == NULL) {
        ext2fs_free(fs);
        return PyErr_NoMemory();
    }
    w->fs = fs;
    w->buf = PyMem_Malloc(WRITE_CHUNK);
    if (w->buf == NULL) {
        writer_free(w);
        return PyErr_NoMemory();
    }
    {
        /* xorshift fill: fixed, non-zero, incompressible enough */
        __u64 x = 0x9E3779B97F4A7C15ULL;
        size_t i;
        for (i = 0; i < WRITE_CHUNK; i += 8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            memcpy(w->buf + i, &x, 8);
        }
    }
    cap = PyCapsule_New(w, WRITER_CAPSULE, capsule_destructor);
    if (cap == NULL)
        writer_free(w);
    return cap;
}

static PyObject *writer_close(PyObject *self, PyObject *args) {
    PyObject *cap;
    writer_t *w;
    errcode_t err;
    (void)self;
    if (!PyArg_ParseTuple(args, "O:writer_close", &cap))
        return NULL;
    w = PyCapsule_GetPointer(cap, WRITER_CAPSULE);
    if (w == NULL)
        return NULL;
    if (w->fs == NULL)
        Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    err = ext2fs_close_free(&w->fs);
    Py_END_ALLOW_THREADS
    w->fs = NULL;
    if (err)
        return fsage_raise(err, "closing image");
    Py_RETURN_NONE;
}

static PyObject *writer_flush(PyObject *self, PyObject *args) {
    PyObject *cap;
    writer_t *w;
    errcode_t err;
    (void)self;
    if (!PyArg_ParseTuple(args, "O:writer_flush", &cap) || (w = get_writer(cap)) == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    err = ext2fs_flush(w->fs);
    Py_END_ALLOW_THREADS
    if (err)
        return fsage_raise(err, "flushing image");
    Py_RETURN_NONE;
}

/* (block size, total blocks, used blocks) as the kernel's statfs would report them: the
 * metadata overhead (superblocks, descriptors, bitmaps, inode tables, journal) is not counted
 * in either figure. */
static PyObject *writer_capacity(PyObject *self, PyObject *args) {
    PyObject *cap;
    writer_t *w;
    ext2_filsys fs;
    blk64_t overhead, total, free_blocks;
    dgrp_t g;
    (void)self;
    if (!PyArg_ParseTuple(args, "O:writer_capacity", &cap) || (w = get_writer(cap)) == NULL)
        return NULL;
    fs = w->fs;
    overhead = fs->super->s_first_data_block;
    for (g = 0; g < fs->group_desc_count; g++) {
        blk64_t sb, old_desc, new_desc;
        blk_t used = 0;
        if (ext2fs_super_and_bgd_loc2(fs, g, &sb, &old_desc, &new_desc, &used) == 0)
            overhead += used;
        overhead += 2 + fs->inode_blocks_per_group;
    }
    if (fs->super->s_journal_inum) {
        struct ext2_inode inode;
        if (ext2fs_read_inode(fs, fs->super->s_journal_inum, &inode) == 0)
            overhead += ext2fs_get_stat_i_blocks(fs, (struct ext2_inode *)&inode) /
                        (fs->blocksize / 512);
    }
    total = ext2fs_blocks_count(fs->super);
    free_blocks = ext2fs_free_blocks_count(fs->super);
    if (overhead > total - free_blocks)
        overhead = total - free_blocks;
    return Py_BuildValue("(IKK)", fs->blocksize, (unsigned long long)(total - overhead),
                         (unsigned long long)(total - overhead - free_blocks));
}

/* stat(path) -> (ino, mode, size, blocks) without following symlinks. */
static PyObject *writer_stat(PyObject *self, PyObject *args) {
    PyObject *cap;
    writer_t *w;
    char *path;
    Py_ssize_t len;
    ext2_ino_t ino;
    struct ext2_inode inode;
    errcode_t err;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy#:writer_stat", &cap, &path, &len) ||
        (w = get_writer(cap)) == NULL)
        return NULL;
    {
        char *copy = PyMem_Malloc((size_t)len + 1);
        if (copy == NULL)
            return PyErr_NoMemory();
        memcpy(copy, path, (size_t)len + 1);
        err = resolve(w->fs, copy, &ino);
        PyMem_Free(copy);
    }
    if (!err)
        err = ext2fs_read_inode(w->fs, ino, &inode);
    if (err)
        return fsage_raise(err, "stat");
    return Py_BuildValue("(IIKK)", ino, inode.i_mode, (unsigned long long)EXT2_I_SIZE(&inode),
                         (unsigned long long)ext2fs_get_stat_i_blocks(w->fs, &inode));
}

/* Parse (handle, path) and split path; path is copied into *copy (caller frees). */
static writer_t *parse_path(PyObject *args, const char *fmt, char **copy, ext2_ino_t *parent,
                            char **name, unsigned long long *a, unsigned long long *b,
                            errcode_t *err) {
    PyObject *cap;
    const char *path;
    Py_ssize_t len;
    writer_t *w;
    *copy = NULL;
    *err = 0;
    if (a && b) {
        if (!PyArg_ParseTuple(args, fmt, &cap, &path, &len, a, b))
            return NULL;
    } else if (a) {
        if (!PyArg_ParseTuple(args, fmt, &cap, &path, &len, a))
            return NULL;
    } else if (!PyArg_ParseTuple(args, fmt, &cap, &path, &len)) {
        return NULL;
    }
    if ((w = get_writer(cap)) == NULL)
        return NULL;
    *copy = PyMem_Malloc((size_t)len + 1);
    if (*copy == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(*copy, path, (size_t)len + 1);
    *err = resolve_parent(w->fs, *copy, parent, name);
    return w;
}

/* Look up `name` in `parent`, which must be a regular file; 0 or an error code. */
static errcode_t regular_file(ext2_filsys fs, ext2_ino_t parent, const char *name,
                              ext2_ino_t *ino) {
    errcode_t err = lookup_in(fs, parent, name, ino);
    if (!err) {
        __u16 mode;
        err = inode_mode(fs, *ino, &mode);
        if (!err && !LINUX_S_ISREG(mode))
            err = EISDIR;
    }
    return err;
}

/* The arguments of the ops on a regular file's data (write, truncate, punch, fallocate):
 * parse (handle, path, a[, b]), resolve the path, and check it names a regular file. NULL with
 * a Python error set when the arguments do not parse; otherwise the writer, with *err 0 (and
 * *ino the file) or the error of the lookup. */
static writer_t *parse_regular(PyObject *args, const char *fmt, ext2_ino_t *ino,
                               unsigned long long *a, unsigned long long *b, errcode_t *err) {
    char *copy, *name;
    ext2_ino_t parent;
    writer_t *w = parse_path(args, fmt, &copy, &parent, &name, a, b, err);
    if (w != NULL && !*err)
        *err = regular_file(w->fs, parent, name, ino);
    PyMem_Free(copy);
    return w;
}

static PyObject *writer_mkdir(PyObject *self, PyObject *args) {
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

/* create(path, size): a new regular file (replacing an existing regular file's data). */
static PyObject *writer_create(PyObject *self, PyObject *args) {
    char *copy, *name;
    ext2_ino_t parent, ino;
    unsigned long long size;
    errcode_t err;
    writer_t *w;
    (void)self;
    w = parse_path(args, "Oy#K:writer_create", &copy, &parent, &name, &size, NULL, &err);
    if (w == NULL)
        return NULL;
    if (!err) {
        ext2_filsys fs = w->fs;
        errcode_t found = lookup_in(fs, parent, name, &ino);
        if (found == 0) {
            /* O_TRUNC semantics: drop the old data, keep the inode. */
            __u16 mode;
            err = inode_mode(fs, ino, &mode);
            if (!err && !LINUX_S_ISREG(mode))
                err = EISDIR;
            if (!err) {
                ext2_file_t file;
                err = ext2fs_file_open(fs, ino, EXT2_FILE_WRITE, &file);
                if (!err) {
                    err = ext2fs_file_set_size2(file, 0);
                    errcode_t e2 = ext2fs_file_close(file);
                    err = err ? err : e2;
                }
            }
        } else if (found != ENOENT) {
            err = found;
        } else {
            struct ext2_inode inode;
            err = ext2fs_new_inode(fs, parent, LINUX_S_IFREG | 0644, NULL, &ino);
            if (!err)
                err = link_grow(fs, parent, name, ino, EXT2_FT_REG_FILE);
            if (!err) {
                __u32 t = now32(fs);
                ext2fs_inode_alloc_stats2(fs, ino, +1, 0);
                memset(&inode, 0, sizeof(inode));
                inode.i_mode = LINUX_S_IFREG | 0644;
                inode.i_links_count = 1;
                inode.i_atime = inode.i_ctime = inode.i_mtime = t;
                err = ext2fs_write_new_inode(fs, ino, &inode);
                if (!err && ext2fs_has_feature_extents(fs->super)) {
                    ext2_extent_handle_t handle;
                    err = ext2fs_extent_open2(fs, ino, &inode, &handle);
                    if (!err)
                        ext2fs_extent_free(handle);
                    if (!err)
                        err = ext2fs_write_inode(fs, ino, &inode);
                }
            }
        }
        if (!err && size > 0) {
            Py_BEGIN_ALLOW_THREADS
            err = write_data(w, ino, 0, size, 1);
            Py_END_ALLOW_THREADS
        }
    }
    PyMem_Free(copy);
    if (err)
        return fsage_raise(err, "create");
    return PyLong_FromUnsignedLong(ino);
}

/* write(path, offset, size): write bytes at offset (extending the file as needed). */
static PyObject *writer_write(PyObject *self, PyObject *args) {
    ext2_ino_t ino = 0;
    unsigned long long offset, size;
    errcode_t err;
    writer_t *w;
    (void)self;
    w = parse_regular(args, "Oy#KK:writer_write", &ino, &offset, &size, &err);
    if (w == NULL)
        return NULL;
    if (!err && size > 0) {
        Py_BEGIN_ALLOW_THREADS
        err = write_data(w, ino, offset, size, 1);
        Py_END_ALLOW_THREADS
    }
    if (err)
        return fsage_raise(err, "write");
    Py_RETURN_NONE;
}

static PyObject *writer_truncate(PyObject *self, PyObject *args) {
    ext2_ino_t ino = 0;
    unsigned long long size;
    errcode_t err;
    writer_t *w;
    (void)self;
    w = parse_regular(args, "Oy#K:writer_truncate", &ino, &size, NULL, &err);
    if (w == NULL)
        return NULL;
    if (!err) {
        ext2_file_t file;
        err = ext2fs_file_open(w->fs, ino, EXT2_FILE_WRITE, &file);
        if (!err) {
            err = ext2fs_file_set_size2(file, size);
            errcode_t e2 = ext2fs_file_close(file);
            err = err ? err : e2;
        }
    }
    if (err)
        return fsage_raise(err, "truncate");
    Py_RETURN_NONE;
}

/* punch(path, offset, size): deallocate the whole blocks inside [offset, offset + size); the
 * size of the file is kept (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE). Partial blocks at the
 * edges keep their data. */
static PyObject *writer_punch(PyObject *self, PyObject *args) {
    ext2_ino_t ino = 0;
    unsigned long long offset, size;
    errcode_t err;
    writer_t *w;
    (void)self;
    w = parse_regular(args, "Oy#KK:writer_punch", &ino, &offset, &size, &err);
    if (w == NULL)
        return NULL;
    if (!err && size > 0) {
        __u64 bs = w->fs->blocksize;
        __u64 start = (offset + bs - 1) / bs, end = (offset + size) / bs; /* [start, end) */
        if (start < end) {
            Py_BEGIN_ALLOW_THREADS
            err = ext2fs_punch(w->fs, ino, NULL, NULL, start, end - 1);
            Py_END_ALLOW_THREADS
        }
    }
    if (err)
        return fsage_raise(err, "punch");
    Py_RETURN_NONE;
}

/* fallocate(path, offset, size[, goal]): allocate (unwritten) blocks for [offset, offset +
 * size), growing the file's size to its end like fallocate(2) with mode 0; the blocks are
 * searched from block `goal` on when given (else libext2fs chooses, near the inode). */
static PyObject *writer_fallocate(PyObject *self, PyObject *args) {
    ext2_ino_t ino = 0;
    unsigned long long offset, size, goal = ~0ULL;
    errcode_t err;
    writer_t *w;
    PyObject *head = args;
    (void)self;
    if (PyTuple_Check(args) && PyTuple_GET_SIZE(args) == 5) {
        goal = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(args, 4));
        if (goal == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        head = PyTuple_GetSlice(args, 0, 4);
        if (head == NULL)
            return NULL;
    }
    w = parse_regular(head, "Oy#KK:writer_fallocate", &ino, &offset, &size, &err);
    if (head != args)
        Py_DECREF(head);
    if (w == NULL)
        return NULL;
    if (!err && size > 0) {
        struct ext2_inode inode;
        __u64 bs = w->fs->blocksize;
        __u64 start = offset / bs, end = (offset + size + bs - 1) / bs;
        Py_BEGIN_ALLOW_THREADS
        err = ext2fs_read_inode(w->fs, ino, &inode);
        if (!err)
            err = ext2fs_fallocate(w->fs, EXT2_FALLOCATE_FORCE_UNINIT, ino, &inode, goal, start,
                                   end - start);
        if (!err && offset + size > EXT2_I_SIZE(&inode)) {
            err = ext2fs_inode_size_set(w->fs, &inode, offset + size);
        }
        if (!err)
            err = ext2fs_write_inode(w->fs, ino, &inode);
        Py_END_ALLOW_THREADS
    }
    if (err)
        return fsage_raise(err, "fallocate");
    Py_RETURN_NONE;
}

/* symlink(path, target): a new symbolic link at path (fast, in the inode, when the target
 * fits there; else in a block of its own, as the kernel stores it). EEXIST when path is taken. */
static PyObject *writer_symlink(PyObject *self, PyObject *args) {
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
static PyObject *writer_mknod(PyObject *self, PyObject *args) {
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

static PyObject *writer_unlink(PyObject *self, PyObject *args) {
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


static PyObject *writer_rename(PyObject *self, PyObject *args) {
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
static PyObject *writer_link(PyObject *self, PyObject *args) {
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
static PyObject *writer_setattr(PyObject *self, PyObject *args) {
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

/* The libext2fs codes the Python side maps to "no space" and "not found". */
static PyObject *writer_errcodes(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return Py_BuildValue("{sLsLsLsLsL}", "block_alloc_fail", (long long)EXT2_ET_BLOCK_ALLOC_FAIL,
                         "inode_alloc_fail", (long long)EXT2_ET_INODE_ALLOC_FAIL,
                         "dir_no_space", (long long)EXT2_ET_DIR_NO_SPACE, "toosmall",
                         (long long)EXT2_ET_TOOSMALL, "file_not_found",
                         (long long)EXT2_ET_FILE_NOT_FOUND);
}

PyMethodDef fsage_writer_methods[] = {
    {"writer_errcodes", writer_errcodes, METH_NOARGS,
     "writer_errcodes() -> {name: libext2fs error code} for the codes fsage maps."},
    {"writer_open", writer_open, METH_VARARGS,
     "writer_open(path: bytes) -> handle: open an unmounted ext image read-write."},
    {"writer_close", writer_close, METH_VARARGS,
     "writer_close(h): write back superblock, descriptors and bitmaps, and free."},
    {"writer_flush", writer_flush, METH_VARARGS, "writer_flush(h): write back metadata."},
    {"writer_capacity", writer_capacity, METH_VARARGS,
     "writer_capacity(h) -> (block_size, total_blocks, used_blocks) as statfs reports them."},
    {"writer_stat", writer_stat, METH_VARARGS,
     "writer_stat(h, path) -> (ino, mode, size, 512-byte blocks)."},
    {"writer_mkdir", writer_mkdir, METH_VARARGS, "writer_mkdir(h, path)"},
    {"writer_create", writer_create, METH_VARARGS,
     "writer_create(h, path, size) -> ino: new regular file of size bytes of data."},
    {"writer_write", writer_write, METH_VARARGS,
     "writer_write(h, path, offset, size): write data at offset, extending the file."},
    {"writer_truncate", writer_truncate, METH_VARARGS, "writer_truncate(h, path, size)"},
    {"writer_punch", writer_punch, METH_VARARGS,
     "writer_punch(h, path, offset, size): free the whole blocks in the range, size kept."},
    {"writer_fallocate", writer_fallocate, METH_VARARGS,
     "writer_fallocate(h, path, offset, size[, goal]): allocate unwritten blocks, size grown."},
    {"writer_symlink", writer_symlink, METH_VARARGS,
     "writer_symlink(h, path, target): a symbolic link at path to target."},
    {"writer_mknod", writer_mknod, METH_VARARGS,
     "writer_mknod(h, path, mode, rdev): a FIFO, socket or device node."},
    {"writer_unlink", writer_unlink, METH_VARARGS,
     "writer_unlink(h, path): remove a file or an empty directory."},
    {"writer_rename", writer_rename, METH_VARARGS,
     "writer_rename(h, src, dst): rename, replacing dst if it exists."},
    {"writer_setattr", writer_setattr, METH_VARARGS,
     "writer_setattr(h, path, mode, mtime_ns): chmod and/or set the modification time (None: "
     "kept)."},
    {"writer_link", writer_link, METH_VARARGS,
     "writer_link(h, src, dst): a new name dst for the existing non-directory src."},
    {NULL, NULL, 0, NULL},
};
