"""Recreation of a historical file system: snapshot deltas to a workload, replay onto a fresh
file system with verification, and the seed benchmarks run on the result (``bench``)."""
