"""Report sections for LFS aging runs: segment utilization and write cost against utilization."""
