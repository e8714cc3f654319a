package loadgen

import "errors"

// ErrConfig reports a fleet configuration that cannot run.
var ErrConfig = errors.New("loadgen: invalid config")
