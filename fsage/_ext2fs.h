/* Shared declarations of the fsage._ext2fs extension: the read-only scanner (_ext2fs.c and the
 * files _ext2fs_scanner.h lists), the offline writer (_ext2fs_writer.c and the files
 * _ext2fs_writer.h lists), per-file digests (_digest.c) and narrow columns (_columns.c). */
#ifndef FSAGE_EXT2FS_H
#define FSAGE_EXT2FS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <ext2fs/ext2fs.h>

/* fsage._ext2fs.Ext2fsError: raised with (errcode, message); the Python side turns it into a
 * clear FsageError. */
extern PyObject *fsage_Ext2fsError;

/* Set Ext2fsError from a libext2fs error code, prefixed with what was being done; returns NULL. */
PyObject *fsage_raise(errcode_t err, const char *what);

/* Methods of the offline writer, added to the module at init. */
extern PyMethodDef fsage_writer_methods[];
/* file_digests, in _digest.c. */
extern PyMethodDef fsage_digest_methods[];
/* pack_columns and unpack_columns, in _columns.c. */
extern PyMethodDef fsage_columns_methods[];

#endif
