package wasm

import (
	"sync"

	"github.com/fleetlearn/fleetlearn/data"
)

// dataChecks remembers the last few datasets a sandbox has validated, by
// their storage, so that a device's rounds over the same local data scan it
// once rather than on every call. The scan (every feature finite, every label
// below the class count) cost an MNIST device 1.7 ms a round, and 9 ms of a
// 6,000-example epoch; the server's evaluation set, 10,000 images, was
// scanned every round. Call says a dataset must not change while calls use
// it. The entries hold the datasets' arrays, so an address is never reused
// for other data while it is remembered; there are few of them, so at most
// that many datasets outlive their last use.
type dataChecks struct {
	mu   sync.Mutex
	keys [4]dataKey
	next int
}

// dataKey is a dataset's storage and shape.
type dataKey struct {
	features     *float32
	nf           int
	labels       *uint8
	nl           int
	dim, classes int
}

// validate is data.Dataset.Validate, done once per dataset.
func (c *dataChecks) validate(d *data.Dataset) error {
	if len(d.Features) == 0 || len(d.Labels) == 0 {
		return d.Validate()
	}
	k := dataKey{&d.Features[0], len(d.Features), &d.Labels[0], len(d.Labels), d.Dim, d.NumClasses}
	c.mu.Lock()
	for _, x := range c.keys {
		if x == k {
			c.mu.Unlock()
			return nil
		}
	}
	c.mu.Unlock()
	if err := d.Validate(); err != nil {
		return err
	}
	c.mu.Lock()
	c.keys[c.next] = k
	c.next = (c.next + 1) % len(c.keys)
	c.mu.Unlock()
	return nil
}
