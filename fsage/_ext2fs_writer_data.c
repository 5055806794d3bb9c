/* fsage._ext2fs offline writer: the ops on a regular file's data (create, write, truncate,
 * punch, fallocate); see _ext2fs_writer.c. Data written is WRITE_CHUNK bytes of fixed
 * pseudo-random data, repeated. */
#include "_ext2fs_writer.h"

#include <errno.h>
#include <string.h>

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

/* create(path, size): a new regular file (replacing an existing regular file's data). */
PyObject *writer_create(PyObject *self, PyObject *args) {
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
PyObject *writer_write(PyObject *self, PyObject *args) {
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

PyObject *writer_truncate(PyObject *self, PyObject *args) {
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
PyObject *writer_punch(PyObject *self, PyObject *args) {
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
PyObject *writer_fallocate(PyObject *self, PyObject *args) {
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
