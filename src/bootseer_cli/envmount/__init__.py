"""`[env] mode = "mount"`: the env snapshot as a read-only squashfs image, mounted at the roots' own paths
under a per-run writable overlay instead of being extracted (DESIGN.md section 5, issue 48).

- image.py: building the image from the captured tree at publish, its ref field, its upload;
- mounts.py: the mount primitives (kernel squashfs on a loop device or squashfuse; kernel overlayfs or
  fuse-overlayfs) and what this node can use;
- runs.py: one run's mount state in the node cache, its teardown, and the sweep of dead runs' mounts;
- stage.py: the env stage's mount path (fetch, mount, hand the mounts to the agent) and its agent task;
- upkeep.py: the doctor line saying which env mode this node can use.
"""
