"""Build fsage and its C extensions over libext2fs and libfuse3 (flags from pkg-config)."""

import shlex
import subprocess

from setuptools import Extension, setup


def pkg_config(*args: str, libs: tuple[str, ...] = ("ext2fs", "e2p", "com_err")) -> list[str]:
    try:
        out = subprocess.run(
            ["pkg-config", *args, *libs],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(
            "fsage needs libext2fs and libfuse3 headers and pkg-config "
            "(Debian: apt-get install libext2fs-dev libfuse3-dev pkg-config)"
        ) from exc
    return shlex.split(out)


ext2fs = Extension(
    "fsage._ext2fs",
    sources=[
        "fsage/_ext2fs.c",
        "fsage/_ext2fs_inodes.c",
        "fsage/_ext2fs_dirs.c",
        "fsage/_ext2fs_facts.c",
        "fsage/_ext2fs_writer.c",
        "fsage/_ext2fs_writer_data.c",
        "fsage/_ext2fs_writer_names.c",
        "fsage/_digest.c",
        "fsage/_columns.c",
    ],
    depends=["fsage/_ext2fs.h", "fsage/_ext2fs_scanner.h", "fsage/_ext2fs_writer.h"],
    extra_compile_args=[
        *pkg_config("--cflags"),
        "-O2",
        "-Wall",
        "-Wno-unused-function",
        "-pthread",
    ],
    extra_link_args=[*pkg_config("--libs"), "-pthread"],
)

# The live reader's tree walk (fsage/snapshotter/live.py); Linux only, no libraries.
live = Extension(
    "fsage._live",
    sources=["fsage/_live.c", "fsage/_live_scan.c", "fsage/_live_workers.c", "fsage/_live_join.c"],
    depends=["fsage/_live.h"],
    extra_compile_args=["-O2", "-Wall", "-pthread"],
    extra_link_args=["-pthread"],
)

# The mounted-directory executor's ops and its worker thread (fsage/ager/posix.py); Linux only,
# no libraries.
posixexec = Extension(
    "fsage._posixexec",
    sources=[
        "fsage/_posixexec.c",
        "fsage/_posixexec_dirs.c",
        "fsage/_posixexec_ops.c",
        "fsage/_posixexec_args.c",
        "fsage/_posixexec_worker.c",
        "fsage/_posixexec_undo.c",
    ],
    depends=["fsage/_posixexec.h", "fsage/_posixexec_sys.h", "fsage/_posixexec_undo.h"],
    extra_compile_args=["-O2", "-Wall", "-pthread"],
    extra_link_args=["-pthread"],
)

# Loops numpy has no single call for (fsage/_kernels.c): show's text rows, sorting names,
# CSR gathers; no libraries.
kernels = Extension(
    "fsage._kernels", sources=["fsage/_kernels.c"], extra_compile_args=["-O2", "-Wall"]
)

# `fsage lfs mount`: libfuse3's low-level loop calling fsage/lfs/mount.py (fsage/_fuse.c).
fuse = Extension(
    "fsage._fuse",
    sources=["fsage/_fuse.c"],
    extra_compile_args=[*pkg_config("--cflags", libs=("fuse3",)), "-O2", "-Wall"],
    extra_link_args=pkg_config("--libs", libs=("fuse3",)),
)

setup(ext_modules=[ext2fs, live, posixexec, fuse, kernels])
