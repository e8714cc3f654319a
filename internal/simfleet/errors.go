package simfleet

import "errors"

// ErrConfig reports a fleet configuration that cannot run.
var ErrConfig = errors.New("simfleet: invalid config")
