package ui

import "errors"

// ErrConfig is a dashboard configuration that cannot work.
var ErrConfig = errors.New("invalid dashboard configuration")
