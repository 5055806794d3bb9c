"""fsage: measure how file systems lay files out on disk and how that layout decays with age."""

import os

# fsage's numpy work is element-wise; BLAS worker threads would only spin and take a core
# from the C scanner. Set before numpy is first imported (a caller's own setting wins).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
