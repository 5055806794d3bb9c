"""Aging studies: the same op stream on several file systems side by side, step by step, each
step measured (snapshot, scan against a clean copy, block trace) and stored under a study id."""
