#!/usr/bin/env bash
# Builds kube-apiserver and etcd for the real-API-server test tier of
# server/internal/kube (TestRealAPIServer) using only the Go module proxy:
# no release tarballs, no setup-envtest.
#
#   deploy/kubeapi/build.sh DIR
#   export FLEETLEARN_KUBE_ASSETS=DIR
#
# kube-apiserver comes from k8s.io/kubernetes, whose go.mod points its
# k8s.io/* staging modules at ./staging directories that a module download
# does not carry; the throwaway module written here replaces each of them
# with its published v0.MINOR.PATCH release. The list is read from
# k8s.io/kubernetes's own go.mod so it follows the version. etcd is a
# three-line main around go.etcd.io/etcd/server/v3/etcdmain, at the
# version k8s.io/kubernetes requires.
#
# A cold build takes about 20 minutes on 2 cores and a binary that is
# already in DIR is not rebuilt. KUBE_VERSION overrides the version.
set -euo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 DIR  (DIR receives kube-apiserver and etcd)" >&2
	exit 2
fi
mkdir -p "$1"
dir=$(cd "$1" && pwd)
kube_version=${KUBE_VERSION:-v1.37.2}
staging_version=v0.${kube_version#v1.}
here=$(cd "$(dirname "$0")" && pwd)

export GOTOOLCHAIN=local GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# From the temp dir, so that no enclosing module's go.mod or go.sum is touched.
kube_mod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$kube_version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
if [ -z "$kube_mod" ] || [ ! -f "$kube_mod" ]; then
	echo "build.sh: cannot download k8s.io/kubernetes@$kube_version's go.mod; check GOPROXY ($(go env GOPROXY))" >&2
	exit 1
fi
go_line=$(grep -m1 '^go ' "$kube_mod")

if [ -x "$dir/etcd" ]; then
	echo "etcd: already built in $dir"
else
	etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' "$kube_mod")
	if [ -z "$etcd_version" ]; then
		echo "build.sh: k8s.io/kubernetes@$kube_version's go.mod names no go.etcd.io/etcd/server/v3 version" >&2
		exit 1
	fi
	echo "etcd: building go.etcd.io/etcd/server/v3@$etcd_version"
	mkdir -p "$work/etcd"
	cp "$here/etcd.go.tmpl" "$work/etcd/main.go"
	printf 'module fleetlearn.local/kubeapi/etcd\n\n%s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$go_line" "$etcd_version" >"$work/etcd/go.mod"
	(cd "$work/etcd" && go mod tidy && go build -trimpath -ldflags='-s -w' -o "$dir/etcd.tmp" . && mv "$dir/etcd.tmp" "$dir/etcd")
fi

if [ -x "$dir/kube-apiserver" ]; then
	echo "kube-apiserver: already built in $dir"
else
	echo "kube-apiserver: building k8s.io/kubernetes@$kube_version, staging modules at $staging_version"
	mkdir -p "$work/apiserver"
	cp "$here/tools.go.tmpl" "$work/apiserver/tools.go"
	{
		printf 'module fleetlearn.local/kubeapi/apiserver\n\n%s\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$go_line" "$kube_version"
		# Every "k8s.io/X => ./staging/src/k8s.io/X" line of the replace block.
		sed -n '/^replace (/,/^)/p' "$kube_mod" |
			awk -v v="$staging_version" '$2 == "=>" && $3 ~ /^\.\/staging\// { printf "\t%s => %s %s\n", $1, $1, v }'
		printf ')\n'
	} >"$work/apiserver/go.mod"
	n=$(grep -c ' => ' "$work/apiserver/go.mod")
	if [ "$n" -eq 0 ]; then
		echo "build.sh: found no staging replace lines in $kube_mod" >&2
		exit 1
	fi
	echo "kube-apiserver: $n staging modules replaced"
	ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitTreeState=clean"
	(cd "$work/apiserver" && go mod tidy && go build -trimpath -ldflags="$ldflags" -o "$dir/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver && mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver")
fi

echo
echo "export FLEETLEARN_KUBE_ASSETS=$dir"
