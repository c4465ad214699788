#!/usr/bin/env bash
# Source me: sets DOCKER to a client that can build with BuildKit, and makes sure an engine runs.
# The client first on PATH may lack buildx; Debian's docker.io client builds with BuildKit through
# DOCKER_BUILDKIT=1. An engine started here has no bridge network and touches no iptables rules:
# every container of ours runs with --network host (and listens on 127.0.0.1) or --network none.
export DOCKER_BUILDKIT=1
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
export DOCKER
if ! "$DOCKER" info >/dev/null 2>&1; then
  dockerd=$(command -v dockerd || echo /usr/sbin/dockerd)
  [ -x "$dockerd" ] || { echo "no Docker engine runs and dockerd is not installed (apt-get install docker.io)" >&2; exit 1; }
  log=${TMPDIR:-/tmp}/gpuclass-hooks-dockerd.log
  echo "starting $dockerd (log: $log)" >&2
  nohup "$dockerd" --bridge=none --iptables=false --ip-masq=false --ip6tables=false >"$log" 2>&1 &
  for _ in $(seq 60); do
    "$DOCKER" info >/dev/null 2>&1 && break
    sleep 1
  done
  "$DOCKER" info >/dev/null 2>&1 || { echo "dockerd did not start; see $log" >&2; exit 1; }
fi
