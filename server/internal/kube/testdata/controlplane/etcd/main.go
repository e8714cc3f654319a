// Command etcd is the etcd server at the version k8s.io/kubernetes
// requires, for the control plane that package kubetest runs.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
