//go:build !linux

package kubetest

import "testing"

// Start runs the whole control plane for t on Linux; elsewhere it skips,
// since nothing would stop the children of a test binary that dies.
func Start(t testing.TB) *Cluster {
	t.Helper()
	t.Skip("kubetest: the control plane runs on Linux only (its processes die with the test binary through Pdeathsig)")
	return nil
}
