#!/usr/bin/env bash
# Run a scenario on a Ray cluster instead of the embedded one.
# On the head node:   ray start --head --port=6379
# On each worker:     ray start --address=HEAD_IP:6379
# Ray 2.60 runs a cluster without token authentication unless asked: `ray start --head`
# prints "Token authentication is disabled for this Ray cluster" and writes no token.
# To turn it on, create a token with `ray get-auth-token --generate` (it lands in
# ~/.ray/auth_token), copy it to every node and to this machine, and start every node
# with RAY_AUTH_MODE=token. This driver uses token mode when RAY_AUTH_MODE,
# RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH says so, or when ~/.ray/auth_token exists.
set -euo pipefail
ADDRESS=${1:?usage: examples/cluster.sh HEAD_IP:6379 [scenario.yaml]}
SCENARIO=${2:-scenarios/hw-cefmc.yaml}
raymvc run "$SCENARIO" --address "$ADDRESS" --out "runs/cluster-$(date +%Y%m%d-%H%M%S)"
