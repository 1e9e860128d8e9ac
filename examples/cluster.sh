#!/usr/bin/env bash
# Run a scenario on a Ray cluster instead of the embedded one.
# On the head node:   ray start --head --port=6379
# On each worker:     ray start --address=HEAD_IP:6379
# Ray 2.60 enables token authentication: every node and this driver need the same token
# (or start every node with RAY_AUTH_MODE=disabled on a trusted network).
set -euo pipefail
ADDRESS=${1:?usage: examples/cluster.sh HEAD_IP:6379 [scenario.yaml]}
SCENARIO=${2:-scenarios/hw-cefmc.yaml}
raymvc run "$SCENARIO" --address "$ADDRESS" --out "runs/cluster-$(date +%Y%m%d-%H%M%S)"
