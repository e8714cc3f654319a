// Package kube renders Fleetlearn pool jobs as Kubernetes objects and reads
// their status back: a pool job becomes a suspended JobSet that Kueue admits
// from the tenant's LocalQueue, and a tenant becomes a ClusterQueue (its
// quota and fair-share weight) with a LocalQueue in the jobs' namespace.
//
// It uses the typed JobSet (v1alpha2) and Kueue (v1beta2) Go APIs, which
// build against the k8s.io v0.37 modules the rest of Fleetlearn uses, so
// field names are checked by the compiler; ToUnstructured turns any object
// into what a client-go dynamic client sends. Render, the queue builders and
// StateOf talk to no API server.
//
// Controller is what does, through a client-go dynamic client, for the job
// service: EnsureQueues creates or updates the flavors and the tenants'
// queues; Start creates an attempt's JobSet and Stop deletes it, both
// idempotent and both refusing an object of the same name that is not the
// attempt's (its labels decide); Watch lists the namespace's JobSets, then
// follows a watch from that list (listing again whenever the watch breaks),
// and tells a Sink each attempt's status when it changes, and when the
// JobSet is gone. It is a plain list and watch on the dynamic client, not
// a client-go informer: tools/cache needs a module Fleetlearn's go.mod
// does not list, and one Sink needs no shared cache. Each attempt has its
// own JobSet, so the job service keys everything by job and attempt, and a
// late event of an old attempt cannot pass for the current one. Objects
// without the labels Render sets, or with a status that does not parse,
// are logged and skipped.
package kube
