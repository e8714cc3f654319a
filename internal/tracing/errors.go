package tracing

import "errors"

// ErrInsecureWithoutEndpoint refuses OTLPInsecure without an OTLP endpoint
// to apply it to.
var ErrInsecureWithoutEndpoint = errors.New("--otlp-insecure needs an OTLP endpoint")
