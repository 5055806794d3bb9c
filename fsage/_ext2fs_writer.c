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
 * EISDIR, ENOENT, EPERM, EMLINK) for conditions the library does not report itself.
 *
 * This file holds the handle and path resolution; the ops are in _ext2fs_writer_data.c (a
 * file's data) and _ext2fs_writer_names.c (names and inodes), _ext2fs_writer.h says what
 * they share. */
#include "_ext2fs_writer.h"

#include <errno.h>
#include <string.h>

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

writer_t *get_writer(PyObject *cap) {
    writer_t *w = PyCapsule_GetPointer(cap, WRITER_CAPSULE);
    if (w == NULL)
        return NULL;
    if (w->fs == NULL) {
        PyErr_SetString(PyExc_ValueError, "writer is closed");
        return NULL;
    }
    return w;
}

PyObject *raise_errno(int err, const char *what) {
    return fsage_raise((errcode_t)err, what);
}

/* ------------------------------------------------------------------ path resolution */

errcode_t inode_mode(ext2_filsys fs, ext2_ino_t ino, __u16 *mode) {
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
errcode_t resolve_parent(ext2_filsys fs, char *path, ext2_ino_t *parent, char **name) {
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

errcode_t lookup_in(ext2_filsys fs, ext2_ino_t dir, const char *name, ext2_ino_t *ino) {
    errcode_t err = ext2fs_lookup(fs, dir, name, (int)strlen(name), NULL, ino);
    return err == EXT2_ET_FILE_NOT_FOUND ? ENOENT : err;
}

errcode_t resolve(ext2_filsys fs, char *path, ext2_ino_t *ino) {
    ext2_ino_t parent;
    char *name;
    errcode_t err = resolve_parent(fs, path, &parent, &name);
    if (err)
        return err;
    return lookup_in(fs, parent, name, ino);
}

/* Link `name` -> ino in dir, growing the directory when it is full. */
errcode_t link_grow(ext2_filsys fs, ext2_ino_t dir, const char *name, ext2_ino_t ino,
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
writer_t *parse_path(PyObject *args, const char *fmt, char **copy, ext2_ino_t *parent,
                     char **name, unsigned long long *a, unsigned long long *b, errcode_t *err) {
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
