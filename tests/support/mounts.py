"""What a test left mounted: the mount points under a prefix, from /proc/self/mountinfo (one reader for
the stripe and env-mount tests, which each check that nothing outlives a run)."""

from __future__ import annotations


def mounted_under(prefix: str) -> list[str]:
    """Mount points at or below `prefix`, in mount order (unmount in reverse)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                out.append(mp)
    return out
