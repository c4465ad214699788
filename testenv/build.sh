#!/usr/bin/env bash
# Builds the tools the tests run (helm, etcd, kube-apiserver) from the Go module proxy, once per
# version; fetches prometheus-operator's CRDs from its Go module; installs Prometheus (the server
# and promtool) from Debian's packages when they are missing.
# The binaries are cached outside the repository, by version, so later runs build nothing:
#   $GPUCLASS_TESTENV_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/gpuclass-hooks/testenv)/<name>-<version>
# Prints the directory that holds them. First run: about 10 minutes on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${GPUCLASS_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuclass-hooks/testenv}
mkdir -p "$cache"

# The versions are the ones each wrapper module requires; the binary's name carries its version.
build() {  # build NAME MODULE_DIR PACKAGE MODULE_PATH [LDFLAGS...]
  local name=$1 dir=$here/$2 package=$3 module=$4 version out ldflags minor
  version=$(awk -v m="$module" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' "$dir/go.mod")
  [ -n "$version" ] || { echo "no version of $module in $dir/go.mod" >&2; exit 1; }
  out=$cache/$name-$version
  if [ ! -x "$out" ]; then
    echo "building $name $version (cached in $cache)" >&2
    ldflags=${5:-}
    ldflags=${ldflags//@VERSION@/$version}
    minor=${version#v*.}
    ldflags=${ldflags//@MINOR@/${minor%%.*}}
    (cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$package")
    mv "$out.tmp" "$out"
  fi
  ln -sf "$name-$version" "$cache/$name"
}

# helm is a plain module: `go install` builds it without a wrapper.
helm_version=v3.22.0
if [ ! -x "$cache/helm-$helm_version" ]; then
  echo "building helm $helm_version (cached in $cache)" >&2
  tmp=$(mktemp -d)
  GOBIN=$tmp GOFLAGS=-mod=mod CGO_ENABLED=0 go install "helm.sh/helm/v3/cmd/helm@$helm_version"
  mv "$tmp/helm" "$cache/helm-$helm_version"
  rmdir "$tmp"
fi
ln -sf "helm-$helm_version" "$cache/helm"

build etcd etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
# As Kubernetes' own build does: without the version stamped in, the server reports v0.0.0 and
# helm refuses charts that require a Kubernetes version.
kube_version=k8s.io/component-base/version
build kube-apiserver kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes \
  "-X $kube_version.gitVersion=@VERSION@ -X $kube_version.gitMajor=1 -X $kube_version.gitMinor=@MINOR@ -X $kube_version.gitTreeState=clean"
# prometheus-operator's own CRDs ship in its Go module: the ServiceMonitor and PrometheusRule the
# chart renders are stored against them.
operator_version=v0.85.0
crds=$cache/prometheus-operator-crds-$operator_version
if [ ! -d "$crds" ]; then
  echo "fetching prometheus-operator $operator_version's CRDs (cached in $cache)" >&2
  dir=$(cd "$cache" && GOFLAGS=-mod=mod go mod download -json \
    "github.com/prometheus-operator/prometheus-operator@$operator_version" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$crds.tmp"
  for kind in servicemonitors prometheusrules; do
    cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$crds.tmp/"
  done
  chmod -R u+w "$crds.tmp"
  mv "$crds.tmp" "$crds"
fi
ln -sfn "prometheus-operator-crds-$operator_version" "$cache/prometheus-operator-crds"

# Prometheus evaluates the alert rules (promtool test rules) and runs the dashboard's queries
# against a live scrape. Debian ships both binaries; nothing starts the server here.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)
  echo "installing prometheus (promtool and the server) from Debian's packages" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >&2 ||
    { $sudo apt-get update >&2 && $sudo env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends prometheus >&2; }
fi
echo "$cache"
