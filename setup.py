"""Build fsage and its C extension over libext2fs (flags from pkg-config)."""

import shlex
import subprocess

from setuptools import Extension, setup


def pkg_config(*args: str) -> list[str]:
    try:
        out = subprocess.run(
            ["pkg-config", *args, "ext2fs", "e2p", "com_err"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(
            "fsage needs libext2fs headers and pkg-config "
            "(Debian: apt-get install libext2fs-dev pkg-config)"
        ) from exc
    return shlex.split(out)


ext2fs = Extension(
    "fsage._ext2fs",
    sources=["fsage/_ext2fs.c", "fsage/_ext2fs_writer.c", "fsage/_digest.c", "fsage/_columns.c"],
    depends=["fsage/_ext2fs.h"],
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
    sources=["fsage/_live.c"],
    extra_compile_args=["-O2", "-Wall", "-pthread"],
    extra_link_args=["-pthread"],
)

setup(ext_modules=[ext2fs, live])
