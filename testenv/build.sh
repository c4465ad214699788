#!/usr/bin/env bash
# Builds the tools the tests run (helm, etcd, kube-apiserver, syft) from the Go module proxy, once
# per version; fetches prometheus-operator's CRDs from its Go module; installs Prometheus (the server
# and promtool) and skopeo from Debian's packages when they are missing.
# `build.sh cluster` builds, besides, what `make e2e`'s cluster runs (docs/cluster.md): the
# kubelet, kube-controller-manager, kube-scheduler, kube-proxy and kubectl, a fake device plugin,
# CoreDNS, cert-manager's controller and cainjector, Metacontroller (from its source archive), a
# pause program, and the images made of them.
# The binaries are cached outside the repository, by version, so later runs build nothing:
#   $GPUCLASS_TESTENV_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/gpuclass-hooks/testenv)/<name>-<version>
# (a main package of our own adds its hash to the version). Prints the directory that holds them.
# First run: about 10 minutes on 2 cores; the cluster's tools about 20 more.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${GPUCLASS_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuclass-hooks/testenv}
mkdir -p "$cache"

# The versions are the ones each wrapper module requires; the binary's name carries its version.
build() {  # build NAME MODULE_DIR PACKAGE MODULE_PATH [LDFLAGS...]
  local name=$1 dir=$here/$2 package=$3 module=$4 version out ldflags minor
  version=v0  # a module of ours alone: only its hash names it
  if [ -n "$module" ]; then
    version=$(awk -v m="$module" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' "$dir/go.mod")
    [ -n "$version" ] || { echo "no version of $module in $dir/go.mod" >&2; exit 1; }
  fi
  # A main package of our own over the module: its hash too, so that a change rebuilds it.
  [ ! -f "$dir/${3#./}/main.go" ] || version=$version-$(sha256sum "$dir/${3#./}/main.go" | cut -c1-8)
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

# A plain module's command, built by `go install` without a wrapper, cached as NAME-BUILD.
go_install() {  # go_install NAME BUILD PACKAGE@VERSION [GO_INSTALL_FLAG...]
  local name=$1 build=$2 package=$3 tmp
  if [ ! -x "$cache/$name-$build" ]; then
    echo "building $name $build (cached in $cache)" >&2
    tmp=$(mktemp -d)
    GOBIN=$tmp GOFLAGS=-mod=mod CGO_ENABLED=0 go install "${@:4}" "$package"
    mv "$tmp/$name" "$cache/$name-$build"
    rmdir "$tmp"
  fi
  ln -sf "$name-$build" "$cache/$name"
}

# helm, stamped as helm's own Makefile does (its version, and the Kubernetes minor of the
# client-go it is built with, v0.37), so that `helm template` renders a chart requiring a recent
# Kubernetes without `--kube-version`.
helm_version=v3.22.0
helm_kube_minor=37
stamps="-X helm.sh/helm/v3/internal/version.version=$helm_version"
for package in pkg/chartutil pkg/lint/rules; do
  stamps="$stamps -X helm.sh/helm/v3/$package.k8sVersionMajor=1"
  stamps="$stamps -X helm.sh/helm/v3/$package.k8sVersionMinor=$helm_kube_minor"
done
go_install helm "$helm_version-k8s1.$helm_kube_minor" "helm.sh/helm/v3/cmd/helm@$helm_version" \
  -ldflags "$stamps"

build etcd etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
# As Kubernetes' own build does: without the version stamped in, the server reports v0.0.0 and
# helm refuses charts that require a Kubernetes version.
kube_version=k8s.io/component-base/version
kube_ldflags="-X $kube_version.gitVersion=@VERSION@ -X $kube_version.gitMajor=1 -X $kube_version.gitMinor=@MINOR@ -X $kube_version.gitTreeState=clean"
build kube-apiserver kubernetes k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes "$kube_ldflags"
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

# syft writes the image's SBOM in `make release`, and the image tests check it (docs/development.md,
# "Releases").
syft_version=v1.57.2
go_install syft "$syft_version" "github.com/anchore/syft/cmd/syft@$syft_version" -trimpath

# Prometheus evaluates the alert rules (promtool test rules) and runs the dashboard's queries
# against a live scrape. Debian ships both binaries; nothing starts the server here.
# skopeo writes a release's image as an OCI archive (`make release`). Debian ships all three.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null || ! command -v skopeo >/dev/null; then
  sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)
  echo "installing prometheus (promtool and the server) and skopeo from Debian's packages" >&2
  apt_install="$sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends"
  $apt_install prometheus skopeo >&2 || { $sudo apt-get -o DPkg::Lock::Timeout=600 update >&2 && $apt_install prometheus skopeo >&2; }
fi

if [ "${1:-}" = cluster ]; then
  for name in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
    build "$name" kubernetes "k8s.io/kubernetes/cmd/$name" k8s.io/kubernetes "$kube_ldflags"
  done
  # The GPU node's device plugin: fake devices, registered with the kubelet as a real plugin does.
  build fake-device-plugin kubernetes ./deviceplugin k8s.io/kubernetes
  build coredns coredns . github.com/coredns/coredns
  build cert-manager-controller cert-manager ./controller github.com/cert-manager/cert-manager
  build cert-manager-cainjector cert-manager ./cainjector github.com/cert-manager/cert-manager
  build pause pause . ""
  # cert-manager's CRDs, as its module ships them.
  cm_version=$(awk '$1 == "github.com/cert-manager/cert-manager" {print $2}' "$here/cert-manager/go.mod")
  cm_crds=$cache/cert-manager-crds-$cm_version
  if [ ! -d "$cm_crds" ]; then
    dir=$(cd "$here/cert-manager" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)
    mkdir -p "$cm_crds.tmp" && cp "$dir"/deploy/crds/cert-manager.io_*.yaml "$cm_crds.tmp/"
    chmod -R u+w "$cm_crds.tmp" && mv "$cm_crds.tmp" "$cm_crds"
  fi
  ln -sfn "cert-manager-crds-$cm_version" "$cache/cert-manager-crds"

  # Metacontroller: its module path (`metacontroller`) is not one the proxy serves. It builds from
  # its source: METACONTROLLER_SOURCE (an archive or a tree), else ../shared/tools beside the clone.
  mc_version=v4.17.2
  mc_source=${METACONTROLLER_SOURCE:-$here/../../shared/tools/metacontroller-$mc_version.tar.gz}
  if [ ! -x "$cache/metacontroller-$mc_version" ] || [ ! -d "$cache/metacontroller-chart-$mc_version" ]; then
    [ -e "$mc_source" ] || { echo "no Metacontroller source at $mc_source: set METACONTROLLER_SOURCE" >&2; exit 1; }
    echo "building metacontroller $mc_version from $mc_source (cached in $cache)" >&2
    tree=$mc_source
    if [ -f "$mc_source" ]; then
      tmp=$(mktemp -d) && tar xzf "$mc_source" -C "$tmp" && tree=$(echo "$tmp"/*)
    fi
    (cd "$tree" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$cache/metacontroller-$mc_version.tmp" ./pkg/cmd/metacontroller)
    mv "$cache/metacontroller-$mc_version.tmp" "$cache/metacontroller-$mc_version"
    rm -rf "$cache/metacontroller-chart-$mc_version" && cp -r "$tree/deploy/helm/metacontroller" "$cache/metacontroller-chart-$mc_version"
    [ -z "${tmp:-}" ] || rm -rf "$tmp"
  fi
  ln -sf "metacontroller-$mc_version" "$cache/metacontroller"
  ln -sfn "metacontroller-chart-$mc_version" "$cache/metacontroller-chart"

  # The images the cluster runs them from: one layer holding the binary, imported, never pulled.
  image() {  # image NAME BINARY PATH_IN_IMAGE
    local target
    target=$(readlink "$cache/$2")
    if [ ! -f "$cache/$target.tar" ]; then
      python3 "$here/oci_image.py" --binary "$cache/$target" --path "$3" --name "e2e.local/$1:1" \
        --output "$cache/$target.tar.tmp"
      mv "$cache/$target.tar.tmp" "$cache/$target.tar"
    fi
    ln -sf "$target.tar" "$cache/$1.tar"
  }
  image pause pause /pause
  image coredns coredns /coredns
  image metacontroller metacontroller /usr/bin/metacontroller
  image cert-manager-controller cert-manager-controller /cert-manager-controller
  image cert-manager-cainjector cert-manager-cainjector /cert-manager-cainjector
fi
echo "$cache"
