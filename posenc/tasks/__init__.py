"""Tasks: generated synthetic sequences and a shipped character corpus."""
from .corpus import CharCorpus, stdlib_text
from .synthetic import BOS, IGNORE, MASK, PAD, SEP, TASKS, SyntheticTask

__all__ = ["CharCorpus", "stdlib_text", "SyntheticTask", "TASKS", "IGNORE", "PAD", "BOS", "SEP", "MASK"]
