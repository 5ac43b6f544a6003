"""Striped checkpoints (DESIGN.md section 6): push, pull and mount a checkpoint stored as K interleaved stripes.

A checkpoint directory's files are laid end to end in one logical stream, cut into cells and dealt
round-robin into K stripe objects, so a reader can pull from K servers at once. `layout` holds the
manifest and the cell arithmetic, `push` writes, `reader` is the one read engine that `pull` and the
FUSE mount (`fusefs`, `mount`) share, and `stage` plugs it into `bootseer exec`.
"""
