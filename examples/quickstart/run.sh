#!/usr/bin/env bash
# Install bootseer into a fresh virtual environment and start the quickstart job three times:
#   1. a cold start: bootseer runs the setup and captures what it installed;
#   2. a restart on the same node: the environment is already there, nothing to do;
#   3. a "new node" (the venv deleted and made again): the setup is restored from the snapshot.
# Then `bootseer report` shows where the time went. Only the local store is used: no services.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${BOOTSEER_QUICKSTART_VENV:-$here/.venv}
export BOOTSEER_JOB_ID=${BOOTSEER_JOB_ID:-quickstart-$(date +%s)}

# shellcheck source-path=SCRIPTDIR source=wait-agents.sh
. "$here/wait-agents.sh"

agents_done() {
  # The runs directory as bootseer computes it (platformdirs), asked of the venv's own bootseer.
  [ -x "$venv/bin/python" ] || return 0
  wait_for_agents "$("$venv/bin/python" -c 'from bootseer_cli.paths import runs_dir; print(runs_dir())')" "$BOOTSEER_JOB_ID"
}

new_node() {
  agents_done # never delete the venv an agent still runs from
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "$repo"
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
}

cd "$here"
echo "== installing bootseer into $venv"
new_node
echo "== 1. cold start (runs the setup, captures it)"
bootseer exec -- python job.py
echo "== 2. restart on the same node"
bootseer exec -- python job.py
echo "== 3. a new node: fresh environment, restored from the snapshot"
new_node
bootseer exec -- python job.py
agents_done # each start's agent uploads its events once the job has ended
echo "== where the time went"
bootseer report --job "$BOOTSEER_JOB_ID"
