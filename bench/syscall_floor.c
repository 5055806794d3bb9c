/*
 * The system calls of a replay and nothing else: the floor under `fsage replay`'s time.
 *
 * bench/replay.py encodes the op stream a replay runs (fsage.replay.deltas, the same builder)
 * into a flat file, mounts a fresh file system of the recorded geometry on a loop device, and
 * runs this program on it. Each op is the calls fsage's C executor (fsage/_posixexec.c) makes
 * for it: directories opened one component at a time from the root with O_NOFOLLOW and kept
 * open (all of them, where fsage keeps 256), openat(O_CREAT|O_EXCL) + 1 MiB writes + close
 * for a create, unlinkat (rmdir on EISDIR/EPERM) for a delete, mkdirat, renameat, linkat,
 * symlinkat, mknodat, ftruncate, pwrite, fallocate, fstatat + fchmodat and utimensat for a
 * setattr (its flags in the record's special-file field: 1 mode, 2 mtime; the mode in its
 * size, the mtime in ns in its offset). A snapshot marker ends an interval as the
 * replay does (`--interval-end`): remount (umount2 + mount of the same loop device), sync
 * (syncfs), drop-caches (syncfs, then /proc/sys/vm/drop_caches), none. The last marker is not
 * an interval end; the final unmount is timed separately.
 *
 *   syscall_floor OPS DEVICE MOUNTPOINT FSTYPE END    (DEVICE mounted on MOUNTPOINT)
 *
 * Prints one JSON object: op, interval-end and final-unmount seconds (wall, user, system of
 * this process), op and failure counts, bytes written.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define NEW_FLAGS (O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC)
#define FILE_FLAGS (O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
#define CHUNK (1 << 20)

/* Op codes; bench/replay.py's FLOOR_KINDS lists them in this order. */
enum { CREATE, APPEND, OVERWRITE, TRUNCATE, PUNCH, FALLOCATE, MKDIR, DELETE, RENAME, LINK,
       SYMLINK, MKNOD, FSYNC, SYNC, MARK, SETATTR };

typedef struct {
    int parent; /* index of the parent directory, -1: the root */
    const char *name;
    int fd; /* -1: not open */
} Dir;

static Dir *dirs;
static int ndirs, root_fd = -1;
static const char *mnt, *dev, *fstype;
static char data[CHUNK];
static long long written, failed;

static const unsigned char *cur, *end_of;

static int64_t get64(void) {
    int64_t v;
    memcpy(&v, cur, 8);
    cur += 8;
    return v;
}
static int32_t get32(void) {
    int32_t v;
    memcpy(&v, cur, 4);
    cur += 4;
    return v;
}
/* A NUL-terminated string of the given length, in place (the encoder wrote the NUL). */
static const char *getstr(void) {
    int32_t n = get32();
    const char *s = (const char *)cur;
    cur += n + 1;
    return s;
}

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static void cpu(double *user, double *sys) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    *user = r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6;
    *sys = r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}

static int dir_fd(int d) {
    if (d < 0) return root_fd;
    if (dirs[d].fd >= 0) return dirs[d].fd;
    int base = dir_fd(dirs[d].parent);
    if (base < 0) return -1;
    dirs[d].fd = openat(base, dirs[d].name, DIR_FLAGS);
    return dirs[d].fd;
}

static void close_dirs(void) {
    for (int i = 0; i < ndirs; i++)
        if (dirs[i].fd >= 0) {
            close(dirs[i].fd);
            dirs[i].fd = -1;
        }
}

static int put(int fd, long long size, long long offset) {
    long long done = 0;
    while (done < size) {
        size_t n = size - done < CHUNK ? (size_t)(size - done) : CHUNK;
        ssize_t w = offset < 0 ? write(fd, data, n) : pwrite(fd, data, n, offset + done);
        if (w <= 0) return -1;
        done += w;
    }
    written += done;
    return 0;
}

static void die(const char *what) {
    fprintf(stderr, "syscall_floor: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void mount_root(void) {
    if (mount(dev, mnt, fstype, 0, NULL) != 0 && mount(dev, mnt, "ext4", 0, NULL) != 0)
        die("mount");
    root_fd = open(mnt, DIR_FLAGS);
    if (root_fd < 0) die("open the mount point");
}

static void unmount_root(void) {
    close_dirs();
    close(root_fd);
    root_fd = -1;
    for (int i = 0; umount2(mnt, 0) != 0; i++) {
        if (errno != EBUSY || i == 50) die("umount2");
        usleep(20000);
    }
}

static void end_interval(const char *how) {
    if (strcmp(how, "remount") == 0) {
        unmount_root();
        mount_root();
    } else if (strcmp(how, "sync") == 0 || strcmp(how, "drop-caches") == 0) {
        if (syncfs(root_fd) != 0) die("syncfs");
        if (how[0] == 'd') {
            int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
            if (fd < 0 || write(fd, "3\n", 2) != 2) die("drop_caches");
            close(fd);
        }
    }
}

static const mode_t SPECIAL[] = {S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK};

/* One op: its system calls, as fsage's executor makes them. 0 done, -1 failed. */
static int run(int kind, int d, const char *name, int d2, const char *name2, long long size,
               long long offset, const char *text, int special) {
    int dfd = dir_fd(d), fd;
    if (dfd < 0) return -1;
    switch (kind) {
    case CREATE:
        fd = openat(dfd, name, NEW_FLAGS, 0644);
        if (fd < 0 && errno == EEXIST) fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | FILE_FLAGS, 0644);
        if (fd < 0) return -1;
        if (put(fd, size, -1) != 0) {
            close(fd);
            unlinkat(dfd, name, 0);
            return -1;
        }
        return close(fd);
    case APPEND: case OVERWRITE: case TRUNCATE: case PUNCH: case FALLOCATE: {
        struct stat st;
        int rc = 0;
        fd = openat(dfd, name, O_WRONLY | FILE_FLAGS);
        if (fd < 0) return -1;
        if (fstat(fd, &st) != 0) rc = -1;
        else if (kind == APPEND) rc = put(fd, size, st.st_size);
        else if (kind == OVERWRITE) rc = put(fd, size, offset);
        else if (kind == TRUNCATE) rc = ftruncate(fd, size);
        else if (size)
            rc = fallocate(fd, kind == PUNCH ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE : 0,
                           offset, size);
        close(fd);
        return rc;
    }
    case MKDIR:
        return mkdirat(dfd, name, 0755);
    case DELETE:
        if (unlinkat(dfd, name, 0) == 0) return 0;
        if (errno != EISDIR && errno != EPERM && errno != EACCES) return -1;
        return unlinkat(dfd, name, AT_REMOVEDIR);
    case RENAME: case LINK: {
        int dfd2 = dir_fd(d2);
        if (dfd2 < 0) return -1;
        return kind == RENAME ? renameat(dfd, name, dfd2, name2) : linkat(dfd, name, dfd2, name2, 0);
    }
    case SYMLINK:
        return symlinkat(text, dfd, name);
    case MKNOD:
        return mknodat(dfd, name, SPECIAL[special] | 0644, 0);
    case FSYNC:
        fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) return -1;
        fsync(fd);
        return close(fd);
    case SYNC:
        return syncfs(root_fd);
    case SETATTR:
        if (special & 1) {
            struct stat st;
            if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return -1;
            if (!S_ISLNK(st.st_mode) && fchmodat(dfd, name, (mode_t)size, 0) != 0) return -1;
        }
        if (special & 2) {
            long long sec = offset / 1000000000LL, frac = offset % 1000000000LL;
            if (frac < 0) sec -= 1, frac += 1000000000LL;
            struct timespec ts[2] = {{.tv_sec = 0, .tv_nsec = UTIME_OMIT},
                                     {.tv_sec = (time_t)sec, .tv_nsec = (long)frac}};
            return utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW);
        }
        return 0;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: syscall_floor OPS DEVICE MOUNTPOINT FSTYPE END\n");
        return 2;
    }
    dev = argv[2], mnt = argv[3], fstype = argv[4];
    const char *how = argv[5];
    FILE *fh = fopen(argv[1], "rb");
    if (!fh) die(argv[1]);
    fseek(fh, 0, SEEK_END);
    long n = ftell(fh);
    fseek(fh, 0, SEEK_SET);
    unsigned char *buf = malloc(n);
    if (!buf || fread(buf, 1, n, fh) != (size_t)n) die("reading the ops");
    fclose(fh);
    cur = buf, end_of = buf + n;
    /* The same pseudo-random content is not needed: any non-zero bytes cost the same. */
    for (int i = 0; i < CHUNK; i++) data[i] = (char)(i * 2654435761u >> 24) | 1;

    ndirs = get32();
    dirs = calloc(ndirs ? ndirs : 1, sizeof *dirs);
    for (int i = 0; i < ndirs; i++) {
        dirs[i].parent = get32();
        dirs[i].name = getstr();
        dirs[i].fd = -1;
    }
    int nmarks = get32(), marks = 0;
    root_fd = open(mnt, DIR_FLAGS);
    if (root_fd < 0) die("open the mount point");

    double w0 = wall(), u0, s0, u, s, t_ops = 0, u_ops = 0, s_ops = 0;
    double t_end = 0, u_end = 0, s_end = 0;
    cpu(&u0, &s0);
    long long ops = 0;
    while (cur < end_of) {
        int kind = get32(), d = get32(), d2 = get32(), special = get32();
        long long size = get64(), offset = get64();
        const char *name = getstr(), *name2 = getstr(), *text = getstr();
        int ninval = get32();
        ops++;
        if (kind == MARK) {
            if (++marks == nmarks) continue;  /* the last snapshot: no interval end */
            double w1 = wall(), u1, s1;
            cpu(&u1, &s1);
            end_interval(how);
            double w2 = wall(), u2, s2;
            cpu(&u2, &s2);
            t_end += w2 - w1, u_end += u2 - u1, s_end += s2 - s1;
            continue;
        }
        if (run(kind, d, name, d2, name2, size, offset, text, special) != 0) failed++;
        /* Directories removed or renamed (and those below them): their descriptors go. */
        for (int i = 0; i < ninval; i++) {
            int k = get32();
            if (dirs[k].fd >= 0) {
                close(dirs[k].fd);
                dirs[k].fd = -1;
            }
        }
    }
    double w3 = wall();
    cpu(&u, &s);
    t_ops = w3 - w0 - t_end, u_ops = u - u0 - u_end, s_ops = s - s0 - s_end;
    unmount_root();
    double w4 = wall(), u4, s4;
    cpu(&u4, &s4);
    printf("{\"ops\": %lld, \"failed\": %lld, \"bytes_written\": %lld, "
           "\"ops_seconds\": %.6f, \"ops_user\": %.6f, \"ops_system\": %.6f, "
           "\"interval_ends_seconds\": %.6f, \"interval_ends_user\": %.6f, "
           "\"interval_ends_system\": %.6f, \"final_unmount_seconds\": %.6f, "
           "\"final_unmount_user\": %.6f, \"final_unmount_system\": %.6f}\n",
           ops, failed, written, t_ops, u_ops, s_ops, t_end, u_end, s_end, w4 - w3, u4 - u,
           s4 - s);
    return 0;
}
