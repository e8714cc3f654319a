//go:build tools

// Package tools pins KWOK's command, which fakes nodes and pod lifecycles
// without a container runtime, so that go mod tidy keeps its dependencies;
// internal/testtool builds it for package kubetest.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
