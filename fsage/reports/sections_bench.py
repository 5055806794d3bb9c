"""Report sections for benchmark results and the layout-score prediction table (seed 002)."""
