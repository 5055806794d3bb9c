"""fsage: measure how file systems lay files out on disk and how that layout decays with age."""

__version__ = "0.1.0"
