/*
 * The undo of a failed overwrite, for fsage._posixexec (fsage/_posixexec_undo.c).
 *
 * An overwrite inside a file may run out of space half way (a hole it fills, an unwritten
 * extent it converts, a copy-on-write extent on btrfs), leaving old and new bytes mixed. Before
 * it runs, ``undo_save`` keeps what it replaces; if it fails, ``undo_restore`` puts that back.
 */
#ifndef FSAGE_POSIXEXEC_UNDO_H
#define FSAGE_POSIXEXEC_UNDO_H

#include <linux/fs.h>
#include <stddef.h>

/* A buffer kept from one overwrite to the next (ops run one at a time). */
typedef struct {
    char *buf;
    size_t cap;
} UndoBuf;

/* What an overwrite replaces: the old bytes of [lo, hi) and where they are data rather than
 * holes, or (btrfs) an unnamed file sharing the range's old extents. */
typedef struct {
    char *buf; /* the old bytes at buf[off - lo] */
    int own;   /* buf is this op's own mapping, not the UndoBuf's */
    long long lo, hi;
    long long size; /* the file's, before */
    long long (*data)[2];
    int ndata, cap;
    int clone_fd; /* -1: none */
    struct file_clone_range back;
} Saved;

#define UNDO_NONE {.clone_fd = -1}

/* Internal to the module: not exported from the shared object. */
#define UNDO_INTERNAL __attribute__((visibility("hidden")))

/* Keep what an overwrite of [lo, hi) of ``fd`` (``size`` octets, in directory ``dfd``)
 * replaces, when it could run out of space; 0 or an errno (ENOMEM, a read's). */
UNDO_INTERNAL int undo_save(UndoBuf *ub, int dfd, int fd, long long lo, long long hi, long long size,
              Saved *sv);
/* Put back what ``undo_save`` kept; 0 or the first errno met. */
UNDO_INTERNAL int undo_restore(int fd, const Saved *sv);
UNDO_INTERNAL void undo_free(Saved *sv);
UNDO_INTERNAL void undo_buf_free(UndoBuf *ub);

#endif
