"""``python3 -m fsage``: the fsage command as a process of its own (see fsage.launch)."""

import sys

from fsage.launch import run

run(sys.argv[1:])
