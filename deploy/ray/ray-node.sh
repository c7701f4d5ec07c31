#!/usr/bin/env bash
# One node of a Ray cluster serving one model (compose.ray.yaml). Runs after the image's guard
# (the entrypoint runs it for every command), on the host network. Cluster membership (settings,
# identity, wait) is the image's module rocm_vllm_runtime.ray_cluster, which the LeaderWorkerSet runs too.
#
#   ray-node.sh head     start the Ray head, wait for RAY_NODES nodes that match this one (image
#                        manifest, GPUs), then the server with --distributed-executor-backend ray
#   ray-node.sh worker   join the head at RAY_HEAD_ADDRESS:RAY_PORT; exit when the head is gone
#
# Settings: RAY_NODE_ADDRESS (this node's address; the head: RAY_HEAD_ADDRESS), RAY_HEAD_ADDRESS (the head's address on the hosts' network), RAY_PORT (6379),
# RAY_NODES (2), GPUS_PER_NODE (8), RAY_JOIN_TIMEOUT (1200 s), RAY_PIPELINE_PARALLEL_SIZE
# (default RAY_NODES); the server's own settings are the serve command's (SERVE_*).
set -euo pipefail
: "${RAY_HEAD_ADDRESS:?set RAY_HEAD_ADDRESS to the head node's address on the hosts' network}"
port=${RAY_PORT:-6379}
gpus=${GPUS_PER_NODE:-8}
# RAY_NODES and RAY_JOIN_TIMEOUT: whole numbers >= 1, else one line naming the setting (exit 2)
checked=$(python3 -m rocm_vllm_runtime.ray_cluster settings) || exit $?
read -r nodes timeout <<<"$checked"
me=$(python3 -m rocm_vllm_runtime.ray_cluster identity)
resources="{\"$me\": 1}"
common=(--num-gpus="$gpus" --resources="$resources" --node-ip-address="${RAY_NODE_ADDRESS:-$RAY_HEAD_ADDRESS}" --disable-usage-stats)

case "${1:-}" in
  head)
    ray start --head --port="$port" --include-dashboard=false "${common[@]}"
    RAY_JOIN_TIMEOUT=$timeout python3 -m rocm_vllm_runtime.ray_cluster wait "$nodes"
    exec "${ROCM_VLLM_ENTRYPOINT:-/opt/rocm-vllm/entrypoint.sh}" serve --distributed-executor-backend ray \
      --pipeline-parallel-size "${RAY_PIPELINE_PARALLEL_SIZE:-$nodes}"
    ;;
  worker)
    : "${RAY_NODE_ADDRESS:?set RAY_NODE_ADDRESS to this worker's address on the hosts' network}"
    deadline=$((SECONDS + timeout))
    until ray start --address="$RAY_HEAD_ADDRESS:$port" "${common[@]}"; do
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "error: the Ray head $RAY_HEAD_ADDRESS:$port did not answer within ${timeout}s: start the head first or check RAY_HEAD_ADDRESS" >&2
        exit 1
      fi
      sleep 5
    done
    while ray status --address="$RAY_HEAD_ADDRESS:$port" >/dev/null 2>&1; do sleep 15; done
    echo "error: lost the Ray head $RAY_HEAD_ADDRESS:$port" >&2
    exit 1
    ;;
  *) echo "usage: ray-node.sh head|worker" >&2; exit 2 ;;
esac
