// Package kube renders Fleetlearn pool jobs as Kubernetes objects and reads
// their status back: a pool job becomes a suspended JobSet that Kueue admits
// from the tenant's LocalQueue, and a tenant becomes a ClusterQueue (its
// quota and fair-share weight) with a LocalQueue in the jobs' namespace.
//
// It uses the typed JobSet (v1alpha2) and Kueue (v1beta2) Go APIs, which
// build against the k8s.io v0.37 modules the rest of Fleetlearn uses, so
// field names are checked by the compiler; ToUnstructured turns any object
// into what a client-go dynamic client sends. Nothing here talks to an API
// server: the caller creates the objects and feeds the JobSet it watches to
// StateOf.
package kube
