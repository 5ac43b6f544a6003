"""Peer-to-peer delivery of blobs over libtorrent (DESIGN.md section 7).

One torrent per blob, created when the blob is published and stored as a blob itself; the nodes of
a job find each other through the store (`swarm/<digest>/…`) or a static list, so no tracker or
other server is needed. `fetch.fetch_from_swarm` is the swarm leg of `delivery.fetch_blob`;
`seed.run_seed` is the agent task that keeps seeding after the launcher started.

Nothing here imports libtorrent at module level: `bootseer exec` with P2P off never loads it.
"""
