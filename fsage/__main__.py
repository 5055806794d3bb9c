"""``python3 -m fsage``: the fsage command as a process of its own (see fsage.launch)."""

from fsage.launch import main

main()
