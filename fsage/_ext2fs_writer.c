/* Offline writer over libext2fs: runs workload ops on an unmounted ext image. */
#include "_ext2fs.h"

PyMethodDef fsage_writer_methods[] = {
    {NULL, NULL, 0, NULL},
};
