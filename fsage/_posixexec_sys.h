/*
 * System-call helpers shared by the executor (fsage/_posixexec*.c) and its overwrite undo
 * (fsage/_posixexec_undo.c): one definition each.
 */
#ifndef FSAGE_POSIXEXEC_SYS_H
#define FSAGE_POSIXEXEC_SYS_H

#include <errno.h>

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

/* A system call, retried while a signal interrupts it. */
#define RETRY(call)                                                                            \
    ({                                                                                         \
        long r_;                                                                               \
        do r_ = (long)(call);                                                                  \
        while (r_ < 0 && errno == EINTR);                                                      \
        r_;                                                                                    \
    })

/* Out of space: the file system's or the user's quota. */
static inline int is_nospace(int err) { return err == ENOSPC || err == EDQUOT; }

#endif
