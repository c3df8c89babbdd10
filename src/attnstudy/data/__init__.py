"""Data: the task registry, shared types, vocabulary, gold alignments and batching.

``batching`` imports torch; the rest is the standard library (``dates`` imports babel on use).
"""
