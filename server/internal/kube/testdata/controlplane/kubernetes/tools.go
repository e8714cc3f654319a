//go:build tools

// Package tools pins the control plane's Kubernetes commands so that go mod
// tidy keeps their dependencies; internal/testtool builds each of them for
// package kubetest.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
