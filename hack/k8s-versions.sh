# The version matrix of the build scripts (sourced by hack/build-k8s.sh and hack/build-node.sh,
# not run). hack/devcluster/config.py's K8S_VERSIONS names the same releases.
#
# pick_k8s_version SCRIPT_NAME ARGS...
#   Reads --version MINOR (or --version=MINOR; default TRANCHE_K8S_VERSION, else 1.37) and sets
#   minor (1.35), K8S_VERSION (v1.35.4), ETCD_VERSION and the build modules kmod (Kubernetes:
#   hack/k8sbin/v1.35, or hack/k8sbin itself for 1.37) and emod (etcd). Exits 2 on anything else.
pick_k8s_version() {
  local name=$1; shift
  local hack; hack=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  minor=${TRANCHE_K8S_VERSION:-1.37}
  while [ $# -gt 0 ]; do
    case $1 in
      --version) minor=${2:?--version needs a value such as 1.35}; shift 2 ;;
      --version=*) minor=${1#--version=}; shift ;;
      *) echo "$name: unknown argument '$1' (usage: $name.sh [--version 1.34|1.35|1.36|1.37])" >&2; exit 2 ;;
    esac
  done
  minor=${minor#v}
  minor=$(echo "$minor" | cut -d. -f1,2)
  case $minor in
    1.37) K8S_VERSION=v1.37.2 ETCD_VERSION=v3.7.3 kmod="$hack/k8sbin" emod="$hack/etcdbin" ;;
    1.36) K8S_VERSION=v1.36.3 ETCD_VERSION=v3.6.8 kmod="$hack/k8sbin/v1.36" emod="$hack/etcdbin/v1.36" ;;
    1.35) K8S_VERSION=v1.35.4 ETCD_VERSION=v3.6.6 kmod="$hack/k8sbin/v1.35" emod="$hack/etcdbin/v1.35" ;;
    1.34) K8S_VERSION=v1.34.4 ETCD_VERSION=v3.6.5 kmod="$hack/k8sbin/v1.34" emod="$hack/etcdbin/v1.34" ;;
    *) echo "$name: step 'pick version': Kubernetes '$minor' is not in the matrix (1.34, 1.35, 1.36, 1.37)" >&2; exit 2 ;;
  esac
}

# k8s_ldflags: the version ldflags every Kubernetes binary of the matrix is built with
# (after pick_k8s_version), so `kubelet --version` and `kubectl version` name the release.
k8s_ldflags() {
  local ldf="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=${minor#1.} -X $p.gitTreeState=clean"
  done
  echo "$ldf"
}
