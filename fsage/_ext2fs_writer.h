/* Internal declarations of the offline writer of fsage._ext2fs, shared by its sources:
 *
 *   _ext2fs_writer.c        the handle (open, close, flush, capacity, stat), path resolution and
 *                           the method table
 *   _ext2fs_writer_data.c   a regular file's data: create, write, truncate, punch, fallocate
 *   _ext2fs_writer_names.c  names and inodes: mkdir, symlink, mknod, unlink, rename, link,
 *                           setattr
 *
 * Not part of any interface: the functions here are hidden inside the module. */
#ifndef FSAGE_EXT2FS_WRITER_H
#define FSAGE_EXT2FS_WRITER_H

#include "_ext2fs.h"

#include <time.h>

#define WRITER_INTERNAL __attribute__((visibility("hidden")))

#define WRITER_CAPSULE "fsage._ext2fs.writer"
#define WRITE_CHUNK (1 << 20)

typedef struct {
    ext2_filsys fs;
    char *buf; /* WRITE_CHUNK bytes of fixed pseudo-random data */
} writer_t;

/* The open writer of a handle; NULL with a Python error set if it is not one, or closed. */
WRITER_INTERNAL writer_t *get_writer(PyObject *cap);
/* Ext2fsError with an errno value for a condition libext2fs does not report itself. */
WRITER_INTERNAL PyObject *raise_errno(int err, const char *what);

static inline __u32 now32(ext2_filsys fs) {
    (void)fs;
    return (__u32)time(NULL);
}

/* Path resolution (_ext2fs_writer.c): each returns 0, a libext2fs code, or an errno value. */
WRITER_INTERNAL errcode_t inode_mode(ext2_filsys fs, ext2_ino_t ino, __u16 *mode);
/* Walk `path` (relative, no empty/./.. parts) to the directory holding its last component.
 * On success *parent is that directory and *name points into path (NUL-terminated). */
WRITER_INTERNAL errcode_t resolve_parent(ext2_filsys fs, char *path, ext2_ino_t *parent,
                                         char **name);
WRITER_INTERNAL errcode_t lookup_in(ext2_filsys fs, ext2_ino_t dir, const char *name,
                                    ext2_ino_t *ino);
WRITER_INTERNAL errcode_t resolve(ext2_filsys fs, char *path, ext2_ino_t *ino);
/* Link `name` -> ino in dir, growing the directory when it is full. */
WRITER_INTERNAL errcode_t link_grow(ext2_filsys fs, ext2_ino_t dir, const char *name,
                                    ext2_ino_t ino, int filetype);
/* Parse (handle, path[, a[, b]]) with fmt and split path; path is copied into *copy (the
 * caller frees it). NULL with a Python error set when the arguments do not parse; otherwise
 * the writer, with *err the error of the resolution (0: *parent and *name are set). */
WRITER_INTERNAL writer_t *parse_path(PyObject *args, const char *fmt, char **copy,
                                     ext2_ino_t *parent, char **name, unsigned long long *a,
                                     unsigned long long *b, errcode_t *err);

/* The ops, in _ext2fs_writer_data.c and _ext2fs_writer_names.c. */
WRITER_INTERNAL PyObject *writer_create(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_write(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_truncate(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_punch(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_fallocate(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_mkdir(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_symlink(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_mknod(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_unlink(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_rename(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_link(PyObject *self, PyObject *args);
WRITER_INTERNAL PyObject *writer_setattr(PyObject *self, PyObject *args);

#endif
