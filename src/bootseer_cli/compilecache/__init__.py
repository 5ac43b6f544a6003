"""Compile caches: carry what `torch.compile` (Inductor, AOTAutograd, Triton) and torch extensions
wrote on one start to the next start, on any node with the same image, env, device and torch.

- `key`: the compile key (image key, env key, device kind, torch version) and the facts it reads;
- `tree`: the node-local cache directories the launcher is pointed at, and what is in them;
- `index`: the published index (sharded, merged on read, pruned least recently used first);
- `restore`: the stage's half (fetch the index's files into the node's directories);
- `publish`: the agent's half (upload what the run added or changed, merge it into the index);
- `stage` and `tasks`: the `compile` stage of `exec` and the "compile-publish" agent task.
"""
