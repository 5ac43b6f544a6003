# shellcheck shell=bash
# wait_for_agents RUNS_DIR JOB [TIMEOUT_S]: wait until every agent of JOB's starts on this node has ended.
#
# Each `bootseer exec` leaves a detached agent that uploads the start's events once the job has ended.
# Deleting the environment it runs from (`rm -rf .venv`) or reading the report before it is done loses
# that start's events. An agent is done when its log says "agent done", or when its pid has ended.
wait_for_agents() {
  local runs=$1 job=$2 deadline=$((SECONDS + ${3:-120})) dir pid
  for dir in "$runs"/*/; do
    [ -e "$dir/agent.json" ] || continue
    grep -qsF "\"job\": \"$job\"" "$dir/run.json" || continue
    while ! grep -qsF "agent done" "$dir/agent.log"; do
      pid=$(cat "$dir/agent.pid" 2>/dev/null || true)
      if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
        break # ended without its last line (killed): nothing more will come
      fi
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "warning: the agent in $dir has not finished; its events may be missing" >&2
        return 0
      fi
      sleep 0.2
    done
  done
}
